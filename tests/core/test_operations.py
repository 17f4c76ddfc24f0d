"""Operations: worker processes on one storage, crashes, resume, failure isolation, security.

The worker tests start real ``frugalnas worker`` processes on a sqlite optuna storage and a
sqlite MLflow store and kill them with SIGKILL; the estimators of ``tests/ops_support`` sleep,
hang on request, raise, return NaN or run out of memory.
"""

from __future__ import annotations

import ast
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

import frugalnas
from frugalnas.testing import fresh_mlflow_uri
from ops_support.chaos import env_with_tests
from ops_support.faults import read_log

REPO = Path(__file__).resolve().parents[2]
TESTS = Path(__file__).resolve().parents[1]
PLUGIN = "ops_support.faults"


# -- helpers -------------------------------------------------------------------------------


def _worker(tmp_path: Path, n_trials: int, *extra: str, seconds: float = 0.2,
            name: str = "w") -> subprocess.Popen:
    """Start one ``frugalnas worker`` process on the test's stores."""
    cmd = [sys.executable, "-m", "frugalnas.cli.main", "worker", "-q", "-p", PLUGIN,
           "--space", "nb201", "--estimator", "ops-sleepy",
           "-o", f"estimator.seconds={seconds}",
           "-o", f"estimator.log='{tmp_path / 'trials.log'}'",
           "-o", f"estimator.control_dir='{tmp_path / 'control'}'",
           "--storage", f"sqlite:///{tmp_path / 'optuna.db'}", "--study-name", "ops",
           "--tracking-uri", f"sqlite:///{tmp_path / 'mlflow.db'}",
           "--n-trials", str(n_trials), *extra]
    out = open(tmp_path / f"{name}.out", "w")
    return subprocess.Popen(cmd, cwd=tmp_path, env=env_with_tests(TESTS), stdout=out, stderr=subprocess.STDOUT)


def _prepare(tmp_path: Path) -> None:
    (tmp_path / "control").mkdir()
    fresh_mlflow_uri(tmp_path / "mlflow.db")


def _wait_for(cond, timeout: float, what: str, procs=()) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        for p in procs:
            if p.poll() is not None and p.returncode != 0:
                raise AssertionError(f"worker {p.pid} exited with {p.returncode} while waiting for {what}")
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout} s waiting for {what}")


def _log(tmp_path: Path) -> list[tuple[str, int, int]]:
    path = tmp_path / "trials.log"
    return read_log(path) if path.exists() else []


def _finish(procs: list[subprocess.Popen], tmp_path: Path, timeout: float = 300) -> None:
    for i, p in enumerate(procs):
        try:
            rc = p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            p.kill()
            raise
        out = "\n".join((tmp_path / f).read_text() for f in os.listdir(tmp_path) if f.endswith(".out"))
        assert rc == 0, f"worker {p.pid} exited with {rc}:\n{out[-3000:]}"
        assert "MLflow logging errors" not in out, out[-3000:]


def _trials(tmp_path: Path) -> list[optuna.trial.FrozenTrial]:
    study = optuna.load_study(study_name="ops", storage=f"sqlite:///{tmp_path / 'optuna.db'}")
    return study.get_trials(deepcopy=False)


