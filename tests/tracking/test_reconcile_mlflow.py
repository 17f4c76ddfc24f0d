"""MLflow follows the optuna storage: whatever a dead process did not write, or left half
written, the next study start or end puts right (frugalnas/tracking/mlflow/reconcile.py)."""

from __future__ import annotations

from optuna.trial import TrialState

import frugalnas
from ops_support.checks import assert_mlflow_follows_storage, mlflow_runs


def _runs(uri: str, name: str):
    return mlflow_runs(uri, name)


def _reopen(storage: str, uri: str, name: str = "rec") -> frugalnas.Study:
    """A command that opens the study and runs nothing (as `frugalnas worker` does when the
    study already has its trials): the plugins' start and end hooks run."""
    study = frugalnas.load_study(study_name=name, storage=storage,
                                 plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(n_trials=0)
    return study


def test_runs_that_never_reached_mlflow_are_written_at_the_next_start(stores, tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    storage, uri = stores
    lost = fresh_mlflow_uri(tmp_path / "lost.db")  # every write of the first session goes here
    study = frugalnas.create_study(storage=storage, study_name="rec",
                                   plugin_options={"mlflow": {"tracking_uri": lost}})
    study.optimize(n_trials=4)
    reopened = _reopen(storage, uri)
    assert reopened.plugin_state["mlflow"]["reconciled"]["created"] == 4
    assert reopened.plugin_state["mlflow"]["errors"] == []
    assert_mlflow_follows_storage(storage, uri, "rec")
    _, trial_runs, _ = _runs(uri, "rec")
    for r in trial_runs:  # what the storage holds: the estimator's metrics and the cost
        assert {"value", "cost_seconds", "cost_params", "objective_value"} <= set(r.data.metrics)
        assert {"edge_1_0", "architecture"} <= set(r.data.params)
    again = _reopen(storage, uri)
    assert again.plugin_state["mlflow"]["reconciled"] == {"created": 0, "repaired": 0, "removed": 0}


def test_runs_left_open_wrong_or_twice_are_repaired(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="rec",
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(n_trials=5)
    client, trial_runs, parents = _runs(uri, "rec")
    by_number = {int(r.data.tags["frugalnas.trial_number"]): r for r in trial_runs}
    # A worker killed between its writes: the run exists, RUNNING, without its artifacts.
    client.update_run(by_number[0].info.run_id, status="RUNNING")
    # A write that never reached the store.
    client.delete_run(by_number[1].info.run_id)
    # A trial MLflow saw complete whose worker died before optuna recorded it: the storage
    # says FAIL (the heartbeat failed it as stale), MLflow says COMPLETE/FINISHED.
    ostudy = study.optuna_study
    ghost = ostudy.ask()
    ostudy.tell(ghost, state=TrialState.FAIL)
    tags = {k: v for k, v in by_number[3].data.tags.items()
            if k.startswith(("frugalnas.", "mlflow.parentRunId"))}
    run = client.create_run(by_number[0].info.experiment_id, run_name=f"trial {ghost.number}",
                            tags={**tags, "frugalnas.trial_number": str(ghost.number),
                                  "state": "COMPLETE"})
    client.set_terminated(run.info.run_id, "FINISHED")
    # Two runs for one trial (two processes raced before writes were serialized).
    dup = client.create_run(by_number[0].info.experiment_id, run_name="trial 4",
                            tags={k: v for k, v in by_number[4].data.tags.items()
                                  if k.startswith(("frugalnas.", "mlflow.parentRunId", "state"))})
    client.set_terminated(dup.info.run_id, "FINISHED")

    reopened = _reopen(storage, uri)
    changes = reopened.plugin_state["mlflow"]["reconciled"]
    assert changes == {"created": 1, "repaired": 3, "removed": 1}, changes
    assert_mlflow_follows_storage(storage, uri, "rec")
    _, trial_runs, _ = _runs(uri, "rec")
    ghost_run = [r for r in trial_runs if r.data.tags["frugalnas.trial_number"] == str(ghost.number)]
    assert ghost_run[0].info.status == "KILLED"
    assert ghost_run[0].data.tags["fail_reason"].startswith("stale trial")


def test_a_trial_that_failed_while_proposing_gets_a_run(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="rec",
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(n_trials=2)
    broken = study.optuna_study.ask()                  # no architecture, then FAIL
    study.optuna_study.tell(broken, state=TrialState.FAIL)
    _reopen(storage, uri)
    assert_mlflow_follows_storage(storage, uri, "rec")


def test_two_in_memory_studies_with_one_name_keep_their_own_runs(tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    for _ in range(2):
        frugalnas.create_study(study_name="same", plugin_options={"mlflow": {"tracking_uri": uri}}
                               ).optimize(n_trials=3)
    _, trial_runs, parents = _runs(uri, "same")
    assert len(parents) == 2 and len(trial_runs) == 6
    assert {r.data.tags["frugalnas.study_id"] for r in trial_runs} == \
        {p.data.tags["frugalnas.study_id"] for p in parents}


def test_a_fast_study_writes_each_run_once_without_reconciling(stores):
    """Trials that finish before the writer has opened MLflow are written by their own queued
    writes; the reconciliation at the start leaves them alone (it used to re-create them all
    from the storage, then the queued writes completed them a second time)."""
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="fast", seed=0,
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(n_trials=30)
    state = study.plugin_state["mlflow"]
    assert state["errors"] == [] and state["reconciled"] == {"created": 0, "repaired": 0,
                                                             "removed": 0}
    assert_mlflow_follows_storage(storage, uri, "fast")
    _, trial_runs, _ = _runs(uri, "fast")
    assert sorted(int(r.data.tags["frugalnas.trial_number"]) for r in trial_runs) == \
        list(range(30))
    for r in trial_runs:  # written by the process that ran the trial: the full record
        assert {"objective_value", "cost_seconds"} <= set(r.data.metrics)
        assert r.info.status == "FINISHED"
