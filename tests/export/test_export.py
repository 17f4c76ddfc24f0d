"""``frugalnas export`` / ``frugalnas.export_study``: the chosen trial trained from scratch on
train + validation, measured on the test split, written as state dict, TorchScript,
torch.export and ONNX files that reproduce the module, logged to MLflow as a model linked to
the trial's run (and registered on request); the same weights on every backend layout."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

import frugalnas
from frugalnas import ConfigError
from frugalnas.ports.data import Dataset
from frugalnas.testing import fresh_mlflow_uri
from ops_support.cli_driver import cli_cases

SMALL = {"N": 1, "C": 4}
FAST_TRAIN = {"epochs": 1, "max_steps": 3, "batch_size": 32}
OFF = ["mlflow", "progress"]


def frugalnas_cli(*args, cwd, check=True):
    env = {**os.environ, "FRUGALNAS_PROGRESS": "1"}
    proc = subprocess.run([sys.executable, "-m", "frugalnas.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=900)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.fixture(scope="module")
def tracked(tmp_path_factory):
    """A tiny tracked digits study (3 trained trials) in sqlite stores: (study, storage, uri)."""
    root = tmp_path_factory.mktemp("export-study")
    storage = f"sqlite:///{root / 'optuna.db'}"
    uri = fresh_mlflow_uri(root / "mlflow.db")
    study = frugalnas.create_study(
        space="nb201", estimator="train", dataset="digits", storage=storage, study_name="tiny",
        space_options=SMALL, estimator_options=FAST_TRAIN, seed=0,
        plugin_options={"mlflow": {"tracking_uri": uri}}, disable_plugins=["progress"])
    study.optimize(n_trials=3)
    return study, storage, uri, root


def table_study(objectives=("value",), directions=None, n=8, **kwargs):
    """An in-memory nb201-table study (no training) with ``n`` completed trials: the table
    scores the cells as in the benchmark network (``any_network``), the export trains the
    small network of the chosen cell."""
    kwargs.setdefault("dataset", "digits")
    study = frugalnas.create_study(space="nb201", estimator="nb201-table", space_options=SMALL,
                                   estimator_options={"any_network": True},
                                   objectives=list(objectives),
                                   directions=directions or ["maximize"] * len(objectives),
                                   disable_plugins=OFF, seed=0, **kwargs)
    study.optimize(n_trials=n)
    return study


def state_of(path):
    return torch.load(path, weights_only=True)


# -- the whole path, from Python ------------------------------------------------------------
@pytest.mark.slow
def test_export_tiny_digits_study(tracked, tmp_path):
    import mlflow
    import mlflow.pytorch
    import onnxruntime as ort
    from mlflow import MlflowClient

    study, _, uri, _ = tracked
    out = tmp_path / "best"
    exported = frugalnas.export_study(study, out, epochs=1, train_options={"max_steps": 6},
                                      progress=False)
    best = study.best_trial
    assert exported.trial == best.number and str(exported.architecture) == str(best.architecture)
    for name in ("state_dict.pt", "model.torchscript.pt", "model.pt2", "model.onnx", "report.json"):
        assert (out / name).is_file(), name
    report = json.loads((out / "report.json").read_text())

    # the test accuracy is the module's, on the test split (which search never saw)
    data = study.load_dataset()
    model = study.space.build(exported.architecture, data.num_classes, data.input_shape)
    model.load_state_dict(state_of(out / "state_dict.pt"))
    model.eval()
    with torch.no_grad():
        logits = model(data.test_x)
    accuracy = float((logits.argmax(1) == data.test_y).float().mean() * 100)
    assert report["test_accuracy"] == pytest.approx(accuracy, abs=1e-9)
    assert report["test_examples"] == len(data.test_x) == 359
    assert report["dataset"]["trained_on"] == "train+valid"
    assert report["training"]["steps"] == 6 and report["trial"] == best.number
    assert report["architecture"]["text"] == str(best.architecture)
    assert report["params"] == sum(p.numel() for p in model.parameters()) and report["flops"] > 0
    assert report["latency"]["torch"]["median_ms"] > 0
    assert report["latency"]["onnxruntime"]["median_ms"] > 0
    assert {"torch", "onnx", "onnxruntime", "mlflow", "frugalnas"} <= set(report["versions"])
    assert report["search"]["objectives"]["value"] == pytest.approx(best.values[0])

    # TorchScript, torch.export and ONNX outputs agree with the trained module
    x = data.test_x[:50]
    with torch.no_grad():
        want = model(x)
        ts = torch.jit.load(str(out / "model.torchscript.pt"))(x)
        ep = torch.export.load(str(out / "model.pt2")).module()(x)
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    onnx_out = torch.from_numpy(session.run(None, {session.get_inputs()[0].name: x.numpy()})[0])
    for got in (ts, ep, onnx_out):
        torch.testing.assert_close(got, want, atol=1e-4, rtol=1e-4)
    assert session.get_inputs()[0].name == "input"
    one = session.run(None, {"input": x[:1].numpy()})[0]  # dynamic batch axis
    assert one.shape == (1, data.num_classes)
    assert report["onnx_test_accuracy"] == pytest.approx(report["test_accuracy"], abs=0.3)

    # MLflow: a LoggedModel in the study's experiment, linked to the trial's run, that loads
    # back and predicts the same
    info = report["mlflow"]
    client = MlflowClient(tracking_uri=uri)
    run = client.get_run(info["run_id"])
    assert run.data.tags["frugalnas.trial_number"] == str(best.number)
    assert run.info.experiment_id == client.get_experiment_by_name(study.name).experiment_id
    logged = client.get_logged_model(info["model_id"])
    assert logged.source_run_id == info["run_id"] and logged.experiment_id == run.info.experiment_id
    assert str(logged.status).upper().endswith("READY")
    assert any(m.key == "test_accuracy" for m in logged.metrics or [])
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        loaded = mlflow.pytorch.load_model(info["model_uri"])
        pyfunc = mlflow.pyfunc.load_model(info["model_uri"])
    finally:
        mlflow.set_tracking_uri(previous)
    with torch.no_grad():
        torch.testing.assert_close(loaded(x), want, atol=1e-6, rtol=1e-6)
    assert pyfunc.metadata.signature is not None
    assert np.allclose(pyfunc.predict(x.numpy()), want.numpy(), atol=1e-5)
    # the trial's run is left as it was (finished)
    assert run.info.status == "FINISHED"


# -- the command line ------------------------------------------------------------------------
@pytest.mark.slow
def test_cli_export_registers_and_report_prints_the_leaderboard(tracked, tmp_path):
    from mlflow import MlflowClient

    study, storage, uri, root = tracked
    trial = study.completed_trials()[0].number
    out = tmp_path / "cli"
    proc = frugalnas_cli("export", "--storage", storage, "--study-name", "tiny", "--out", str(out),
                         "--trial", str(trial), "--epochs", "1", "-o", "train.max_steps=4",
                         "--format", "onnx", "--register", "tiny-digits", "--no-latency",
                         cwd=root)
    assert f"trial {trial} (rank 1)" in proc.stdout and "registered as 'tiny-digits' version 1" \
        in proc.stdout
    assert "export trial" in proc.stderr  # the progress bar
    # what it trains, before the bar: the search's scores are not a trained network
    assert f"export trial {trial}: training nb201:" in proc.stderr and "from scratch" in proc.stderr
    assert sorted(p.name for p in out.iterdir()) == ["model.onnx", "report.json", "state_dict.pt"]
    report = json.loads((out / "report.json").read_text())
    assert report["trial"] == trial and report["selection"] == "trial"
    assert report["training"]["steps"] == 4 and report["latency"] is None
    client = MlflowClient(tracking_uri=uri)
    versions = client.search_model_versions("name = 'tiny-digits'")
    assert [str(v.version) for v in versions] == ["1"]
    assert versions[0].source == report["mlflow"]["model_uri"]

    # errors: one line, exit 2, naming the valid choices; then the leaderboard (these three
    # command lines run in one interpreter: ops_support.cli_driver)
    html = tmp_path / "board.html"
    bad_trial, bad_study, board = cli_cases([
        ["export", "--storage", storage, "--study-name", "tiny", "--out", str(tmp_path / "x"),
         "--trial", "99"],
        ["export", "--storage", storage, "--study-name", "nope", "--out", str(tmp_path / "x")],
        ["report", "--storage", storage, "--study-name", "tiny", "--html", str(html),
         "--mlflow-url", "http://127.0.0.1:5000"]],
        root, env={**os.environ, "FRUGALNAS_PROGRESS": "1"}, timeout=900)
    assert bad_trial["rc"] == 2 and bad_trial["err"].count("\n") == 1
    assert "trial 99 of study 'tiny' does not exist; completed trials: 0-2" in bad_trial["err"]
    assert bad_study["rc"] == 2 and "no study named 'nope'" in bad_study["err"]
    assert "tiny" in bad_study["err"]
    assert not (tmp_path / "x").exists()

    assert board["rc"] in (0, None), board
    lines = board["out"]
    assert "study tiny: 3 of 3 completed trial(s)" in lines
    for t in study.completed_trials():
        assert str(t.architecture) in lines.replace("\n", "").replace(" ", "").replace("│", "") \
            or str(t.architecture)[:40] in lines
    text = html.read_text()
    assert text.count("<tr") == 4 and "http://127.0.0.1:5000/#/experiments/" in text
    assert str(study.best_trial.architecture).replace(">", "&gt;") in text


# -- backends ------------------------------------------------------------------------------------
@pytest.mark.slow
def test_virtual_node_export_is_bitwise_the_same_with_two_processes(tmp_path):
    study = table_study(n=2, backend="virtual-node", backend_options={"virtual_nodes": 2})
    kwargs = dict(epochs=1, train_options={"max_steps": 3, "batch_size": 32}, formats=(),
                  latency=False, progress=False)
    one = frugalnas.export_study(study, tmp_path / "one", **kwargs)
    two = frugalnas.export_study(study, tmp_path / "two", backend_options={"nproc": 2}, **kwargs)
    a, b = state_of(tmp_path / "one" / "state_dict.pt"), state_of(tmp_path / "two" / "state_dict.pt")
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), k
    assert two.report["training"]["backend"]["options"]["nproc"] == 2
    assert two.report["training"]["backend_metrics"]["vnode_nproc"] == 2
    assert one.test_accuracy == two.test_accuracy


@pytest.mark.slow
def test_out_of_core_export_trains_the_same_network(tmp_path):
    common = dict(epochs=1, train_options={"max_steps": 3, "batch_size": 32}, formats=("onnx",),
                  latency=False, progress=False)
    ooc = table_study(n=1, backend="out-of-core",
                      backend_options={"budget_fraction": 0.5, "profile_repeats": 0})
    plain = table_study(n=1)
    assert str(ooc.best_trial.architecture) == str(plain.best_trial.architecture)
    a = frugalnas.export_study(ooc, tmp_path / "ooc", **common)
    b = frugalnas.export_study(plain, tmp_path / "plain", **common)
    sa, sb = state_of(tmp_path / "ooc" / "state_dict.pt"), state_of(tmp_path / "plain" / "state_dict.pt")
    for k in sa:
        torch.testing.assert_close(sa[k], sb[k], atol=1e-5, rtol=1e-5)
    assert a.report["checks"]["onnx"]["max_abs_diff"] <= 1e-4
    assert any(k.startswith("backend:") for k in a.files)  # the out-of-core plan


# -- choosing the trial; refusing what cannot be exported ------------------------------------
def test_selection_best_top_trial_and_errors():
    from frugalnas.export import select_trials

    study = table_study(n=6)
    ranked = sorted(study.completed_trials(), key=lambda t: (-t.values[0], t.number))
    assert [t.number for t in select_trials(study)] == [ranked[0].number]
    assert [t.number for t in select_trials(study, top=3)] == [t.number for t in ranked[:3]]
    assert [t.number for t in select_trials(study, trial=ranked[-1].number)] == [ranked[-1].number]
    cases = [({"trial": 42}, "trial 42 of study '" + study.name + "' does not exist; completed "
              "trials: 0-5"),
             ({"trial": 1, "top": 2}, "one of trial, top, pareto or constraint; got trial, top"),
             ({"top": 0}, "invalid top 0"),
             ({"pareto": 0}, "pareto applies to a study with several objectives"),
             ({"constraint": "params<=1"}, "no completed trial of study"),
             ({"constraint": "nonsense<=1"}, "unknown quantity 'nonsense'"),
             ({"constraint": "params=<1"}, "malformed constraint")]
    for kwargs, fragment in cases:
        with pytest.raises(ConfigError) as err:
            select_trials(study, **kwargs)
        assert fragment in str(err.value) and "\n" not in str(err.value)


def test_two_objectives_pareto_and_constraint():
    from frugalnas.export import select_trials
    from frugalnas.export.select import pareto_choices

    study = table_study(objectives=("value", "params"), directions=["maximize", "minimize"], n=10)
    front = pareto_choices(study)
    assert [t.values[0] for t in front] == sorted((t.values[0] for t in front), reverse=True)
    assert select_trials(study, pareto=len(front) - 1)[0].number == front[-1].number
    with pytest.raises(ConfigError) as err:
        select_trials(study)
    assert "2 objectives" in str(err.value) and "--pareto I" in str(err.value)
    assert f"trial {front[0].number} (value=" in str(err.value)
    with pytest.raises(ConfigError) as err:
        select_trials(study, pareto=len(front))
    assert f"invalid Pareto choice {len(front)}" in str(err.value)
    assert f"valid: 0-{len(front) - 1}:" in str(err.value)
    limit = sorted(t.values[1] for t in study.completed_trials())[3]
    chosen = select_trials(study, constraint=f"params<={limit}")[0]
    ok = [t for t in study.completed_trials() if t.values[1] <= limit]
    assert chosen.values[0] == max(t.values[0] for t in ok) and chosen.values[1] <= limit
    assert len(select_trials(study, top=3)) == 3


def test_export_refuses_what_it_cannot_measure(tmp_path):
    no_test = table_study(n=1, dataset_options={"test_fraction": 0})
    with pytest.raises(ConfigError, match="has no test split"):
        frugalnas.export_study(no_test, tmp_path / "a", formats=(), progress=False)
    no_data = table_study(n=1, dataset=None)
    with pytest.raises(ConfigError, match=r"has no dataset.*dataset="):
        frugalnas.export_study(no_data, tmp_path / "b", formats=(), progress=False)
    with pytest.raises(ConfigError, match="needs MLflow tracking"):
        frugalnas.export_study(no_data, tmp_path / "c", register="x", dataset="digits")
    with pytest.raises(ConfigError, match="unknown export format 'tflite'"):
        frugalnas.export_study(no_data, tmp_path / "d", formats=["tflite"])
    with pytest.raises(ConfigError, match="unknown training option 'epoch'"):
        frugalnas.export_study(no_data, tmp_path / "e", train_options={"epoch": 3},
                               dataset="digits")
    assert not any((tmp_path / n).exists() for n in "abcde")


def test_top_k_exports_each_into_its_folder(tmp_path):
    study = table_study(n=4)
    results = frugalnas.export_study(study, tmp_path, top=2, epochs=1, formats=(),
                                     train_options={"max_steps": 2}, latency=False,
                                     progress=False)
    ranked = [t.number for t in frugalnas.export.select_trials(study, top=2)]
    assert [r.trial for r in results] == ranked and [r.rank for r in results] == [1, 2]
    index = json.loads((tmp_path / "index.json").read_text())
    assert [e["folder"] for e in index] == [f"rank{i + 1}-trial{n}" for i, n in enumerate(ranked)]
    for r in results:
        assert (r.out / "state_dict.pt").is_file() and (r.out / "report.json").is_file()
        assert r.report["selection"] == "top 2" and r.report["mlflow"] is None
        assert 0 <= r.test_accuracy <= 100 and r.report["test_examples"] == 359
    single = frugalnas.export_study(study, tmp_path / "one", top=1, epochs=1, formats=(),
                                    train_options={"max_steps": 2}, latency=False, progress=False)
    assert single.trial == ranked[0] and (tmp_path / "one" / "report.json").is_file()


class ModelLogger:
    """A plugin that logs exported networks (as the mlflow plugin does) and links trials."""

    __name__ = "model-logger"

    def __init__(self):
        self.exported = []

    @frugalnas.hookimpl
    def frugalnas_model_exported(self, study, exported):
        self.exported.append(exported)
        return {"trial": exported.trial, "registered": exported.register}

    @frugalnas.hookimpl
    def frugalnas_trial_links(self, study, base_url):
        return {t.number: f"{base_url}/t{t.number}" for t in study.completed_trials()}


def test_exported_networks_go_to_the_plugins_that_log_models(tmp_path):
    from frugalnas.export.exporter import trial_links

    logger = ModelLogger()
    study = table_study(n=2, plugins=[logger])
    result = frugalnas.export_study(study, tmp_path, epochs=1, formats=(), latency=False,
                                    train_options={"max_steps": 2}, register="tiny",
                                    progress=False)
    (exported,) = logger.exported
    assert exported.trial == result.trial and exported.architecture == str(result.architecture)
    assert exported.register == "tiny" and exported.tracking_uri is None
    assert exported.metrics["test_accuracy"] == result.test_accuracy
    assert [p.name for p in exported.files] == ["report.json"] and exported.model is result.model
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["model-logger"] == {"trial": result.trial, "registered": "tiny"}
    assert report["mlflow"] is None and result.model_uri is None  # the mlflow plugin is off
    assert trial_links(study, "http://ui") == {t.number: f"http://ui/t{t.number}"
                                               for t in study.completed_trials()}
    assert trial_links(table_study(n=1), "http://ui") is None  # nobody links trials


# -- search never reads the test split ---------------------------------------------------------
class PoisonedTestSplit:
    """A dataset plugin: digits whose test split is NaN images with impossible labels (or
    clean, to compare)."""

    def __init__(self, poisoned: bool):
        self.poisoned = poisoned

    @frugalnas.hookimpl
    def frugalnas_datasets(self):
        from dataclasses import replace

        from frugalnas.datasets.images import digits

        def test_digits(seed: int = 0) -> Dataset:
            """digits with a poisoned test split"""
            ds = digits(seed=seed)
            if self.poisoned:
                ds = replace(ds, test_x=torch.full_like(ds.test_x, float("nan")),
                             test_y=torch.full_like(ds.test_y, 10 ** 6))
            return ds
        return {"test-digits": test_digits}


@pytest.mark.parametrize("estimator, options", [
    ("train", {"epochs": 1, "max_steps": 2, "batch_size": 32}),
    ("low-fidelity", {"epochs": 1, "max_steps": 2, "subset": 0.5}),
    ("jacob_cov", {}),
])
def test_estimators_never_read_the_test_split(estimator, options):
    values = []
    for poisoned in (False, True):
        study = frugalnas.create_study(space="nb201", estimator=estimator, dataset="test-digits",
                                       space_options=SMALL, estimator_options=options, seed=0,
                                       plugins=[PoisonedTestSplit(poisoned)], disable_plugins=OFF)
        study.optimize(n_trials=2)
        assert len(study.completed_trials()) == 2
        values.append([(t.values, t.user_attrs.get("metrics")) for t in study.completed_trials()])
    assert values[0] == values[1]