def _runs(tmp_path: Path, uri: str | None = None):
    client = MlflowClient(tracking_uri=uri or f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("ops")
    runs = client.search_runs([exp.experiment_id], max_results=1000)
    trial_runs = [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"]
    parents = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"]
    return trial_runs, parents


def _kill_when_hung(proc: subprocess.Popen, tmp_path: Path, timeout: float = 90) -> int:
    """Wait until ``proc`` hangs in a trial, SIGKILL it, return that trial's number."""
    _wait_for(lambda: any(e == "hang" and pid == proc.pid for e, _, pid in _log(tmp_path)),
              timeout, f"worker {proc.pid} to start its hanging trial", [proc])
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)
    return next(n for e, n, pid in _log(tmp_path) if e == "hang" and pid == proc.pid)


def _assert_stale_closed(tmp_path: Path, killed: int) -> None:
    trials = {t.number: t for t in _trials(tmp_path)}
    assert trials[killed].state == TrialState.FAIL
    trial_runs, parents = _runs(tmp_path)
    by_number = {}
    for r in trial_runs:
        by_number.setdefault(int(r.data.tags["frugalnas.trial_number"]), []).append(r)
    assert len(by_number[killed]) == 1
    run = by_number[killed][0]
    assert run.info.status == "KILLED"
    assert run.data.tags["fail_reason"].startswith("stale trial")
    assert [r.info.run_id for r in trial_runs if r.info.status == "RUNNING"] == []
    assert len(parents) == 1 and parents[0].info.status == "FINISHED"


# -- workers -------------------------------------------------------------------------------
@pytest.mark.slow
def test_four_workers_run_exactly_n_trials_without_duplicates(tmp_path):
    _prepare(tmp_path)
    n = 12
    procs = [_worker(tmp_path, n, seconds=0.4, name=f"w{i}") for i in range(4)]
    _finish(procs, tmp_path)

    trials = _trials(tmp_path)
    assert sorted(t.number for t in trials) == list(range(n))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    archs = [t.user_attrs["architecture"] for t in trials]
    assert len(set(archs)) == n, "two workers evaluated the same architecture"
    log = _log(tmp_path)
    started = [num for e, num, _ in log if e == "start"]
    assert sorted(started) == list(range(n)), "a trial was evaluated twice or not at all"
    owner = {num: pid for e, num, pid in log if e == "start"}
    assert all(owner[num] == pid for e, num, pid in log if e == "end"), "a trial changed worker"
    assert len(set(owner.values())) >= 2, "the workers did not share the study"
    assert set(owner.values()) <= {p.pid for p in procs}

    trial_runs, parents = _runs(tmp_path)
    assert len(parents) == 1
    numbers = sorted(int(r.data.tags["frugalnas.trial_number"]) for r in trial_runs)
    assert numbers == list(range(n)), "MLflow must hold exactly one run per trial"
    assert {r.info.status for r in trial_runs} == {"FINISHED"}
    assert all(r.data.tags["mlflow.parentRunId"] == parents[0].info.run_id for r in trial_runs)


@pytest.mark.slow
def test_a_worker_killed_while_its_strategy_proposes_leaves_a_trial_that_becomes_stale(tmp_path):
    """The victim dies holding the proposal lock, in a trial without parameters: the survivor
    waits for the lock, then the trial goes stale (it has had a heartbeat since it was
    created), and the study ends with exactly n complete trials and the trial's run closed."""
    _prepare(tmp_path)
    n = 4
    control = tmp_path / "control"
    flags = ["--strategy", "ops-propose-hang", "-o", f"strategy.control_dir='{control}'",
             "--heartbeat", "1", "--grace", "3"]
    victim = _worker(tmp_path, n, *flags, seconds=0.2, name="victim")
    (control / str(victim.pid)).touch()  # its first proposal hangs
    survivor = _worker(tmp_path, n, *flags, seconds=0.2, name="survivor")
    proposing = control / f"{victim.pid}.proposing"
    _wait_for(proposing.exists, 120, "the victim to hang in its proposal", [victim, survivor])
    killed = int(proposing.read_text())
    victim.send_signal(signal.SIGKILL)
    victim.wait(timeout=30)
    _finish([survivor], tmp_path)

    trials = _trials(tmp_path)
    states = [t.state for t in trials]
    assert states.count(TrialState.COMPLETE) == n
    assert states.count(TrialState.FAIL) == 1 and TrialState.RUNNING not in states
    assert trials[killed].state == TrialState.FAIL and "architecture" not in trials[killed].user_attrs
    _assert_stale_closed(tmp_path, killed)
    trial_runs, _ = _runs(tmp_path)
    assert sum(r.info.status == "FINISHED" for r in trial_runs) == n


@pytest.mark.slow
def test_sigterm_stops_a_worker_at_once_with_its_trial_failed_and_its_run_closed(tmp_path):
    _prepare(tmp_path)
    worker = _worker(tmp_path, 3, seconds=0.2, name="terminated")
    (tmp_path / "control" / str(worker.pid)).touch()  # its first trial hangs
    _wait_for(lambda: any(e == "hang" for e, _, _ in _log(tmp_path)), 120,
              "the worker to start its trial", [worker])
    worker.send_signal(signal.SIGTERM)
    assert worker.wait(timeout=60) == 143
    out = (tmp_path / "terminated.out").read_text()
    assert "interrupted by SIGTERM" in out and "Traceback" not in out, out
    trials = _trials(tmp_path)
    assert [t.state for t in trials] == [TrialState.FAIL]   # at once: no heartbeat, no grace
    assert trials[0].user_attrs["fail_reason"] == "interrupted by SIGTERM"
    trial_runs, parents = _runs(tmp_path)
    assert [(r.info.status, r.data.tags["state"]) for r in trial_runs] == [("KILLED", "FAIL")]
    assert parents[0].info.status == "FINISHED"


@pytest.mark.slow
def test_crashed_study_resumes_to_exactly_n_trials_and_evolution_keeps_its_population(tmp_path):
    _prepare(tmp_path)
    n, n_init = 9, 3
    strategy = ["--strategy", "regularized-evolution", "-o", f"strategy.n_init={n_init}",
                "-o", "strategy.population_size=4", "-o", "strategy.sample_size=2",
                "--heartbeat", "1", "--grace", "2", "--retries", "1"]
    first = _worker(tmp_path, n, *strategy, seconds=0.05, name="first")
    _wait_for(lambda: sum(e == "end" for e, _, _ in _log(tmp_path)) >= n_init + 1, 90,
              "the first worker to finish its initial population", [first])
    (tmp_path / "control" / str(first.pid)).touch()
    killed = _kill_when_hung(first, tmp_path)
    assert killed > n_init
    before = {t.number for t in _trials(tmp_path)}

    second = _worker(tmp_path, n, *strategy, seconds=0.05, name="second")
    _finish([second], tmp_path)
    trials = sorted(_trials(tmp_path), key=lambda t: t.number)
    states = [t.state for t in trials]
    assert states.count(TrialState.COMPLETE) == n
    assert states.count(TrialState.FAIL) == 1 and TrialState.RUNNING not in states
    _assert_stale_closed(tmp_path, killed)

    # --retries 1: the killed trial's architecture ran again, as a trial that says so.
    retried = [t for t in trials if optuna.storages.RetryFailedTrialCallback.retried_trial_number(t) == killed]
    assert len(retried) == 1 and retried[0].state == TrialState.COMPLETE
    assert retried[0].user_attrs["architecture"] == trials[killed].user_attrs["architecture"]

    # The resumed run continued the evolution: every new architecture is a one-edit
    # mutation of an architecture completed before it (a restart would sample at random).
    space = frugalnas.create_component("search_spaces", "nb201")
    resumed = [t for t in trials if t.number not in before]
    assert resumed
    for t in resumed:
        arch = space.parse(t.user_attrs["architecture"])
        earlier = [space.parse(e.user_attrs["architecture"]) for e in trials
                   if e.number < t.number and e.state == TrialState.COMPLETE]
        diffs = [sum(a != b for a, b in zip(arch.decisions.values(), e.decisions.values()))
                 for e in earlier]
        assert min(diffs) == 1, f"trial {t.number} ({arch}) is no mutation of the population"


# -- failure isolation ---------------------------------------------------------------------
def test_failing_candidates_become_fail_trials_and_the_study_goes_on(tmp_path):
    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    modes = ["ok", "raise", "nan", "oom", "hang", "ok"]
    study = frugalnas.create_study(
        space="nb201", estimator="ops-faulty", plugins=[PLUGIN], study_name="ops",
        estimator_options={"modes": modes, "hang_seconds": 60}, trial_timeout=3.0,
        storage=f"sqlite:///{tmp_path / 'optuna.db'}", plugin_options={"mlflow": {"tracking_uri": uri}})
    assert study.estimator is not None  # built (and torch warmed up) outside the timed trials
    start = time.monotonic()
    study.optimize(n_trials=len(modes))
    assert time.monotonic() - start < 30, "the hanging candidate was not stopped by trial_timeout"

    states = [t.state.name for t in study.trials]
    assert states == ["COMPLETE", "FAIL", "FAIL", "FAIL", "FAIL", "COMPLETE"]
    expected = {1: "RuntimeError: candidate", 2: "objective 'value' is not finite: nan",
                3: "out of memory", 4: "trial timed out after 3 s"}
    for number, fragment in expected.items():
        assert fragment in study.trials[number].user_attrs["fail_reason"]

    trial_runs, _ = _runs(tmp_path, uri)
    runs = {int(r.data.tags["frugalnas.trial_number"]): r for r in trial_runs}
    assert sorted(runs) == list(range(len(modes)))
    for number, fragment in expected.items():
        assert runs[number].info.status == "FAILED"
        assert fragment in runs[number].data.tags["fail_reason"]
        assert runs[number].data.tags["state"] == "FAIL"
    assert runs[0].info.status == runs[5].info.status == "FINISHED"
    assert "fail_reason" not in runs[0].data.tags


# -- security ------------------------------------------------------------------------------
# torch.load calls that are not checkpoint loads: the virtual-node backend sends whole pickled
# models from the study process to the worker processes it spawned itself (in-process IPC).
NOT_CHECKPOINTS = {"frugalnas/backends/virtual_node/comm.py"}


def test_every_torch_load_uses_weights_only():
    """Checkpoints must load with ``weights_only=True`` (no pickled code runs on load)."""
    offenders, calls = [], 0
    for path in sorted((REPO / "frugalnas").rglob("*.py")):
        tree = ast.parse(path.read_text(), filename=str(path))
        for node in ast.walk(tree):
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) \
                    and node.func.attr == "load" and getattr(node.func.value, "id", None) == "torch":
                calls += 1
                kw = {k.arg: k.value for k in node.keywords}
                safe = isinstance(kw.get("weights_only"), ast.Constant) and kw["weights_only"].value is True
                if not safe and str(path.relative_to(REPO)) not in NOT_CHECKPOINTS:
                    offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert calls >= 1, "the scan found no torch.load call at all (the weight store has one)"
    assert offenders == [], f"torch.load without weights_only=True: {offenders}"


