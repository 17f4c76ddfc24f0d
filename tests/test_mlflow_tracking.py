import json

import mlflow
import pytest
from mlflow import MlflowClient

import frugalnas
from frugalnas.testing import fresh_mlflow_uri


def runs_of(uri, name):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    return client, client.search_runs([exp.experiment_id], max_results=1000)


def test_parent_and_nested_trial_runs(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="tracked", plugin_options={"mlflow": {"tracking_uri": uri}}, seed=1)
    study.optimize(n_trials=4)
    assert study.plugin_state["mlflow"]["errors"] == []
    client, runs = runs_of(uri, "tracked")
    parents = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"]
    trials = [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"]
    assert len(parents) == 1 and len(trials) == 4
    parent = parents[0]
    assert parent.data.params["space"] == "nb201"
    assert "best_so_far.png" in [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert parent.data.metrics["best_value"] == pytest.approx(study.best_value)
    curve = client.get_metric_history(parent.info.run_id, "best_so_far")
    assert [m.step for m in sorted(curve, key=lambda m: m.step)] == [0, 1, 2, 3]
    values = [m.value for m in sorted(curve, key=lambda m: m.step)]
    assert values == sorted(values) and values[-1] == pytest.approx(study.best_value)
    assert client.get_experiment(parent.info.experiment_id).tags["mlflow.experimentKind"] == \
        "custom_model_development"
    for run in trials:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["strategy"] == "random" and run.data.tags["state"] == "COMPLETE"
        assert run.info.status == "FINISHED"
        assert set(run.data.params) >= {"edge_1_0", "edge_3_2", "architecture"}
        assert {"value", "cost_seconds", "cost_epochs", "objective_value"} <= set(run.data.metrics)
        names = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert "architecture.json" in names and "cell.png" in names
    by_number = {int(r.data.tags["frugalnas.trial_number"]): r for r in trials}
    for t in study.trials:
        run = by_number[t.number]
        assert run.data.params["architecture"] == str(t.architecture)
        assert run.data.metrics["value"] == pytest.approx(t.value)
        local = client.download_artifacts(run.info.run_id, "architecture.json")
        assert frugalnas.Architecture.from_dict(json.load(open(local))) == t.architecture


def test_failed_trial_run_is_marked_failed(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="fails", plugin_options={"mlflow": {"tracking_uri": uri}},
                                   estimator="train", dataset="digits",
                                   space_options={"N": 1, "C": 2},
                                   estimator_options={"epochs": 1, "lr": 1e30, "batch_size": 256})
    study.optimize(n_trials=1)
    _, runs = runs_of(uri, "fails")
    trial = [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"][0]
    assert trial.info.status == "FAILED"
    assert "non-finite" in trial.data.tags["fail_reason"]


def test_resumed_study_reuses_parent_run(stores):
    storage, uri = stores
    frugalnas.create_study(storage=storage, study_name="again", plugin_options={"mlflow": {"tracking_uri": uri}}).optimize(2)
    frugalnas.load_study(study_name="again", storage=storage).optimize(2)
    _, runs = runs_of(uri, "again")
    assert sum(r.data.tags.get("frugalnas.role") == "study" for r in runs) == 1
    assert sum(r.data.tags.get("frugalnas.role") == "trial" for r in runs) == 4


def test_study_metrics_and_pareto_front(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="mo", plugin_options={"mlflow": {"tracking_uri": uri}},
                                   directions=["maximize", "maximize"],
                                   objectives=["value", "test_accuracy_cifar100"])
    study.optimize(n_trials=6)
    study._start()
    study.log_metrics({"surrogate_kendall_tau": 0.5}, step=3)
    study.finish()
    client, runs = runs_of(uri, "mo")
    parent = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"][0]
    names = [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert "pareto_front.png" in names and "pareto_front.json" in names
    hist = client.get_metric_history(parent.info.run_id, "surrogate_kendall_tau")
    assert [(m.step, m.value) for m in hist] == [(3, 0.5)]


def test_env_var_sets_the_default_store(tmp_path, monkeypatch):
    uri = fresh_mlflow_uri(tmp_path / "env.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    frugalnas.create_study(study_name="from-env").optimize(1)
    _, runs = runs_of(uri, "from-env")
    assert len(runs) == 2
