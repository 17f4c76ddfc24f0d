"""Trial isolation: a candidate that kills its evaluation process fails its trial only.

The tests run real ``frugalnas run`` and ``frugalnas worker`` processes (and a study in this
process) with ``tests/ops_support/crashing.py``'s estimator, which calls ``os.abort()`` (or
sends itself SIGSEGV) on one architecture, and its strategy, which keeps proposing that
architecture.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

import frugalnas
from ops_support.chaos import env_with_tests, process_alive
from frugalnas.ports.errors import ConfigError
from frugalnas.engine.isolation import CRASHED_REASON, resolve_isolation
from frugalnas.ports.keys import CRASH_ATTR
from frugalnas.host.plugins import hookimpl

TESTS = Path(__file__).resolve().parents[1]
PLUGIN = "ops_support.crashing"
#: What ``ops-often-first`` proposes in every other trial (the first choice of each edge).
FIRST = "nb201:|none~0|+|none~0|none~1|+|none~0|none~1|none~2|"




def _command(tmp_path: Path, command: str, n_trials: int, *extra: str) -> list[str]:
    return [sys.executable, "-m", "frugalnas.cli.main", command, "-q", "-p", PLUGIN,
            "--space", "nb201", "--strategy", "ops-often-first", "--estimator", "ops-crash",
            "-o", f"estimator.crash_on='{FIRST}'",
            "-o", f"estimator.log='{tmp_path / 'trials.log'}'",
            "-o", f"estimator.control_dir='{tmp_path / 'control'}'",
            "--storage", f"sqlite:///{tmp_path / 'optuna.db'}", "--study-name", "iso",
            "--no-tracking", "--n-trials", str(n_trials), *extra]


def _trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="iso", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    return study.get_trials(deepcopy=False)


def _log(tmp_path: Path) -> list[tuple[str, int, int]]:
    path = tmp_path / "trials.log"
    if not path.exists():
        return []
    return [(e, int(n), int(p)) for e, n, p in (line.split() for line in path.read_text().splitlines())]


def _wait_for(cond, timeout: float, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


# -- choosing where trials run -------------------------------------------------------------
def test_auto_isolates_training_estimators_only():
    training = frugalnas.create_study(space="nb201", estimator="train", dataset="digits")
    table = frugalnas.create_study(space="nb201", estimator="nb201-table", dataset=None)
    assert resolve_isolation("auto", training) == "process"
    assert resolve_isolation("auto", table) == "none"
    assert resolve_isolation("process", table) == "process"
    assert resolve_isolation("none", training) == "none"
    with pytest.raises(ConfigError, match="invalid isolate 'fork'; valid: 'auto', 'none', 'process'"):
        table.optimize(n_trials=1, isolate="fork")


class _Estimators:
    """A plugin passed as an object: the child process could not rebuild its estimator."""

    @hookimpl
    def frugalnas_estimators(self):
        from ops_support.crashing import CrashOn

        return {"object-crash": CrashOn}


def test_process_isolation_refused_where_a_child_cannot_rebuild_the_estimator():
    study = frugalnas.create_study(space="nb201", estimator="object-crash", dataset=None,
                                   plugins=[_Estimators()])
    with pytest.raises(ConfigError, match="isolate 'process' is not possible: estimator "
                                          "'object-crash' comes from plugin"):
        study.optimize(n_trials=1, isolate="process")
    assert study.trials == []  # refused before the first trial
    assert resolve_isolation("auto", study) == "none"


def test_cli_refuses_process_isolation_with_a_shared_state_strategy(tmp_path):
    db = tmp_path / "optuna.db"
    proc = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "run", "-q", "--space", "nb201",
         "--strategy", "si-evolution", "--estimator", "inherited", "--dataset", "digits",
         "--storage", f"sqlite:///{db}", "--no-tracking", "--n-trials", "1",
         "--isolate", "process"], cwd=tmp_path, env=env_with_tests(TESTS), capture_output=True, text=True,
        timeout=120)
    assert proc.returncode == 2, proc.stderr
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("frugalnas: error: isolate 'process' is not "
                                                   "possible: strategy 'si-evolution' shares"), lines
    assert not db.exists()  # nothing written


# -- a study in this process ----------------------------------------------------------------
class _Seen:
    """A lifecycle plugin (an object: it stays in the parent) that records what reaches the
    study from the child processes."""

    def __init__(self):
        self.metrics: list[dict] = []
        self.reports: list = []

    @hookimpl
    def frugalnas_study_metrics(self, study, metrics, step):
        self.metrics.append(dict(metrics))

    @hookimpl
    def frugalnas_trial_finished(self, study, report):
        self.reports.append(report)


class _PruneAll(optuna.pruners.BasePruner):
    def prune(self, study, trial):
        return True


@pytest.mark.slow
def test_isolated_study_keeps_reports_metrics_and_pruning(tmp_path):
    seen = _Seen()
    study = frugalnas.create_study(
        space="nb201", strategy="ops-often-first", estimator="ops-crash", dataset=None,
        plugins=["ops_support.crashing", seen], storage=f"sqlite:///{tmp_path / 'a.db'}",
        estimator_options={"crash_on": FIRST, "how": "segv"})
    study.optimize(n_trials=4, isolate="process")
    states = {t.number: t.state for t in study.trials}
    assert states == {0: TrialState.FAIL, 1: TrialState.COMPLETE, 2: TrialState.FAIL,
                      3: TrialState.COMPLETE}
    failed = study.trials[0]
    assert failed.user_attrs["fail_reason"].startswith("candidate process killed by SIGSEGV; "
                                                       "peak memory ")
    assert failed.user_attrs[CRASH_ATTR] == "SIGSEGV"
    done = study.completed_trials()
    # Evaluated in another process, whose study metrics reached this study's plugins.
    assert all(t.user_attrs["metrics"]["evaluator_pid"] != os.getpid() for t in done)
    assert sorted(m["crash_test_seen"] for m in seen.metrics) == [1.0, 3.0]
    assert [r.state for r in seen.reports] == [states[i] for i in range(4)]
    assert seen.reports[0].error == failed.user_attrs["fail_reason"]

    # The child's report reaches this study's pruner; its verdict goes back and prunes.
    pruned = frugalnas.create_study(
        space="nb201", strategy="ops-often-first", estimator="ops-crash", dataset=None,
        plugins=["ops_support.crashing"], pruner=_PruneAll(),
        storage=f"sqlite:///{tmp_path / 'b.db'}", estimator_options={"crash_on": "none"})
    pruned.optimize(n_trials=2, isolate="process")
    assert [t.state for t in pruned.trials] == [TrialState.PRUNED, TrialState.PRUNED]
    assert all(t.frozen.intermediate_values for t in pruned.trials)


@pytest.mark.slow
def test_an_in_memory_study_refuses_a_candidate_that_crashed_twice():
    # An in-memory storage skips the crash check until this process isolates a trial; the
    # crashes recorded there from then on count as in a shared storage.
    study = frugalnas.create_study(
        space="nb201", strategy="ops-often-first", estimator="ops-crash", dataset=None,
        plugins=["ops_support.crashing"], estimator_options={"crash_on": FIRST, "how": "segv"})
    study.optimize(n_trials=6, isolate="process")
    trials = study.trials
    assert [t.state for t in trials] == [TrialState.FAIL, TrialState.COMPLETE] * 3
    assert [trials[n].user_attrs.get(CRASH_ATTR) for n in (0, 2)] == ["SIGSEGV", "SIGSEGV"]
    assert trials[4].user_attrs["fail_reason"].startswith(CRASHED_REASON)
    assert CRASH_ATTR not in trials[4].user_attrs


# -- frugalnas run ---------------------------------------------------------------------------
@pytest.mark.slow
def test_run_with_isolation_survives_an_aborting_candidate(tmp_path):
    (tmp_path / "control").mkdir()
    proc = subprocess.run(_command(tmp_path, "run", 6, "-o", "estimator.allocate_mib=300",
                                   "--isolate", "process"),
                          cwd=tmp_path, env=env_with_tests(TESTS), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "Traceback" not in proc.stderr
    trials = {t.number: t for t in _trials(tmp_path)}
    assert len(trials) == 6
    assert [trials[n].state for n in (1, 3, 5)] == [TrialState.COMPLETE] * 3
    for n in (0, 2):  # the aborting candidate, twice: FAIL with the signal and its memory
        reason = trials[n].user_attrs["fail_reason"]
        assert reason.startswith("candidate process killed by SIGABRT; peak memory "), reason
        assert int(reason.split("peak memory ")[1].split()[0]) >= 300  # the ballast it held
        assert trials[n].user_attrs[CRASH_ATTR] == "SIGABRT"
    # A third time it is refused without an evaluation.
    assert trials[4].state == TrialState.FAIL
    assert trials[4].user_attrs["fail_reason"].startswith(CRASHED_REASON)
    assert [n for e, n, _ in _log(tmp_path) if e == "start"] == [0, 1, 2, 3, 5]
    assert not any(t.state == TrialState.RUNNING for t in trials.values())


@pytest.mark.slow
def test_killed_run_leaves_a_trial_the_next_run_reclaims(tmp_path):
    control = tmp_path / "control"
    control.mkdir()
    (control / "hang").write_text("")
    first = subprocess.Popen(_command(tmp_path, "run", 3, "--isolate", "process",
                                      "--heartbeat", "1", "--grace", "2"),
                             cwd=tmp_path, env=env_with_tests(TESTS), stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL)
    try:
        _wait_for(lambda: any(e == "hang" for e, _, _ in _log(tmp_path)), 120,
                  "the first trial to hang")
    finally:
        first.send_signal(signal.SIGKILL)
        first.wait(timeout=30)
    child = next(pid for e, _, pid in _log(tmp_path) if e == "hang")
    assert child != first.pid
    # The evaluation process notices that its parent died and ends too.
    _wait_for(lambda: not process_alive(child), 10, "the orphaned evaluation process to exit")
    assert [t.state for t in _trials(tmp_path)] == [TrialState.RUNNING]

    (control / "hang").unlink()
    time.sleep(2.5)  # past the grace: the dead run's trial is stale
    again = subprocess.run(_command(tmp_path, "run", 3, "--isolate", "process",
                                    "--heartbeat", "1", "--grace", "2"),
                           cwd=tmp_path, env=env_with_tests(TESTS), capture_output=True, text=True, timeout=300)
    assert again.returncode == 0, again.stderr[-3000:]
    trials = _trials(tmp_path)
    assert trials[0].state == TrialState.FAIL  # reclaimed from the dead run
    assert len(trials) == 4
    assert not any(t.state == TrialState.RUNNING for t in trials)
    assert sum(t.state == TrialState.COMPLETE for t in trials) == 2  # trial 2 aborts


# -- frugalnas worker ------------------------------------------------------------------------
@pytest.mark.slow
def test_two_workers_with_retries_survive_an_aborting_candidate(tmp_path):
    (tmp_path / "control").mkdir()
    n = 6
    procs = [subprocess.Popen(_command(tmp_path, "worker", n, "--heartbeat", "1", "--retries",
                                       "1", "--isolate", "process"),
                              cwd=tmp_path, env=env_with_tests(TESTS), stdout=subprocess.PIPE,
                              stderr=subprocess.STDOUT, text=True)
             for _ in range(2)]
    outputs = []
    for p in procs:
        out, _ = p.communicate(timeout=300)
        outputs.append(out)
        assert p.returncode == 0, out[-3000:]  # both workers lived to the end
    assert all("Traceback" not in out for out in outputs)
    trials = _trials(tmp_path)
    assert sum(t.state == TrialState.COMPLETE for t in trials) == n
    assert not any(t.state in (TrialState.RUNNING, TrialState.WAITING) for t in trials)
    first = [t for t in trials if t.user_attrs.get("architecture") == FIRST]
    assert first and all(t.state == TrialState.FAIL for t in first)
    crashed = [t for t in first if CRASH_ATTR in t.user_attrs]
    assert 1 <= len(crashed) <= 2
    assert all("killed by SIGABRT" in t.user_attrs["fail_reason"] for t in crashed)
    # Once it killed two processes the candidate is refused, never evaluated again.
    evaluated = {n for e, n, _ in _log(tmp_path) if e == "start"}
    crashes_before = [t.number for t in sorted(crashed, key=lambda t: t.number)]
    if len(crashed) == 2:
        later = [t for t in first if t.number > crashes_before[1]]
        assert all(t.number not in evaluated for t in later)
        assert all(t.user_attrs["fail_reason"].startswith(
            (CRASHED_REASON, "duplicate architecture")) for t in later)
