"""Launchers with real processes: a `dask scheduler` and `dask worker` processes on 127.0.0.1
(free ports, one thread each, no dashboard) running a study's quota through `frugalnas run
--cluster`, one of them SIGKILLed mid-trial and replaced; `frugalnas run --workers N` on this
machine; and the bad inputs that must be one line before anything is written."""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from frugalnas.cli.main import main
from ops_support.chaos import env_with_tests
from ops_support.checks import assert_exactly_n_distinct, assert_mlflow_follows_storage
from ops_support.faults import read_log
from ops_support.servers import free_port

TESTS = Path(__file__).resolve().parents[1]
DASK = [sys.executable, "-m", "distributed.cli.dask_worker"]


class Cluster:
    """A Dask scheduler and workers as subprocesses; every process is killed at the end."""

    def __init__(self, folder: Path):
        self.folder = folder
        self.port = free_port()
        self.address = f"tcp://127.0.0.1:{self.port}"
        self.procs: list[subprocess.Popen] = []
        self.env = env_with_tests(TESTS)
        self._spawn([sys.executable, "-m", "distributed.cli.dask_scheduler", "--host",
                     "127.0.0.1", "--port", str(self.port), "--no-dashboard"], "scheduler")

    def _spawn(self, command: list[str], name: str) -> subprocess.Popen:
        out = open(self.folder / f"{name}.log", "w")
        proc = subprocess.Popen(command, env=self.env, stdout=out, stderr=subprocess.STDOUT,
                                cwd=self.folder)
        self.procs.append(proc)
        return proc

    def add_worker(self, *resources: str) -> subprocess.Popen:
        extra = ["--resources", ",".join(resources)] if resources else []
        return self._spawn([*DASK, self.address, "--nthreads", "1", "--no-dashboard",
                            "--no-nanny", "--host", "127.0.0.1", *extra],
                           f"worker{len(self.procs)}")

    def wait_for_workers(self, n: int, timeout: float = 90) -> None:
        from distributed import Client

        deadline = time.monotonic() + timeout
        client = Client(self.address, timeout=timeout, set_as_default=False)
        try:
            while len(client.scheduler_info(n_workers=-1)["workers"]) < n:
                assert time.monotonic() < deadline, f"fewer than {n} Dask workers came up"
                time.sleep(0.2)
        finally:
            client.close()

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.kill()
            proc.wait(timeout=30)


@pytest.fixture
def cluster(tmp_path):
    made = Cluster(tmp_path)
    for _ in range(3):
        made.add_worker("GPU=1")
    try:
        made.wait_for_workers(3)
        yield made
    finally:
        made.stop()


def _run_file(tmp_path: Path, seconds: float) -> Path:
    path = tmp_path / "run.toml"
    path.write_text('space = "nb201"\nstrategy = "regularized-evolution"\n'
                    'estimator = "ops-sleepy"\nplugins = ["ops_support.faults"]\n'
                    f'\n[estimator_options]\nseconds = {seconds}\n'
                    f'log = "{tmp_path / "trials.log"}"\n')
    return path


def _frugalnas(tmp_path: Path, *args: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "frugalnas.cli.main", "run",
                             str(tmp_path / "run.toml"), "-p", "ops_support.faults", "-q", *args],
                            cwd=tmp_path, env=env_with_tests(TESTS), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)


def _run_killing_a_worker(cluster, tmp_path, storage, name, uri):
    """``frugalnas run`` of 24 one-second trials on ``cluster``; the first Dask worker seen
    evaluating a trial is SIGKILLed 0.4 s into it and replaced. Returns the finished run,
    its output and error, the killed trial's number and the victim's pid."""
    _run_file(tmp_path, seconds=1.0)
    log = tmp_path / "trials.log"
    run = _frugalnas(tmp_path, "--cluster", cluster.address, "--resources", "GPU=1",
                     "--storage", storage, "--study-name", name, "--n-trials", "24",
                     "--tracking-uri", uri, "--heartbeat", "1", "--grace", "4",
                     "--isolate", "none")
    worker_pids = {p.pid for p in cluster.procs[1:]}
    victim, deadline = None, time.monotonic() + 150
    while victim is None:
        assert run.poll() is None and time.monotonic() < deadline, run.communicate()
        started = [(n, pid) for e, n, pid in (read_log(log) if log.exists() else [])
                   if e == "start" and pid in worker_pids]
        if started:
            killed_trial, victim = started[0]
        time.sleep(0.05)
    time.sleep(0.4)
    next(p for p in cluster.procs if p.pid == victim).send_signal(signal.SIGKILL)
    cluster.add_worker("GPU=1")
    out, err = run.communicate(timeout=150)
    return run, out, err, killed_trial, victim


