"""Signals to ``frugalnas run``: SIGTERM (``kill``, systemd, Slurm, Kubernetes) and SIGINT
(Ctrl-C) stop a run cleanly at any moment of a trial's life.

The tests start real ``frugalnas run`` processes and send them real signals: during an
isolated evaluation (``ops_support.crashing``'s estimator hangs on request) and while optuna
creates a trial, before its objective runs (``ops_support.interrupts``'s slow strategy).
"""

from __future__ import annotations

import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from frugalnas.testing import fresh_mlflow_uri
from ops_support.chaos import env_with_tests, process_alive
from ops_support.faults import read_log

TESTS = Path(__file__).resolve().parents[1]


def _start(tmp_path: Path, *extra: str) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "frugalnas.cli.main", "run", "-q", "--space", "nb201",
           "--storage", f"sqlite:///{tmp_path / 'optuna.db'}", "--study-name", "sig", *extra]
    out = open(tmp_path / "run.out", "w")
    return subprocess.Popen(cmd, cwd=tmp_path, env=env_with_tests(TESTS), stdout=out,
                            stderr=subprocess.STDOUT)


def _wait_for(cond, timeout: float, what: str, proc: subprocess.Popen) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        if proc.poll() is not None:
            raise AssertionError(f"run exited with {proc.returncode} while waiting for {what}")
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="sig", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    return study.get_trials(deepcopy=False)


@pytest.mark.slow
@pytest.mark.parametrize("sig, status", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_a_signal_during_an_isolated_trial_fails_it_closes_mlflow_and_stops_the_child(
        tmp_path, sig, status):
    control = tmp_path / "control"
    control.mkdir()
    (control / "hang").touch()  # the first evaluation hangs
    log = tmp_path / "trials.log"
    mlflow_uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    run = _start(tmp_path, "-p", "ops_support.crashing", "--estimator", "ops-crash",
                 "-o", f"estimator.log='{log}'", "-o", f"estimator.control_dir='{control}'",
                 "--isolate", "process", "--tracking-uri", mlflow_uri, "--n-trials", "3")
    _wait_for(lambda: log.exists() and any(e == "hang" for e, _, _ in read_log(log)), 120,
              "the first trial to hang in its evaluation process", run)
    child = next(pid for e, _, pid in read_log(log) if e == "hang")
    assert child != run.pid
    run.send_signal(sig)
    assert run.wait(timeout=60) == status
    out = (tmp_path / "run.out").read_text()
    assert f"frugalnas: interrupted by {sig.name}" in out, out
    assert "Traceback" not in out and "BrokenPipeError" not in out, out
    assert not process_alive(child)

    trials = _trials(tmp_path)
    assert [t.state for t in trials] == [TrialState.FAIL]
    assert trials[0].user_attrs["fail_reason"] == f"interrupted by {sig.name}"
    client = MlflowClient(tracking_uri=mlflow_uri)
    runs = client.search_runs([client.get_experiment_by_name("sig").experiment_id])
    by_role = {}
    for r in runs:
        by_role.setdefault(r.data.tags.get("frugalnas.role"), []).append(r)
    assert [(r.info.status, r.data.tags["fail_reason"]) for r in by_role["trial"]] == [
        ("KILLED", f"interrupted by {sig.name}")]
    assert [r.info.status for r in by_role["study"]] == ["FINISHED"]


@pytest.mark.slow
def test_ctrl_c_while_a_trial_is_created_fails_that_trial(tmp_path):
    """SIGINT lands while optuna creates a trial (the strategy's ``before_trial``), before
    the objective runs: the trial is failed, not left RUNNING without parameters."""
    control = tmp_path / "control"
    control.mkdir()
    run = _start(tmp_path, "-p", "ops_support.interrupts", "--strategy", "ops-slow-ask",
                 "-o", f"strategy.control_dir='{control}'", "-o", "strategy.seconds=2",
                 "--estimator", "nb201-table", "--no-tracking",
                 "--n-trials", "50")
    asking = control / "asking"
    _wait_for(lambda: _trials_exist(tmp_path), 120, "the study to start", run)
    (control / "slow").touch()
    _wait_for(asking.exists, 60, "a trial to be created slowly", run)
    time.sleep(0.5)
    run.send_signal(signal.SIGINT)
    assert run.wait(timeout=60) == 130
    trials = {t.number: t for t in _trials(tmp_path)}
    interrupted = trials[int(asking.read_text())]
    assert interrupted.state == TrialState.FAIL
    assert interrupted.user_attrs["fail_reason"] == "interrupted by SIGINT"
    assert not any(t.state == TrialState.RUNNING for t in trials.values())
    out = (tmp_path / "run.out").read_text()
    assert "frugalnas: interrupted by SIGINT" in out and "Traceback" not in out, out


def _trials_exist(tmp_path: Path) -> bool:
    try:
        return len(_trials(tmp_path)) > 0
    except Exception:
        return False
