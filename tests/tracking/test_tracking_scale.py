"""MLflow tracking whose cost per trial does not grow with the study: the writer searches
MLflow once and keeps its own account of the runs, writes new runs in batches, writes what is
queued before the study's end reconciles, and a later start writes what a killed writer left
out, in batches (frugalnas/tracking/mlflow/tracker.py, writer.py, reconcile.py, review.py)."""

from __future__ import annotations

import math
import os
import random
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

import frugalnas
from ops_support.checks import assert_mlflow_follows_storage, mlflow_runs


def _tracked(storage: str, uri: str, name: str) -> frugalnas.Study:
    return frugalnas.create_study(storage=storage, study_name=name, seed=3,
                                  estimator="nb201-table", strategy="random",
                                  plugin_options={"mlflow": {"tracking_uri": uri}})


@pytest.mark.slow
def test_a_few_hundred_trials_are_each_written_once_with_one_search_in_all(tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    study = _tracked(f"sqlite:///{tmp_path / 'study.db'}", uri, "many")
    study.optimize(n_trials=300)
    state = study.plugin_state["mlflow"]
    assert state["errors"] == [] and study.plugin_errors == []
    # one search when the writer connected; every run created by the writer, none left to
    # the reconciliation at the end (which then needs no search either)
    assert state["counters"] == {"searches": 1, "created": 300, "completed": 0,
                                 "create_batches": state["counters"]["create_batches"]}
    # As many batches as the writer found trials queued: one per trial when it keeps up
    # (a backlog is written in batches of 100: the next test).
    assert 1 <= state["counters"]["create_batches"] <= 300
    assert state["reconciled"] == {"created": 0, "repaired": 0, "removed": 0}
    client, trial_runs, parents = mlflow_runs(uri, "many")
    assert sorted(int(r.data.tags["frugalnas.trial_number"]) for r in trial_runs) == \
        list(range(300))
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert parents[0].data.metrics["n_complete_trials"] == 300
    by_number = {int(r.data.tags["frugalnas.trial_number"]): r for r in trial_runs}
    for t in random.Random(0).sample(study.trials, 10):
        run = by_number[t.number]
        assert run.data.params["architecture"] == str(t.architecture)
        assert run.data.metrics["objective_value"] == pytest.approx(t.value)
        assert run.info.status == "FINISHED" and run.data.tags["state"] == "COMPLETE"
        assert {a.path for a in client.list_artifacts(run.info.run_id)} == \
            {"architecture.json", "cell.png"}
    assert_mlflow_follows_storage(f"sqlite:///{tmp_path / 'study.db'}", uri, "many")


@pytest.mark.slow
def test_the_end_of_a_study_writes_every_queued_trial_before_it_reconciles(tmp_path):
    """The writer cannot reach MLflow until the last trial has finished (another process
    holds the study's MLflow lock), so every trial is queued when the study ends: the end
    writes them all, in batches, and its reconciliation then has nothing left to create."""
    from frugalnas.distribution.locks import study_lock
    from frugalnas.testing import fresh_mlflow_uri

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    study = _tracked(storage, uri, "queued")
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with study_lock(study, "mlflow"):
            held.set()
            release.wait(120)

    holder = threading.Thread(target=hold)
    holder.start()
    assert held.wait(30)
    n = 250

    def last_trial_releases(ostudy, trial) -> None:
        if trial.number == n - 1:
            release.set()

    try:
        study.optimize(n_trials=n, callbacks=[last_trial_releases])
    finally:
        release.set()
        holder.join()
    state = study.plugin_state["mlflow"]
    assert state["errors"] == []
    assert state["reconciled"] == {"created": 0, "repaired": 0, "removed": 0}
    assert state["counters"]["created"] == n and state["counters"]["searches"] == 1
    assert state["counters"]["create_batches"] == math.ceil(n / 100)
    assert_mlflow_follows_storage(storage, uri, "queued")


KILLED = textwrap.dedent("""
    import os, signal, sys, time
    os.environ["FRUGALNAS_PROGRESS"] = "0"
    import frugalnas

    storage, uri, n = sys.argv[1], sys.argv[2], int(sys.argv[3])
    study = frugalnas.create_study(storage=storage, study_name="killed", seed=5,
                                   estimator="nb201-table", strategy="random",
                                   plugin_options={"mlflow": {"tracking_uri": uri}})

    def kill_after_first_batch(ostudy, trial):
        if trial.number == n - 1:  # the writer has written some runs, not all: SIGKILL
            tracker = study.plugin_state["mlflow"]["tracker"]
            end = time.monotonic() + 60
            while tracker.counters["created"] == 0 and time.monotonic() < end:
                time.sleep(0.01)
            print(tracker.counters["created"], flush=True)
            os.kill(os.getpid(), signal.SIGKILL)

    study.optimize(n_trials=n, callbacks=[kill_after_first_batch])
""")


@pytest.mark.slow
def test_a_restart_after_a_killed_writer_writes_the_missing_runs_in_batches_once(tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    n = 320
    proc = subprocess.run([sys.executable, "-c", KILLED, storage, uri, str(n)],
                          capture_output=True, text=True, timeout=600,
                          env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-3000:]
    written = int(proc.stdout.split()[0])
    _, before, _ = mlflow_runs(uri, "killed")
    assert 0 < len(before) < n and len(before) >= written
    missing = n - len(before)

    reopened = frugalnas.load_study(study_name="killed", storage=storage,
                                    plugin_options={"mlflow": {"tracking_uri": uri}})
    reopened.optimize(n_trials=0)
    state = reopened.plugin_state["mlflow"]
    assert state["errors"] == []
    assert state["reconciled"] == {"created": missing, "repaired": 0, "removed": 0}
    assert state["counters"]["create_batches"] == math.ceil(missing / 100)
    _, after, parents = mlflow_runs(uri, "killed")
    numbers = [int(r.data.tags["frugalnas.trial_number"]) for r in after]
    assert sorted(numbers) == list(range(n))  # every trial once: no duplicate
    assert [p.info.status for p in parents] == ["FINISHED"]
    assert_mlflow_follows_storage(storage, uri, "killed")
    again = frugalnas.load_study(study_name="killed", storage=storage,
                                 plugin_options={"mlflow": {"tracking_uri": uri}})
    again.optimize(n_trials=0)
    assert again.plugin_state["mlflow"]["reconciled"] == {"created": 0, "repaired": 0,
                                                          "removed": 0}


def test_a_study_that_ends_on_an_exception_leaves_its_parent_run_failed(tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    study = _tracked(f"sqlite:///{tmp_path / 'study.db'}", uri, "broken")

    def stop_hard(ostudy, trial) -> None:
        if trial.number == 2:
            raise RuntimeError("the caller's callback failed")

    with pytest.raises(RuntimeError, match="callback failed"):
        study.optimize(n_trials=10, callbacks=[stop_hard])
    assert study.plugin_state["mlflow"]["errors"] == []
    _, trial_runs, parents = mlflow_runs(uri, "broken")
    assert [p.info.status for p in parents] == ["FAILED"]
    assert len(trial_runs) == 3


def test_the_review_is_bounded_and_its_best_so_far_curve_exact_in_any_order():
    from frugalnas.tracking.mlflow.review import SAMPLE, TOP, ReviewEntry, StudyReview

    rng = random.Random(7)
    values = [rng.gauss(0, 1) + 0.0005 * k for k in range(5000)]
    order = list(range(5000))
    rng.shuffle(order)  # trials of several workers arrive out of order
    review = StudyReview(["value"], ["maximize"])
    for k in order:
        if review.wants(k, [values[k]]):
            review.add(ReviewEntry(k, (values[k],), architecture=f"arch-{k}"))
        else:
            review.mark(k)
    curve, best = [], None
    for k, v in enumerate(values):
        if best is None or v > best:
            best = v
            curve.append((k, v))
    assert review.curve() == curve and review.count == 5000
    rows = review.rows()
    top = sorted(range(5000), key=lambda k: -values[k])[:TOP]
    assert [r["trial"] for r in rows] == top and rows[0]["architecture"] == f"arch-{top[0]}"
    assert len(review.points()) <= SAMPLE + len(curve)

    two = StudyReview(["value", "latency"], ["maximize", "minimize"])
    points = [(rng.random(), rng.random()) for _ in range(2000)]
    for k, p in enumerate(points):
        two.add(ReviewEntry(k, p))
    front = {k for k, p in enumerate(points)
             if not any(q[0] >= p[0] and q[1] <= p[1] and q != p for q in points)}
    assert {e.number for e in two.front} == front
    assert {r["trial"] for r in two.rows() if r["front"] == 1} == front
