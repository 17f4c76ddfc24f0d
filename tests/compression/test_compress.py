"""frugalnas.compression / ``frugalnas compress``: a trained model in, a smaller one out, on real
text, with the real study, storage, training loop and exporters."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from frugalnas.compression.budget import parse_budget
from frugalnas.compression.distill import LogitDistillation
from frugalnas.compression.checkpoint import CONFIG_FILE, read_checkpoint, save_checkpoint
from frugalnas.compression.pipeline import compress
from frugalnas.compression.space import Shape, inference_mib
from frugalnas.datasets.text import SAMPLE, TextSource
from frugalnas.engine.study import load_study
from frugalnas.nn.transformer import ElasticGPT
from frugalnas.ports.errors import ConfigError
from frugalnas.spaces.gpt.network import gpt_init

CONTEXT = 32
FAST = dict(trials=4, calibration_batches=2, valid_examples=16, context=CONTEXT,
            distill={"tokens": 4 * 16 * CONTEXT}, progress=False)


@pytest.fixture(scope="module")
def wide_parent(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level GPT wide and deep enough that its ONNX Runtime latency follows its size
    (a tiny network's is mostly per-call overhead); fresh weights: latency does not need
    training."""
    torch.manual_seed(0)
    model = gpt_init(ElasticGPT(256, 192, 4, 6, 32, 768, CONTEXT))
    return save_checkpoint(model, tmp_path_factory.mktemp("wide"),
                           {"text": {"tokenizer": "bytes"}})


def test_checkpoint_round_trip_keeps_weights_and_layer_order(tmp_path: Path) -> None:
    model = ElasticGPT(256, 32, 3, 2, 16, 64, 16, norm="rmsnorm", gated=True)
    model.set_layer_order([2, 0, 1])
    save_checkpoint(model, tmp_path, {"note": "x"})
    back, about = read_checkpoint(tmp_path)
    assert back.layer_order == (2, 0, 1) and back.config == model.config
    assert about == {"note": "x"}
    x = torch.randint(0, 256, (2, 16))
    assert torch.equal(back(x), model.eval()(x))


def test_a_checkpoint_with_an_unknown_field_is_refused_in_one_line(tmp_path: Path) -> None:
    save_checkpoint(ElasticGPT(256, 32, 1, 2, 16, 64, 16), tmp_path)
    meta = json.loads((tmp_path / CONFIG_FILE).read_text())
    meta["config"]["widht"] = 3
    (tmp_path / CONFIG_FILE).write_text(json.dumps(meta))
    with pytest.raises(ConfigError, match="unknown config field.*widht; valid: vocab_size") as exc:
        read_checkpoint(tmp_path)
    assert "\n" not in str(exc.value)


@pytest.mark.parametrize("text, message", [
    ("params", "expected KIND=VALUE"), ("flops=0.5", "KIND one of params"),
    ("params=half", "expected a number"), ("params=0", "above 0")])
