"""Backends report facts about each evaluation through ``trial_outputs()``: the study puts them
in the trial's metrics and, through the MLflow plugin, in the trial's run."""

from __future__ import annotations

import json
import threading
import warnings
from pathlib import Path

import pytest
import torch
from mlflow import MlflowClient
from torch import nn

import frugalnas
from frugalnas.backends.out_of_core.backend import OutOfCoreBackend, find_blocks
from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
from frugalnas.host.plugins import PluginHost
from frugalnas.testing import fresh_mlflow_uri

LOSS = nn.CrossEntropyLoss()
OOC = {"budget_fraction": 0.5, "profile_repeats": 0}


def net() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Conv2d(1, 4, 3, padding=1), nn.ReLU(), nn.Conv2d(4, 4, 3, padding=1),
                         nn.ReLU(), nn.Flatten(), nn.Linear(4 * 64, 10))


def data(n: int = 8) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(0)
    return torch.randn(n, 1, 8, 8, generator=g), torch.randint(0, 10, (n,), generator=g)


def steps(backend, model, *shapes: int) -> None:
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for n in shapes:
            backend.forward_backward(model, LOSS, *data(n))


def test_out_of_core_outputs_describe_the_plans_of_one_evaluation():
    backend = OutOfCoreBackend(device="cpu", **OOC)
    assert backend.trial_outputs() == ({}, {})            # nothing ran yet
    model = backend.prepare(net())
    steps(backend, model, 8, 8, 8, 4)                     # two shapes: two plans
    metrics, artifacts = backend.trial_outputs()
    doc = json.loads(artifacts["out_of_core_plan.json"])
    assert [p["input_shape"] for p in doc["plans"]] == [[8, 1, 8, 8], [4, 1, 8, 8]]
    assert [p["micro_batches"] for p in doc["plans"]] == [3, 1]
    main = doc["plans"][0]
    policies = [b["policy"] for b in main["blocks"]]
    assert len(policies) == len(find_blocks(model))
    assert metrics["ooc_swapped_layers"] == policies.count("swap")
    assert metrics["ooc_recomputed_layers"] == policies.count("recompute")
    assert metrics["ooc_resident_layers"] == policies.count("resident") < len(policies)
    assert metrics["ooc_predicted_peak_bytes"] == max(p["predicted_peak_bytes"] for p in doc["plans"])
    assert metrics["ooc_predicted_peak_bytes"] <= metrics["ooc_budget_bytes"] == main["budget_bytes"]
    assert 0 < metrics["ooc_measured_peak_bytes"] <= metrics["ooc_predicted_peak_bytes"]
    assert metrics["ooc_plans"] == 2 and metrics["ooc_profiles"] == 2
    assert metrics["ooc_plan_feasible"] == 1.0
    assert "choice" in artifacts["out_of_core_plan.txt"]
    assert backend.trial_outputs() == ({}, {})            # forgotten once returned
    steps(backend, model, 8)                              # a cached plan: no new profile
    metrics, _ = backend.trial_outputs()
    assert metrics["ooc_plans"] == 1 and metrics["ooc_profiles"] == 0


def test_outputs_belong_to_the_thread_that_evaluated():
    """Concurrent trials (n_jobs > 1) share a backend; each gets its own evaluation's plans."""
    backend = OutOfCoreBackend(device="cpu", **OOC)
    model = backend.prepare(net())
    got = {}

    def other() -> None:
        steps(backend, model, 4)
        got["other"] = backend.trial_outputs()

    steps(backend, model, 8)
    thread = threading.Thread(target=other)
    thread.start()
    thread.join()
    mine = json.loads(backend.trial_outputs()[1]["out_of_core_plan.json"])
    theirs = json.loads(got["other"][1]["out_of_core_plan.json"])
    assert [p["input_shape"][0] for p in mine["plans"]] == [8]
    assert [p["input_shape"][0] for p in theirs["plans"]] == [4]


def test_virtual_node_outputs_add_its_facts_to_the_inner_backends():
    backend = VirtualNodeBackend(virtual_nodes=2, inner="out-of-core", inner_options=OOC,
                                 device="cpu", host=PluginHost())
    assert backend.trial_outputs() == ({}, {})
    model = backend.prepare(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for step in range(3):
            backend.train_step(model, opt, LOSS, *data(8), step)
    metrics, artifacts = backend.trial_outputs()
    assert {k: v for k, v in metrics.items() if k.startswith("vnode_")} == {
        "vnode_virtual_nodes": 2.0, "vnode_world_size": 1.0, "vnode_nproc": 1.0,
        "vnode_steps": 3.0, "vnode_share_rank0": 2.0}
    plans = json.loads(artifacts["out_of_core_plan.json"])["plans"]
    assert [(p["input_shape"][0], p["micro_batches"]) for p in plans] == [(4, 6)]  # per node
    assert metrics["ooc_plans"] == 1.0
    assert backend.trial_outputs() == ({}, {})
    backend.close()


def trial_runs(uri: str, study_name: str) -> tuple[MlflowClient, list]:
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(study_name)
    runs = client.search_runs([exp.experiment_id], max_results=100)
    return client, [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"]


@pytest.mark.slow
def test_out_of_core_plan_is_a_trial_artifact_and_metrics(tmp_path):
    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    study = frugalnas.create_study(
        space="nb201", estimator="train", dataset="digits", backend="out-of-core", seed=0,
        space_options={"N": 1, "C": 4}, backend_options=OOC, study_name="ooc-outputs",
        estimator_options={"epochs": 1, "max_steps": 2},
        plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(2)
    assert study.plugin_state["mlflow"]["errors"] == []
    client, runs = trial_runs(uri, "ooc-outputs")
    by_number = {int(r.data.tags["frugalnas.trial_number"]): r for r in runs}
    for trial in study.trials:
        assert trial.state.name == "COMPLETE"
        metrics = trial.user_attrs["metrics"]
        assert metrics["ooc_swapped_layers"] + metrics["ooc_recomputed_layers"] >= 1
        assert 0 < metrics["ooc_predicted_peak_bytes"] <= metrics["ooc_budget_bytes"]
        assert metrics["ooc_profiles"] >= 1         # each trial reports its own plans
        run = by_number[trial.number]
        assert run.data.metrics["ooc_swapped_layers"] == metrics["ooc_swapped_layers"]
        names = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert {"out_of_core_plan.json", "out_of_core_plan.txt"} <= set(names)
        doc = json.loads(Path(client.download_artifacts(run.info.run_id, "out_of_core_plan.json"))
                         .read_text())
        blocks = doc["plans"][0]["blocks"]
        assert [b["name"] for b in blocks][:2] == ["stem", "cells.0"]
        assert sum(b["policy"] == "swap" for b in blocks) == metrics["ooc_swapped_layers"]
    last = json.loads(Path(client.download_artifacts(
        by_number[study.trials[-1].number].info.run_id, "out_of_core_plan.json")).read_text())
    assert [b["policy"] for b in last["plans"][-1]["blocks"]] == study.backend.last_plan.policies