# -- one search shared by workers (in-process) -----------------------------------------------
def _config(**kw) -> frugalnas.StudyConfig:
    kw.setdefault("plugins", [PLUGIN])
    return frugalnas.StudyConfig(space="nb201", estimator="nb201-table", dataset=None, **kw)


def test_study_trials_read_running_and_failed_trials_without_an_architecture(tmp_path):
    """Another worker's RUNNING trial that has not proposed yet, and a trial that failed
    during its proposal, have no architecture: Study.trials and strategies read them."""
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = frugalnas.create_study(storage=storage, study_name="ops", strategy="regularized-evolution",
                                   strategy_options={"n_init": 2, "population_size": 2,
                                                     "sample_size": 2},
                                   disable_plugins=["mlflow"])
    study.optimize(n_trials=3)
    running = study.optuna_study.ask()                  # RUNNING, no params yet
    partial = study.optuna_study.ask()                  # fails half-way through its proposal
    partial.suggest_categorical("edge_1_0", study.space.distributions()["edge_1_0"].choices)
    study.optuna_study.tell(partial, state=TrialState.FAIL)

    records = {t.number: t for t in study.trials}
    assert records[running.number].architecture is None
    assert records[partial.number].architecture is None
    assert all(records[n].architecture is not None for n in range(3))
    assert len(study.completed_trials()) == 3 and study.best_trial.architecture is not None

    reopened = frugalnas.load_study(study_name="ops", storage=storage, disable_plugins=["mlflow"])
    reopened.optimize(n_trials=2)                       # evolution reads the odd trials too
    assert len(reopened.completed_trials()) == 5


