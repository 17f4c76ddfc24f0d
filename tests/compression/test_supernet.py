"""Supernet training before the search: sub-networks drawn in the budget's band, every one
distilled from the frozen parent through the one training loop, the trained weights searched
and distilled from, and the stage resumed or redone as its options say."""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import torch

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.compression.checkpoint import read_checkpoint, save_checkpoint
from frugalnas.compression.distill import LogitDistillation
from frugalnas.compression.importance import measure, reorder
from frugalnas.compression.pipeline import compress
from frugalnas.compression.space import SubnetSpace
from frugalnas.compression.supernet import (BandSampler, MeanDistillation, SupernetConfig,
                                            train_supernet)
from frugalnas.datasets.text import SAMPLE, TextSource
from frugalnas.engine.study import load_study
from frugalnas.ports.errors import ConfigError

CONTEXT = 32

FAST = dict(trials=3, calibration_batches=2, valid_examples=16, context=CONTEXT,
            distill={"tokens": 2 * 16 * CONTEXT}, progress=False, onnx=False,
            tracking=False)


def _band(space: SubnetSpace, low: float, high: float) -> BandSampler:
    return BandSampler(space, low, high, seed=3)


def test_sampled_subnetworks_lie_in_the_band_and_repeat_per_step(parent: Path) -> None:
    space = SubnetSpace(str(parent))
    full = space.parent().non_embedding_params()
    sampler = _band(space, 0.25 * full, 0.5 * full)
    shapes = [shape for step in range(6) for shape in sampler.shapes(step, 3)]
    sizes = [space.parent().non_embedding_params(s.subnet()) for s in shapes]
    assert all(0.25 * full <= n <= 0.5 * full for n in sizes), sizes
    assert len(set(shapes)) > 1   # not one network over and over
    assert sampler.shapes(4, 3) == _band(space, 0.25 * full, 0.5 * full).shapes(4, 3)


def test_an_empty_band_is_named(parent: Path) -> None:
    space = SubnetSpace(str(parent))
    with pytest.raises(ConfigError, match="between 1 and 2 non-embedding parameters"):
        _band(space, 1, 2).draw(random.Random(0))


def test_the_sandwich_loss_is_the_mean_of_each_networks_distillation() -> None:
    torch.manual_seed(0)
    stacked, parent = torch.randn(2, 3, 5, 11), torch.randn(2, 5, 11)
    each = [LogitDistillation(2.0)(stacked[:, i], parent) for i in range(3)]
    assert MeanDistillation(2.0)(stacked, parent) == pytest.approx(float(sum(each) / 3))


@pytest.mark.parametrize("bad, message", [({"tokens": -1}, "tokens"),
                                          ({"samples": 0}, "samples"),
                                          ({"largest": "yes"}, "largest")])
def test_bad_supernet_options_are_refused(bad: dict[str, object], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        SupernetConfig(**bad)  # type: ignore[arg-type]


def _divergence(model: torch.nn.Module, parent: torch.nn.Module, shapes: list,
                x: torch.Tensor) -> float:
    with torch.no_grad():
        return sum(float(LogitDistillation()(model(x, s.subnet()), parent(x)))
                   for s in shapes) / len(shapes)


def test_supernet_training_brings_the_bands_subnetworks_closer_to_the_parent(
        parent: Path, tmp_path: Path) -> None:
    model, _ = read_checkpoint(parent)
    data = TextSource.open(None, context=CONTEXT)
    x = [b for b, _ in zip(data.batches("train", 8, seed=0), range(2))]
    reorder(model, measure(model, [b for b, _ in x], "activation"))
    space = SubnetSpace(str(save_checkpoint(model, tmp_path / "ordered")))
    full = model.non_embedding_params()
    sampler = _band(space, 0.2 * full, 0.5 * full)
    held_out = [s for step in range(100, 104) for s in sampler.shapes(step, 1)]
    supernet = copy.deepcopy(model)
    valid = data.head("valid", 16)[0]
    before = _divergence(supernet.eval(), model.eval(), held_out, valid)
    config = SupernetConfig(tokens=30 * 16 * CONTEXT, lr=1e-3)
    report = train_supernet(supernet, model, sampler, data, SingleDeviceBackend("cpu"),
                            config, seed=0)
    assert report.steps == 30
    after = _divergence(supernet.eval(), model.eval(), held_out, valid)
    assert after < 0.8 * before, (before, after)
    # the parent taught; it did not learn
    again, _ = read_checkpoint(tmp_path / "ordered")
    assert all(torch.equal(a, b) for a, b in zip(again.state_dict().values(),
                                                 model.state_dict().values()))


def test_compress_searches_the_trained_supernet_and_resumes_or_redoes_it(
        parent: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    supernet = {"tokens": 4 * 16 * CONTEXT, "samples": 2}
    result = compress(parent, SAMPLE, budget="params=0.5", out=out, supernet=supernet, **FAST)
    assert result.seconds["supernet"] > 0
    study = load_study(study_name="compress", storage=f"sqlite:///{out / 'search.db'}")
    assert Path(study.config.space_options["parent"]) == out / "supernet"
    trained, about = read_checkpoint(out / "supernet")
    ordered, _ = read_checkpoint(out / "ordered")
    assert about["supernet"]["tokens"] == supernet["tokens"]
    assert not torch.equal(trained.head.weight, ordered.head.weight)
    stamp = (out / "supernet" / "model.pt").stat().st_mtime_ns
    again = compress(parent, SAMPLE, budget="params=0.5", out=out, supernet=supernet,
                     **{**FAST, "trials": 4})
    assert (out / "supernet" / "model.pt").stat().st_mtime_ns == stamp
    assert again.shape is not None
    assert len(load_study(study_name="compress",
                          storage=f"sqlite:///{out / 'search.db'}").trials) == 4
    # other supernet options: trained again, and the search made on the old weights dropped
    compress(parent, SAMPLE, budget="params=0.5", out=out,
             supernet={**supernet, "samples": 1}, **FAST)
    assert read_checkpoint(out / "supernet")[1]["supernet"]["samples"] == 1
    assert len(load_study(study_name="compress",
                          storage=f"sqlite:///{out / 'search.db'}").trials) == 3


def test_unknown_supernet_options_are_named(parent: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown supernet option.*token; valid: tokens"):
        compress(parent, SAMPLE, out=tmp_path, supernet={"token": 5})
