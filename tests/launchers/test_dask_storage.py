"""A study kept in the memory of a Dask scheduler (`--storage dask`), with real processes: a
`dask scheduler` and `dask worker` processes on 127.0.0.1 (the cluster fixture of
test_cluster.py) running the exact quota with one worker SIGKILLed mid-trial and replaced;
the scheduler's lock and heartbeats on their own; and the bad inputs, one line before anything
is written."""

from __future__ import annotations

import signal
import threading
import time
import warnings
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from frugalnas.cli.main import main
from frugalnas.engine.storage_url import open_storage
from ops_support.checks import assert_exactly_n_distinct
from ops_support.faults import read_log
from ops_support.servers import free_port
from test_cluster import (_assert_only_the_killed_trial_repeats, _frugalnas, _refused,  # noqa: F401 (a fixture)
                          _run_file, _run_killing_a_worker, cluster)


def _copy_to_file(address: str, name: str, folder: Path) -> str:
    """The scheduler's study copied to a sqlite file (how a user keeps it); its URL."""
    storage = f"sqlite:///{folder / 'copy.db'}"
    optuna.copy_study(from_study_name=name, from_storage=open_storage(f"dask:{address}"),
                      to_storage=storage)
    return storage


@pytest.mark.slow
def test_dask_storage_runs_the_exact_quota_when_a_worker_is_killed_mid_trial(cluster, tmp_path):
    uri = f"sqlite:///{tmp_path / 'mlflow.db'}"
    run, out, err, killed_trial, victim = _run_killing_a_worker(cluster, tmp_path, "dask", "d",
                                                                uri)
    assert run.returncode == 0, err
    assert "Traceback" not in err, err
    assert "24 trial(s) completed this run" in out
    assert f"results: optuna study 'd' in dask:{cluster.address}" in out
    assert "is kept in the memory of the Dask scheduler" in err
    # no optuna database was made: only the MLflow stores are files
    assert {p.name for p in tmp_path.glob("*.db")} <= {"mlflow.db", "default-mlflow.db"}
    storage = _copy_to_file(cluster.address, "d", tmp_path)
    _assert_only_the_killed_trial_repeats(storage, "d", uri, tmp_path / "trials.log",
                                          killed_trial, victim)


def _client(address: str):
    from distributed import Client

    return Client(address, timeout=10, set_as_default=False)


@pytest.mark.slow
def test_scheduler_lock_is_exclusive_and_freed_when_its_holder_leaves(cluster):
    from frugalnas.engine.dask_storage import SchedulerLock

    first, second = SchedulerLock(cluster.address, "t"), SchedulerLock(cluster.address, "t")
    release = first.acquire()
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (second.acquire(), got.set()), daemon=True)
    waiter.start()
    assert not got.wait(1.0)  # another client holds it
    release()
    assert got.wait(10)  # handed over once released
    # a holder whose client leaves (its process died) frees the lock at once
    third = SchedulerLock(cluster.address, "u")
    third.acquire()
    third._client.close()
    fourth = SchedulerLock(cluster.address, "u")
    done = threading.Event()
    threading.Thread(target=lambda: (fourth.acquire(), done.set()), daemon=True).start()
    assert done.wait(10)


@pytest.mark.slow
def test_scheduler_lock_of_a_sigkilled_dask_worker_is_released(cluster, tmp_path):
    import os

    from frugalnas.engine.dask_storage import SchedulerLock
    from ops_support.dask_tasks import hold_lock

    client = _client(cluster.address)
    try:
        marker = tmp_path / "held"
        task = client.submit(hold_lock, cluster.address, "w", str(marker), pure=False)
        deadline = time.monotonic() + 60
        while not (marker.exists() and marker.read_text()):
            assert time.monotonic() < deadline and not task.done(), task
            time.sleep(0.05)
        waiting = SchedulerLock(cluster.address, "w")
        got = threading.Event()
        threading.Thread(target=lambda: (waiting.acquire(), got.set()), daemon=True).start()
        assert not got.wait(1.0)  # the task's worker holds it
        client.cancel(task)  # not run again elsewhere once its worker dies; it still holds it
        assert not got.wait(0.5)
        os.kill(int(marker.read_text()), signal.SIGKILL)
        start = time.monotonic()
        assert got.wait(15)  # released when the scheduler loses the dead worker's client
        assert time.monotonic() - start < 5
    finally:
        client.close()


def _fail_stale(study: optuna.Study) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", optuna.exceptions.ExperimentalWarning)
        optuna.storages.fail_stale_trials(study)