def test_the_quota_storage_forwards_every_storage_method(tmp_path):
    from optuna.storages import BaseStorage

    from frugalnas.ports.optuna_compat import BaseHeartbeat
    from frugalnas.distribution.quota_storage import QuotaStorage, make_storage

    public = {n for base in (BaseStorage, BaseHeartbeat) for n, v in vars(base).items()
              if callable(v) and not n.startswith("__")}
    assert {"remove_session", "get_best_trial", "check_trial_is_updatable"} <= public
    missing = [n for n in public if n not in vars(QuotaStorage)]
    assert missing == [], f"QuotaStorage inherits {missing} instead of forwarding them"

    url = f"sqlite:///{tmp_path / 'q.db'}"
    inner = make_storage(url)
    quota = QuotaStorage(inner, url, n_trials=3)
    calls = []
    inner.remove_session = lambda: calls.append("remove_session")
    quota.remove_session()
    assert calls == ["remove_session"]
    study = optuna.create_study(storage=quota, direction="maximize")
    for v in (0.2, 0.9, 0.5):
        study.tell(study.ask(), v)
    with pytest.raises(Exception, match="3 of 3"):
        study.ask()
    assert study.best_value == 0.9
    seen = []
    real = type(inner).get_best_trial
    inner.get_best_trial = lambda study_id: seen.append(study_id) or real(inner, study_id)
    assert study.best_trial.value == 0.9 and seen, "get_best_trial did not reach RDBStorage"


