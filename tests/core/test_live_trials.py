"""A trial whose process still runs is not failed as stale, however late its heartbeat.

On a loaded machine a worker's heartbeat thread can wait longer than the grace for a core;
these tests stop a real process with SIGSTOP (its heartbeat stops, the process lives), let the
grace pass, and check that another process's stale check leaves its trial RUNNING, and that
the trial is failed once the process is gone.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import optuna
import pytest
from optuna.trial import TrialState

from frugalnas.distribution.liveness import (BEATING_PROCESS_ATTR, ProcessId, is_running,
                                             this_process)
from frugalnas.distribution.quota_storage import make_storage, quiet_experimental

pytestmark = pytest.mark.skipif(not Path("/proc/self/stat").exists(), reason="needs /proc")

TESTS = Path(__file__).resolve().parents[1]

_OWNER = textwrap.dedent("""
    import sys, time, warnings
    import optuna
    from frugalnas.distribution.quota_storage import make_storage
    storage = make_storage(sys.argv[1], heartbeat=1, grace=1)
    study = optuna.create_study(storage=storage, study_name="s", load_if_exists=True)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trial = study.ask()
    storage.record_heartbeat(trial._trial_id)
    print(trial.number, flush=True)
    time.sleep(120)
""")


def test_this_process_is_running_and_a_reused_pid_or_another_machine_is_not():
    me = this_process()
    assert me is not None and ProcessId.parse(me.text()) == me
    assert is_running(me) is True
    assert is_running(ProcessId(me.machine, me.pid, me.started + 1)) is False
    assert is_running(ProcessId("another-machine/1", me.pid, me.started)) is None
    assert ProcessId.parse("not a process") is None and ProcessId.parse(None) is None


def test_a_live_process_keeps_its_trial_past_the_grace_and_a_dead_one_loses_it(tmp_path):
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    owner = subprocess.Popen([sys.executable, "-c", _OWNER, url], stdout=subprocess.PIPE,
                             text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"})
    try:
        number = int(owner.stdout.readline())
        owner.send_signal(signal.SIGSTOP)  # no heartbeat from here on; the process lives
        storage = make_storage(url, heartbeat=1, grace=1)
        study = optuna.load_study(storage=storage, study_name="s")
        beating = ProcessId.parse(study.trials[number].system_attrs[BEATING_PROCESS_ATTR])
        assert beating is not None and beating.pid == owner.pid
        time.sleep(3)  # the grace, and more
        with quiet_experimental():
            optuna.storages.fail_stale_trials(study)
        assert study.trials[number].state == TrialState.RUNNING
    finally:
        owner.kill()
        owner.wait(timeout=30)
    with quiet_experimental():
        optuna.storages.fail_stale_trials(study)
    assert study.trials[number].state == TrialState.FAIL


@pytest.mark.slow
def test_a_worker_stopped_longer_than_the_grace_completes_its_trial_and_the_quota_holds(
        tmp_path):
    """Two workers (heartbeat 1 s, grace 2 s, retries 1); one is stopped with SIGSTOP in the
    middle of a trial for three times the grace while the other goes on. The stopped worker's
    trial is not failed: when it resumes it completes it, and the study has exactly its quota
    of complete trials, none failed and none retried."""
    from ops_support.chaos import env_with_tests
    from ops_support.faults import read_log

    n_trials, log = 6, tmp_path / "trials.log"
    url = f"sqlite:///{tmp_path / 'optuna.db'}"

    def worker(name: str) -> subprocess.Popen:
        cmd = [sys.executable, "-m", "frugalnas.cli.main", "worker", "-q", "-p",
               "ops_support.faults", "--space", "nb201", "--estimator", "ops-sleepy",
               "-o", "estimator.seconds=1.0", "-o", f"estimator.log='{log}'",
               "--storage", url, "--study-name", "ops", "--no-tracking",
               "--n-trials", str(n_trials), "--heartbeat", "1", "--grace", "2",
               "--retries", "1"]
        out = open(tmp_path / f"{name}.out", "w")
        return subprocess.Popen(cmd, cwd=tmp_path, env=env_with_tests(TESTS), stdout=out,
                                stderr=subprocess.STDOUT)

    stopped, other = worker("stopped"), worker("other")
    try:
        deadline = time.monotonic() + 120
        while not (log.exists() and any(pid == stopped.pid for _, _, pid in read_log(log))):
            assert time.monotonic() < deadline, "the worker never began a trial"
            assert stopped.poll() is None, (tmp_path / "stopped.out").read_text()
            time.sleep(0.05)
        held = next(n for e, n, pid in read_log(log) if e == "start" and pid == stopped.pid)
        stopped.send_signal(signal.SIGSTOP)
        time.sleep(6)
        stopped.send_signal(signal.SIGCONT)
        for proc, name in ((stopped, "stopped"), (other, "other")):
            assert proc.wait(timeout=180) == 0, (tmp_path / f"{name}.out").read_text()[-3000:]
    finally:
        for proc in (stopped, other):
            proc.kill()
    trials = optuna.load_study(study_name="ops", storage=url).trials
    states = [t.state for t in trials]
    assert trials[held].state == TrialState.COMPLETE, states
    assert states.count(TrialState.COMPLETE) == n_trials and TrialState.FAIL not in states, \
        states
    assert not any("a trial of this worker was failed as stale" in
                   (tmp_path / f"{n}.out").read_text() for n in ("stopped", "other"))


_BEAT = textwrap.dedent("""
    import sys
    from frugalnas.distribution.quota_storage import make_storage
    make_storage(sys.argv[1], heartbeat=1).record_heartbeat(int(sys.argv[2]))
""")


def test_only_a_heartbeat_for_a_running_trial_names_its_process(tmp_path):
    """A worker writes a heartbeat for a WAITING trial before it tries to take it, and may
    lose that race to another worker: such a heartbeat must not name it as the trial's
    process (the winner's trial would then live or die with the loser)."""
    url = f"sqlite:///{tmp_path / 'optuna.db'}"
    storage = make_storage(url, heartbeat=1)
    study = optuna.create_study(storage=storage, study_name="s")
    study.enqueue_trial({"x": 1.0})
    waiting = study.trials[0]._trial_id

    def beat_from_another_process() -> dict:
        subprocess.run([sys.executable, "-c", _BEAT, url, str(waiting)], check=True,
                       env={**os.environ, "PYTHONWARNINGS": "ignore"})
        return storage.get_trial_system_attrs(waiting)

    assert BEATING_PROCESS_ATTR not in beat_from_another_process()
    storage.set_trial_state_values(waiting, TrialState.RUNNING)
    beating = ProcessId.parse(beat_from_another_process()[BEATING_PROCESS_ATTR])
    assert beating is not None and beating.pid != os.getpid()