@pytest.mark.slow
def test_scheduler_heartbeats_fail_a_silent_trial_after_the_grace(cluster):
    from frugalnas.engine.dask_storage import open_dask_storage

    stale: list[int] = []
    storage = open_dask_storage(f"dask:{cluster.address}", heartbeat=1, grace=2,
                                on_stale=lambda study, trial: stale.append(trial.number))
    study = optuna.create_study(study_name="hb", storage=storage)
    with warnings.catch_warnings():  # optuna says heartbeats are meant for Study.optimize
        warnings.simplefilter("ignore", UserWarning)
        live, silent = study.ask(), study.ask()
    storage.record_heartbeat(live._trial_id)
    storage.record_heartbeat(silent._trial_id)
    _fail_stale(study)
    assert stale == []  # both beat within the grace
    for _ in range(3):
        time.sleep(1.0)
        storage.record_heartbeat(live._trial_id)
    _fail_stale(study)
    assert stale == [silent.number]
    states = {t.number: t.state for t in study.get_trials(deepcopy=False)}
    assert states == {live.number: TrialState.RUNNING, silent.number: TrialState.FAIL}
    # another process failing it too finds it finished (no second callback)
    _fail_stale(study)
    assert stale == [silent.number]


def test_dask_storage_without_a_cluster_is_one_line(tmp_path, capsys):
    line = _refused(capsys, tmp_path, "--storage", "dask")
    assert "storage 'dask' keeps the study in the memory of a Dask scheduler" in line
    assert "--cluster tcp://HOST:PORT" in line and "sqlite:///PATH" in line
    line = _refused(capsys, tmp_path, "--storage", "dask", "--workers", "2")
    assert "--workers 2 cannot use storage 'dask'" in line and "--cluster" in line
    assert "postgresql://" in line
    line = _refused(capsys, tmp_path, "--storage", "dask:localhost")
    assert "invalid storage URL 'dask:localhost'" in line and "dask:tcp://HOST:PORT" in line
    nobody = f"tcp://127.0.0.1:{free_port()}"
    line = _refused(capsys, tmp_path, "--storage", f"dask:{nobody}")
    assert "keeps the study in the memory of a Dask scheduler" in line


@pytest.mark.slow
def test_dask_storage_of_another_scheduler_is_one_line(cluster, tmp_path, capsys):
    other = f"dask:tcp://127.0.0.1:{free_port()}"
    line = _refused(capsys, tmp_path, "--cluster", cluster.address, "--storage", other)
    assert f"storage '{other}' is kept by another Dask scheduler" in line
    assert "give dask" in line


@pytest.mark.slow
def test_launch_from_python_keeps_the_study_in_the_scheduler(cluster, tmp_path, capsys):
    from frugalnas.ports.config import StudyConfig
    from frugalnas.ports.errors import ConfigError
    from frugalnas.engine.study import load_study
    from frugalnas.launchers import launch
    from frugalnas.launchers.dask_cluster import DaskLauncher
    from frugalnas.launchers.local import LocalLauncher

    config = StudyConfig.from_mapping({"space": "nb201", "estimator": "nb201-table",
                                       "strategy": "regularized-evolution",
                                       "disable_plugins": ["mlflow"]})
    with pytest.raises(ConfigError, match="memory of a Dask scheduler"):
        launch(config, "dask", 6, LocalLauncher(2))
    on_cluster = DaskLauncher(cluster.address, resources={"GPU": 1})
    study = launch(config, "dask", 6, on_cluster, study_name="py", heartbeat=1, grace=5)
    assert len(study.completed_trials()) == 6
    # the same call again continues the study the scheduler keeps, up to its new quota
    study = launch(config, "dask", 9, DaskLauncher(cluster.address, resources={"GPU": 1}),
                   study_name="py", heartbeat=1, grace=5)
    assert len(study.completed_trials()) == 9
    reopened = load_study(study_name="py", storage=f"dask:{cluster.address}")
    assert len(reopened.completed_trials()) == 9
    # the results line's command reads it while the scheduler runs
    capsys.readouterr()
    assert main(["report", "--storage", f"dask:{cluster.address}", "--study-name", "py"]) == 0
    out = capsys.readouterr().out
    assert "study py: 9 of 9 completed trial(s)" in out
    assert all(str(t.architecture) in out for t in reopened.completed_trials())
    assert_exactly_n_distinct(_copy_to_file(cluster.address, "py", tmp_path), "py", 9)


@pytest.mark.slow
def test_a_scheduler_that_stops_ends_the_run_in_one_line_naming_the_lost_study(cluster, tmp_path):
    _run_file(tmp_path, seconds=1.0)
    log = tmp_path / "trials.log"
    run = _frugalnas(tmp_path, "--cluster", cluster.address, "--storage", "dask", "--study-name",
                     "gone", "--n-trials", "20", "--no-tracking", "--heartbeat", "1",
                     "--isolate", "none")
    deadline = time.monotonic() + 120
    while not (log.exists() and read_log(log)):  # trials are running on the workers
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        time.sleep(0.05)
    cluster.procs[0].kill()  # the scheduler, and the study in its memory
    out, err = run.communicate(timeout=120)
    assert run.returncode == 2, err
    last = err.strip().splitlines()[-1]
    assert last.startswith("frugalnas: error: ") and "scheduler-connection-lost" in last, err
    assert last.endswith("the study the scheduler kept in memory is lost with it"), last