def test_the_quota_reads_other_workers_trials_incrementally_and_exactly(tmp_path):
    """Two workers' quota storages on one sqlite file: at every proposal, the count of the
    study's trials and the duplicate check agree with a full read of the storage while the
    other worker creates, finishes, fails and queues trials; after the first proposal they
    read only the trials created since and those unfinished then, never every trial."""
    from frugalnas.ports.keys import ARCHITECTURE_ATTR
    from frugalnas.distribution.quota_storage import COUNTED_STATES, QuotaStorage, make_storage

    url = f"sqlite:///{tmp_path / 'q.db'}"
    quotas = [QuotaStorage(make_storage(url), url, n_trials=10_000, repeats=True)
              for _ in range(2)]
    studies = [optuna.create_study(storage=quotas[0], study_name="q", direction="maximize")]
    studies.append(optuna.load_study(study_name="q", storage=quotas[1]))
    reference = make_storage(url)
    study_id = reference.get_study_id_from_name("q")
    full_reads = []

    def recording(real):  # a read of every trial (optuna's ask reads the WAITING ones only)
        def get_all_trials(study_id, deepcopy=True, states=None):
            if states is None or set(states) != {TrialState.WAITING}:
                full_reads.append(study_id)
            return real(study_id, deepcopy=deepcopy, states=states)
        return get_all_trials

    for q in quotas:
        q.inner.get_all_trials = recording(q.inner.get_all_trials)
    running: list[tuple[int, optuna.Trial]] = []
    for step in range(30):
        w = step % 2
        trial = studies[w].ask()
        trial.set_user_attr(ARCHITECTURE_ATTR, f"cell-{step % 9}")
        running.append((w, trial))
        if step % 3 == 0:   # the other worker finishes its oldest trial, or fails it
            w_done, done = running.pop(0)
            state = TrialState.FAIL if step % 6 == 0 else TrialState.COMPLETE
            studies[w_done].tell(done, None if state == TrialState.FAIL else 0.5, state=state)
        if step % 10 == 5:
            studies[1 - w].enqueue_trial({})                        # a WAITING trial
        everything = reference.get_all_trials(study_id, deepcopy=False)
        for q in quotas:
            ledger = {t.number: t.state for t in q._read_trials(study_id)}
            assert ledger == {t.number: t.state for t in everything}, step
            assert sum(s in COUNTED_STATES for s in ledger.values()) == sum(
                t.state in COUNTED_STATES for t in everything)
            for text in (f"cell-{step % 9}", "cell-never"):
                taken = q._taken_by(-1, study_id, text)
                expected = [t.number for t in everything if t.state in COUNTED_STATES
                            and t.user_attrs.get(ARCHITECTURE_ATTR) == text]
                assert (taken.number if taken else None) == (expected[0] if expected else None)
    assert len(full_reads) <= 2, "the quota read every trial again after its first read"


def _fail_each(url: str, trial_ids: list[int], barrier, results) -> None:
    from frugalnas.distribution.quota_storage import QuotaStorage, make_storage

    quota = QuotaStorage(make_storage(url), url, n_trials=10_000)
    succeeded = 0
    for trial_id in trial_ids:
        barrier.wait()
        try:
            succeeded += bool(quota.set_trial_state_values(trial_id, TrialState.FAIL))
        except optuna.exceptions.UpdateFinishedTrialError:
            pass
    results.put(succeeded)