def test_bad_budgets_are_refused(text: str, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        parse_budget(text)


def test_compress_meets_the_budget_and_resumes(parent: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = compress(parent, SAMPLE, budget="params=0.5", out=out, **FAST)
    assert result.child_params <= 0.5 * result.parent_params
    assert result.parent_params == ElasticGPT.non_embedding_params(read_checkpoint(parent)[0])
    child, about = read_checkpoint(result.model)
    assert child.non_embedding_params() == result.child_params
    assert (result.shape.width, result.shape.depth) == (child.max_width, child.max_depth)
    assert result.onnx is not None and result.onnx.is_file()
    report = json.loads((out / "report.json").read_text())
    assert report["child_loss"] == pytest.approx(result.child_loss)
    assert set(report["latency_ms"]) == {"parent", "child"}
    # the distilled child is the written model
    written, _ = read_checkpoint(out / "child")
    x = torch.randint(0, 256, (2, CONTEXT))
    assert torch.equal(child(x), written(x))
    # a second run with more trials runs only the new ones and reuses the ordered parent
    ordered_mtime = (out / "ordered" / "model.pt").stat().st_mtime_ns
    again = compress(parent, SAMPLE, budget="params=0.5", out=out, **{**FAST, "trials": 6})
    study = load_study(study_name="compress", storage=f"sqlite:///{out / 'search.db'}")
    assert len(study.trials) == 6
    assert (out / "ordered" / "model.pt").stat().st_mtime_ns == ordered_mtime
    assert again.parent_loss == pytest.approx(result.parent_loss)


def _divergence(out: Path, x: torch.Tensor) -> float:
    """KL divergence from the (reordered) parent's next-token distribution to the child's."""
    parent, _ = read_checkpoint(out / "ordered")
    child, _ = read_checkpoint(out / "model")
    with torch.no_grad():
        return float(LogitDistillation()(child(x), parent(x)))


@pytest.mark.slow
def test_distillation_brings_the_child_closer_to_the_parent(parent: Path,
                                                            tmp_path: Path) -> None:
    runs = {}
    for name, distill in (("pruned", {"tokens": 0}),
                          ("distilled", {"tokens": 30 * 16 * CONTEXT, "lr": 1e-3}),
                          ("next-token", {"tokens": 30 * 16 * CONTEXT, "lr": 1e-3,
                                          "loss": "next-token"})):
        runs[name] = compress(parent, SAMPLE, budget="params=0.3", out=tmp_path / name,
                              **{**FAST, "distill": distill, "onnx": False})
    assert runs["distilled"].shape == runs["pruned"].shape == runs["next-token"].shape
    x = TextSource.open(None, context=CONTEXT).head("valid", 8)[0]
    assert _divergence(tmp_path / "distilled", x) < 0.8 * _divergence(tmp_path / "pruned", x)
    assert runs["next-token"].child_loss < runs["pruned"].child_loss


def test_a_budget_no_subnetwork_meets_fails_before_distillation(parent: Path,
                                                                tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no sub-network under params=10"):
        compress(parent, SAMPLE, budget="params=10", out=tmp_path, **FAST)
    assert not (tmp_path / "child").exists()


def test_unknown_options_are_named(parent: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown compress option.*trails; valid: importance"):
        compress(parent, SAMPLE, out=tmp_path, trails=3)


def _cli(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "frugalnas.cli.main", "compress", *args],
                          capture_output=True, text=True, timeout=600)


def test_cli_errors_are_one_line(tmp_path: Path) -> None:
    run = _cli(str(tmp_path), "--data", str(SAMPLE), "--out", str(tmp_path / "o"))
    assert run.returncode == 2
    assert run.stderr.strip().count("\n") == 0
    assert "is neither a frugalnas checkpoint folder" in run.stderr
    assert "Traceback" not in run.stderr


def test_a_latency_budget_is_met_as_the_search_measured_it(wide_parent: Path,
                                                           tmp_path: Path) -> None:
    out = tmp_path / "out"
    # six trials: a short search on a busy machine may time all four anchors above the bound
    result = compress(wide_parent, SAMPLE, budget="latency=0.7", out=out,
                      **{**FAST, "onnx": False, "distill": {"tokens": 0}, "trials": 6})
    report = json.loads((out / "report.json").read_text())
    assert report["budget"] == "latency=0.7"
    assert set(result.latency_ms) == {"parent", "child"}
    study = load_study(study_name="compress", storage=f"sqlite:///{out / 'search.db'}")
    assert study.config.constraints == {"latency_ms": pytest.approx(report["bound"], rel=0.5)}
    feasible = study.feasible_trials()
    bound = study.config.constraints["latency_ms"]
    measured = [t.frozen.user_attrs["metrics"]["latency_ms"] for t in study.completed_trials()]
    assert len(measured) == len(study.completed_trials()) and all(m > 0 for m in measured)
    # the chosen candidate: the best feasible one whose latency holds when measured again
    chosen = [t for t in feasible if study.space.shape(t.architecture) == result.shape]
    assert chosen and chosen[0].frozen.user_attrs["metrics"]["latency_ms"] <= bound


def test_the_search_and_the_result_are_in_mlflow(parent: Path, tmp_path: Path) -> None:
    import mlflow

    out = tmp_path / "out"
    result = compress(parent, SAMPLE, out=out, **{**FAST, "onnx": False})
    client = mlflow.MlflowClient(tracking_uri=f"sqlite:///{out / 'mlflow.db'}")
    experiment = client.get_experiment_by_name("compress")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    assert len(parents) == 1 and len(runs) == 1 + FAST["trials"]
    metrics = parents[0].data.metrics
    assert metrics["child_valid_loss"] == pytest.approx(result.child_loss)
    assert metrics["parent_non_embedding_params"] == result.parent_params
    assert metrics["child_latency_ms"] > 0


def test_candidates_scored_by_a_short_fine_tuning(parent: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    result = compress(parent, SAMPLE, out=out, estimator="train",
                      estimator_options={"max_steps": 2, "batch_size": 8, "valid_examples": 8,
                                         "optimizer": "adam", "lr": 1e-4},
                      **{**FAST, "onnx": False, "tracking": False, "distill": {"tokens": 0}})
    study = load_study(study_name="compress", storage=f"sqlite:///{out / 'search.db'}")
    assert study.config.estimator == "combined"
    done = study.completed_trials()
    assert len(done) == FAST["trials"]
    for trial in done:   # the value is the fine-tuned loss; the budget's metric is there too
        metrics = trial.frozen.user_attrs["metrics"]
        assert trial.values[0] == pytest.approx(metrics["valid_loss"])
        assert metrics["non_embedding_params"] > 0 and metrics["train_loss"] > 0
        assert metrics["inherited_loss"] > 0
    assert result.child_params <= 0.5 * result.parent_params


def test_a_latency_search_resumes_with_the_bound_it_started_with(wide_parent: Path,
                                                                tmp_path: Path) -> None:
    options = {**FAST, "onnx": False, "tracking": False, "distill": {"tokens": 0}, "trials": 3}
    compress(wide_parent, SAMPLE, budget="latency=0.8", out=tmp_path, **options)
    bound = json.loads((tmp_path / "report.json").read_text())["bound"]
    compress(wide_parent, SAMPLE, budget="latency=0.8", out=tmp_path,
             **{**options, "trials": 4})
    study = load_study(study_name="compress", storage=f"sqlite:///{tmp_path / 'search.db'}")
    assert len(study.trials) == 4
    assert study.config.constraints["latency_ms"] == pytest.approx(bound)


def _bytes_of(model: torch.nn.Module) -> int:
    unique = {id(p): p for p in model.parameters()}   # a tied head counted once
    return sum(p.numel() * p.element_size() for p in unique.values())


@pytest.mark.parametrize("shape", [
    dict(), dict(positions="rotary", tie_weights=True),
    dict(positions="rotary", kv_heads=2, norm="rmsnorm", gated=True, bias=False)])
def test_inference_memory_is_the_written_weights_and_one_blocks_cache(shape) -> None:
    model = ElasticGPT(256, 64, 3, 4, 16, 192, CONTEXT, **shape)
    sub = Shape(48, 2, 2, 96).subnet()
    for config in (None, sub):
        dense = model.export(config)
        heads = 4 if config is None else 2
        kv_heads = len(dense.blocks) * heads // model.config.group
        cache = 2 * kv_heads * 16 * CONTEXT * 4
        assert inference_mib(model, config) * 2 ** 20 == _bytes_of(dense) + cache


def test_a_memory_budget_bounds_the_child_as_written(parent: Path, tmp_path: Path) -> None:
    result = compress(parent, SAMPLE, budget="memory=0.7", out=tmp_path,
                      **{**FAST, "onnx": False, "tracking": False, "distill": {"tokens": 0}})
    report = json.loads((tmp_path / "report.json").read_text())
    written, _ = read_checkpoint(result.model)
    assert report["bound"] == pytest.approx(0.7 * result.memory_mib["parent"])
    assert result.memory_mib["child"] == pytest.approx(inference_mib(written))
    assert result.memory_mib["child"] <= report["bound"] and report["meets_budget"]
    study = load_study(study_name="compress", storage=f"sqlite:///{tmp_path / 'search.db'}")
    assert study.config.constraints == {"memory_mib": pytest.approx(report["bound"])}
    for trial in study.completed_trials():
        assert trial.frozen.user_attrs["metrics"]["memory_mib"] == pytest.approx(
            study.space.memory_mib(trial.architecture))


def test_a_training_free_search_maximises_a_proxy(parent: Path, tmp_path: Path) -> None:
    result = compress(parent, SAMPLE, out=tmp_path, estimator="decoder_params",
                      direction="maximize",
                      **{**FAST, "onnx": False, "tracking": False, "distill": {"tokens": 0}})
    study = load_study(study_name="compress", storage=f"sqlite:///{tmp_path / 'search.db'}")
    assert study.directions == ["maximize"]
    best = max(study.feasible_trials(), key=lambda t: t.values[0])
    assert study.space.shape(best.architecture) == result.shape
    with pytest.raises(ConfigError, match="inherited-loss.*scores a loss"):
        compress(parent, SAMPLE, out=tmp_path / "x", direction="maximize")