def _assert_only_the_killed_trial_repeats(storage, name, uri, log, killed_trial, victim):
    """Exactly 24 distinct architectures; the killed trial died mid-evaluation, is FAIL and
    its architecture ran once more; MLflow follows the storage."""
    events = read_log(log)
    assert ("end", killed_trial, victim) not in events  # it died in the middle of that trial
    evaluated = {n for e, n, _ in events if e == "start"}
    trials = assert_exactly_n_distinct(storage, name, 24, evaluated=evaluated)
    killed = next(t for t in trials if t.number == killed_trial)
    assert killed.state == TrialState.FAIL
    retried = [t for t in trials if optuna.storages.RetryFailedTrialCallback.retried_trial_number(t)
               == killed_trial]
    assert [t.user_attrs["architecture"] for t in retried] == [killed.user_attrs["architecture"]]
    assert_mlflow_follows_storage(storage, uri, name)


@pytest.mark.slow
def test_cluster_runs_the_exact_quota_when_a_worker_is_killed_mid_trial(cluster, tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    # The store's tables exist before three workers open it at once.
    storage, uri = f"sqlite:///{tmp_path / 's.db'}", fresh_mlflow_uri(tmp_path / "mlflow.db")
    run, out, err, killed_trial, victim = _run_killing_a_worker(cluster, tmp_path, storage,
                                                                "c", uri)
    assert run.returncode == 0, err
    assert "Traceback" not in err, err
    assert "24 trial(s) completed this run" in out
    _assert_only_the_killed_trial_repeats(storage, "c", uri, tmp_path / "trials.log",
                                          killed_trial, victim)


@pytest.mark.slow
def test_workers_runs_the_quota_on_local_processes(tmp_path):
    _run_file(tmp_path, seconds=0.3)
    storage, uri = f"sqlite:///{tmp_path / 's.db'}", f"sqlite:///{tmp_path / 'mlflow.db'}"
    run = _frugalnas(tmp_path, "--workers", "3", "--storage", storage, "--study-name", "l",
                     "--n-trials", "12", "--tracking-uri", uri, "--isolate", "none")
    out, err = run.communicate(timeout=150)
    assert run.returncode == 0, err
    assert "Traceback" not in err, err
    events = read_log(tmp_path / "trials.log")
    assert len({pid for e, _, pid in events if e == "start"}) == 3  # three processes evaluated
    assert run.pid not in {pid for _, _, pid in events}  # and the run itself none
    assert_exactly_n_distinct(storage, "l", 12, evaluated={n for e, n, _ in events if e == "start"})
    assert_mlflow_follows_storage(storage, uri, "l")


def _refused(capsys, tmp_path: Path, *args: str) -> str:
    """``frugalnas run`` with ``args``: exit 2, one line, nothing written in ``tmp_path``."""
    _run_file(tmp_path, seconds=0.1)
    before = set(tmp_path.iterdir())
    code = main(["run", str(tmp_path / "run.toml"), "-p", "ops_support.faults", "-q",
                 "--n-trials", "2", "--tracking-uri", f"sqlite:///{tmp_path / 'm.db'}", *args])
    err = capsys.readouterr().err
    assert code == 2, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("frugalnas: error: "), err
    assert set(tmp_path.iterdir()) == before
    return lines[0]


@pytest.mark.slow
def test_bad_cluster_input_is_one_line_before_anything_is_written(cluster, tmp_path, capsys):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    nobody = f"tcp://127.0.0.1:{free_port()}"
    start = time.monotonic()
    line = _refused(capsys, tmp_path, "--cluster", nobody, "--storage", storage)
    assert f"Dask scheduler {nobody} is not reachable within 5 s" in line
    assert time.monotonic() - start < 15
    line = _refused(capsys, tmp_path, "--cluster", cluster.address, "--storage", storage,
                    "--resources", "TPU=2")
    assert "resources TPU=2" in line and "its workers offer: GPU=1" in line
    line = _refused(capsys, tmp_path, "--cluster", cluster.address, "--storage", "sqlite:///s.db")
    assert "relative path" in line
    line = _refused(capsys, tmp_path, "--cluster", cluster.address)
    assert "the study is in memory" in line
    line = _refused(capsys, tmp_path, "--cluster", cluster.address, "--storage",
                    "sqlite:///:memory:")
    assert "is in memory" in line
    pg = f"postgresql://nas:secret@127.0.0.1:{free_port()}/studies"
    line = _refused(capsys, tmp_path, "--cluster", cluster.address, "--storage", pg)
    assert "cannot be used from worker tcp://127.0.0.1:" in line and "cannot connect" in line
    assert "secret" not in line


def test_bad_launcher_flags_are_one_line(tmp_path, capsys):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    assert "invalid Dask scheduler address 'localhost:8786'" in _refused(
        capsys, tmp_path, "--cluster", "localhost:8786", "--storage", storage)
    assert "invalid number of workers 0" in _refused(capsys, tmp_path, "--workers", "0",
                                                     "--storage", storage)
    assert "invalid resource 'GPU'" in _refused(capsys, tmp_path, "--cluster", "tcp://h:1",
                                                "--resources", "GPU", "--storage", storage)
    assert "needs a Dask cluster" in _refused(capsys, tmp_path, "--workers", "2",
                                              "--resources", "GPU=1", "--storage", storage)
    assert "the study is in memory" in _refused(capsys, tmp_path, "--workers", "2")
    assert "need heartbeats" in _refused(capsys, tmp_path, "--workers", "2", "--storage",
                                         f"journal:{tmp_path / 'j.log'}")
    assert "n_jobs 2" in _refused(capsys, tmp_path, "--workers", "2", "--n-jobs", "2",
                                  "--storage", storage)


def test_worker_command_refuses_launcher_flags(tmp_path, capsys):
    _run_file(tmp_path, seconds=0.1)
    code = main(["worker", str(tmp_path / "run.toml"), "-p", "ops_support.faults",
                 "--storage", f"sqlite:///{tmp_path / 's.db'}", "--n-trials", "2",
                 "--workers", "2"])
    err = capsys.readouterr().err
    assert code == 2 and err.startswith("frugalnas: error: --workers is a flag of frugalnas run")
    assert not (tmp_path / "s.db").exists()


@pytest.mark.slow
def test_launch_from_python_with_local_workers(tmp_path):
    from frugalnas.ports.config import StudyConfig
    from frugalnas.ports.errors import ConfigError
    from frugalnas.launchers import launch
    from frugalnas.launchers.local import LocalLauncher

    config = StudyConfig.from_mapping({"space": "nb201", "estimator": "nb201-table",
                                       "strategy": "regularized-evolution",
                                       "disable_plugins": ["mlflow"]})
    with pytest.raises(ConfigError, match="is in memory"):
        launch(config, "sqlite:///:memory:", 6, LocalLauncher(2))
    # local workers share this machine's files: a relative sqlite path is made absolute
    import os
    assert LocalLauncher(2).shared_storage("sqlite:///s.db") == \
        f"sqlite:///{os.path.abspath('s.db')}"
    assert not (tmp_path / "s.db").exists()
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = launch(config, storage, 6, LocalLauncher(2), study_name="py", heartbeat=1, grace=5)
    assert len(study.completed_trials()) == 6
    assert_exactly_n_distinct(storage, "py", 6)