def _race_two_processes(target, url: str, trial_ids: list[int]) -> int:
    """Run ``target(url, trial_ids, barrier, results)`` in two forked processes that meet at
    a barrier before each trial; the sum of what they report."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    barrier, results = ctx.Barrier(2), ctx.Queue()
    procs = [ctx.Process(target=target, args=(url, trial_ids, barrier, results))
             for _ in range(2)]
    for p in procs:
        p.start()
    total = results.get(timeout=120) + results.get(timeout=120)
    for p in procs:
        p.join(timeout=30)
    return total


def test_two_workers_failing_one_stale_trial_at_once_fail_it_once(tmp_path):
    """Two worker processes fail the same RUNNING trials at the same moment, as two workers'
    stale checks do: each trial is failed by exactly one of them, so it is retried once (on
    sqlite a bare RDB storage lets both writes succeed)."""
    from frugalnas.distribution.quota_storage import make_storage

    url = f"sqlite:///{tmp_path / 'q.db'}"
    storage = make_storage(url)
    optuna.create_study(storage=storage, study_name="q")
    study_id = storage.get_study_id_from_name("q")
    trial_ids = [storage.create_new_trial(study_id) for _ in range(60)]
    succeeded = _race_two_processes(_fail_each, url, trial_ids)
    assert succeeded == len(trial_ids), f"{succeeded} FAIL writes for {len(trial_ids)} trials"
    assert {t.state for t in storage.get_all_trials(study_id)} == {TrialState.FAIL}


def _take_each(url: str, trial_ids: list[int], barrier, results) -> None:
    from frugalnas.distribution.quota_storage import QuotaStorage, make_storage

    quota = QuotaStorage(make_storage(url, heartbeat=60), url, n_trials=10_000)
    taken = 0
    for trial_id in trial_ids:
        barrier.wait()
        taken += bool(quota.set_trial_state_values(trial_id, TrialState.RUNNING))
    results.put(taken)


def test_two_workers_taking_one_queued_trial_at_once_take_it_once(tmp_path):
    """Two worker processes take the same queued trials (retries, with their parameters) at
    the same moment, as two workers' optuna pops do: each trial is taken by exactly one of
    them, so it is evaluated once (on sqlite a bare RDB storage lets both take it)."""
    from frugalnas.distribution.quota_storage import make_storage

    url = f"sqlite:///{tmp_path / 'q.db'}"
    study = optuna.create_study(storage=make_storage(url), study_name="q")
    for i in range(60):
        study.enqueue_trial({"x": float(i)})
    trial_ids = [t._trial_id for t in study.trials]
    taken = _race_two_processes(_take_each, url, trial_ids)
    assert taken == len(trial_ids), f"{taken} takes of {len(trial_ids)} queued trials"


def test_workers_show_no_optuna_experimental_warnings(tmp_path):
    import warnings

    from frugalnas.distribution.worker import run_worker

    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        run_worker(_config(), f"sqlite:///{tmp_path / 'optuna.db'}", "ops", 3, heartbeat=1,
                   grace=2, retries=1)
    experimental = [str(w.message) for w in caught
                    if issubclass(w.category, optuna.exceptions.ExperimentalWarning)]
    assert experimental == []


def test_a_worker_never_evaluates_an_architecture_twice_unless_asked(tmp_path):
    """A sampler that always proposes the same architecture: the repeats become FAIL trials
    that say why, nothing is evaluated twice, and the worker stops after 20 in a row."""
    from frugalnas.distribution.worker import MAX_DUPLICATES_IN_A_ROW, run_worker

    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    with pytest.raises(frugalnas.ConfigError, match="proposed 20 architectures in a row"):
        run_worker(_config(strategy="ops-repeat"), storage, "ops", 4)
    trials = _trials_of(storage, "ops")
    complete = [t for t in trials if t.state == TrialState.COMPLETE]
    failed = [t for t in trials if t.state == TrialState.FAIL]
    assert len(complete) == 1 and len(failed) == MAX_DUPLICATES_IN_A_ROW
    assert all(t.user_attrs["fail_reason"].startswith("duplicate architecture: trial 0 (COMPLETE)")
               for t in failed)
    assert all(t.user_attrs["architecture"] == complete[0].user_attrs["architecture"] for t in failed)

    study = run_worker(_config(strategy="ops-repeat"), f"sqlite:///{tmp_path / 'r.db'}", "ops", 3,
                       repeats=True)
    assert [t.state for t in study.trials] == [TrialState.COMPLETE] * 3
    assert len({str(t.architecture) for t in study.trials}) == 1


def _trials_of(storage: str, name: str):
    return optuna.load_study(study_name=name, storage=storage).get_trials(deepcopy=False)


def test_every_fault_in_the_operations_table_names_tests_that_exist():
    """docs/operations.md's table of faults: each row names at least one test, and each
    named test exists (``tests/FILE.py::NAME`` or ``::NAME`` for the file named before)."""
    import re

    text = (REPO / "docs" / "operations.md").read_text()
    table = text[text.index("## Faults tried"):]
    table = table[:table.index("\n## ", 5)]
    rows = [line for line in table.splitlines() if line.startswith("| ") and "---" not in line][1:]
    assert len(rows) >= 12
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        refs = re.findall(r"`(tests/[\w/]+\.py)?(?:::(\w+))?`", cells[-1])
        assert refs, f"no test named in: {row}"
        current = None
        for path, name in refs:
            current = path or current
            assert current, row
            source = (REPO / current).read_text()
            if name:
                assert f"def {name}(" in source, f"{current}::{name} does not exist"
