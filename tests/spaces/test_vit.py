"""The ``vit`` space: its decisions (a patch size, then per layer), text form, networks,
supernet and capabilities on real torch modules, and studies on real image data."""

from __future__ import annotations

import random

import numpy as np
import optuna
import pytest
import torch

import frugalnas
from frugalnas.nn.transformer import BlockChoice, SubnetConfig
from frugalnas.nn.vision_transformer import DenseViT, ElasticViT, ViTSubnet
from frugalnas.nn.weight_store import WeightStore
from frugalnas.ports.capabilities import (OwnEncodings, ProgressiveShrinking, SandwichRule,
                                          WeightSharing, capability)
from frugalnas.ports.errors import ArchitectureParseError, ConfigError
from frugalnas.spaces.stack.space import DEPTH_KEY, WIDTH_KEY, layer_keys
from frugalnas.spaces.vit.space import PATCH_KEY, ViTSpace
from frugalnas.testing.setups import SMALL_VIT

SMALL = SMALL_VIT
SPACE = ViTSpace(**SMALL)
DIGITS = (1, 8, 8)
OFF = {"disable_plugins": ("mlflow", "progress")}


def test_text_form_round_trips_and_the_largest_network_has_the_smallest_patch():
    arch = SPACE.parse("vit:p4w32/h2r4")
    assert arch.decisions == {PATCH_KEY: 4, WIDTH_KEY: 32, DEPTH_KEY: 1, "layer0_heads": 2,
                              "layer0_mlp_ratio": 4}
    assert str(arch) == "vit:p4w32/h2r4"
    for seed in range(20):
        sampled = SPACE.sample(random.Random(seed))
        assert SPACE.parse(str(sampled)) == sampled
        assert all(k not in sampled.decisions for i in range(sampled[DEPTH_KEY], 2)
                   for k in layer_keys(i))
    assert str(SPACE.largest()) == "vit:p2w32/h2r4,h2r4"
    assert str(SPACE.smallest()) == "vit:p4w16/h1r2"
    assert SPACE.size() == 2 * 2 * (4 + 16)


def test_bad_architectures_options_and_images_are_refused_in_one_line():
    for text, needle in (("vit:p3w16/h1r2", PATCH_KEY), ("vit:w16/h1r2", "malformed vit"),
                         ("vit:p2w16/h1r2,h1r2,h1r2", "depth"), ("vit:p2w16/x", "malformed layer")):
        with pytest.raises(ArchitectureParseError, match=needle) as info:
            SPACE.parse(text)
        assert "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="patch_sizes"):
        ViTSpace(patch_sizes=[0])
    with pytest.raises(ConfigError, match=r"patch sizes \[4\] .* side 6; valid: \[1, 2, 3, 6\]"):
        SPACE.build(SPACE.smallest(), 10, (1, 6, 6))
    with pytest.raises(ConfigError, match="square images"):
        SPACE.build(SPACE.smallest(), 10, (32,))


def test_a_supernet_network_computes_what_its_stand_alone_export_computes():
    torch.manual_seed(0)
    builder = capability(SPACE, WeightSharing).shared_builder(10, DIGITS)
    store = WeightStore(builder.factory)
    x = torch.randn(3, *DIGITS)
    for seed in range(6):
        arch = SPACE.sample(random.Random(seed))
        active = builder.subnet(arch, store.get).eval()
        dense = active.export().eval()
        assert isinstance(dense, DenseViT)
        assert torch.equal(active(x), dense(x))
        y = x
        for stage in dense.forward_blocks():   # the stages chain to the whole
            y = stage(y)
        assert torch.equal(y, dense(x))
        # a network built alone has the same shape and parameter count
        alone = SPACE.build(arch, 10, DIGITS)
        assert [p.shape for p in alone.parameters()] == [p.shape for p in dense.parameters()]


def test_every_patch_size_has_its_own_projection_and_positions_and_shares_the_blocks():
    model = ElasticViT(8, 1, 10, (4, 2), 32, 2, 2, 8, 128)
    names = {n for n, _ in model.named_parameters()}
    assert {"patches.2.proj.weight", "patches.4.proj.weight", "pos.2.weight",
            "pos.4.weight"} <= names
    assert model.pos["2"].weight.shape == (16, 32) and model.pos["4"].weight.shape == (4, 32)
    sub = ViTSubnet(2, SubnetConfig(16, 1, (BlockChoice(1, 32),)))
    model(torch.randn(2, 1, 8, 8), sub).sum().backward()
    assert model.patches["4"].proj.weight.grad is None   # the other patch size is untouched
    assert model.blocks[0].attn.q.weight.grad is not None
    assert model.blocks[1].attn.q.weight.grad is None    # beyond the depth
    with pytest.raises(ConfigError, match="patch size"):
        model(torch.randn(1, 1, 8, 8), ViTSubnet(8, sub.config))


def test_the_space_declares_its_encodings_sandwich_and_shrinking_phases():
    encoding = capability(SPACE, OwnEncodings).encodings()["structure"](SPACE)
    shallow, deep = SPACE.parse("vit:p2w16/h1r2"), SPACE.parse("vit:p4w32/h2r4,h1r2")
    a, b = encoding.encode_one(shallow), encoding.encode_one(deep)
    assert a.shape == b.shape
    slot = 1 + len(SPACE.heads) + len(SPACE.mlp_ratios)
    assert not a[-slot:].any() and b[-slot:].any()   # the missing second layer: zeros
    assert np.array_equal(a[:2], [0.0, 1.0])   # patch one-hot in the space's order (4, 2)
    large, small = capability(SPACE, SandwichRule).sandwich_bounds()
    assert large == SPACE.largest() and small == SPACE.smallest()
    phases = capability(SPACE, ProgressiveShrinking).shrinking_phases()
    assert [name for name, _ in phases][0] == "largest"
    rng = random.Random(0)
    assert phases[0][1](rng) == SPACE.largest()
    last = {str(phases[-1][1](rng)) for _ in range(30)}
    assert len(last) > 5 and all(SPACE.parse(t) for t in last)


def _study(estimator: str, options: dict, **kwargs):
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    return frugalnas.create_study(space="vit", space_options=SMALL, estimator=estimator,
                                  estimator_options=options, dataset="digits", seed=0, **OFF,
                                  **kwargs)


def test_a_study_trains_vision_transformers_from_scratch():
    study = _study("train", {"epochs": 1, "batch_size": 32, "optimizer": "adam", "lr": 0.003})
    study.optimize(n_trials=2)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 2 and all(0 <= t.values[0] <= 100 for t in done)


def test_a_supernet_with_the_sandwich_rule_scores_vision_transformers_above_chance():
    study = _study("supernet", {"epochs": 3, "batch_size": 32, "sandwich": 2, "lr": 0.003,
                                "weight_decay": 0, "optimizer": "adam"})
    study.optimize(n_trials=3)
    values = [t.values[0] for t in study.trials if t.state.name == "COMPLETE"]
    assert len(values) == 3 and min(values) > 15, values   # ten classes: chance is 10 %


def test_proxies_and_counts_score_vision_transformers_and_text_data_is_refused():
    for estimator in ("synflow", "flops", "params"):
        study = _study(estimator, {"batch_size": 8} if estimator == "synflow" else {})
        study.optimize(n_trials=2)
        assert all(t.state.name == "COMPLETE" and t.values[0] > 0 for t in study.trials)
    # on text, each trial fails saying why (the data are read when the first trial needs them)
    study = frugalnas.create_study(space="vit", space_options=SMALL, estimator="params",
                                   dataset="text", seed=0, **OFF)
    with pytest.raises(ConfigError, match="space 'vit' builds networks for image-classification;"
                                          " dataset 'text' holds language-modelling data"):
        study.load_dataset()


def test_a_vit_study_trains_per_block_out_of_core_and_exports_to_every_format(tmp_path):
    from frugalnas.export.exporter import export_study

    study = _study("train", {"max_steps": 5, "batch_size": 16, "optimizer": "adam",
                             "lr": 0.003}, backend="out-of-core",
                   storage=f"sqlite:///{tmp_path / 'study.db'}")
    study.optimize(n_trials=2)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert done and all(t.frozen.user_attrs["metrics"]["ooc_plan_feasible"] == 1.0
                        for t in done)
    exported = export_study(study, tmp_path / "out", epochs=0.05)
    plan = exported.report["training"]["backend"]["plan_table"]
    assert "embedding" in plan and "blocks.0" in plan and "output" in plan   # per stage
    for fmt in ("torchscript", "export", "onnx"):
        assert exported.report["checks"][fmt]["max_abs_diff"] < 1e-5, fmt
    assert exported.report["onnx_test_accuracy"] == pytest.approx(
        exported.report["test_accuracy"])


@pytest.mark.parametrize("proxy", ["naswot", "swap", "swap_reg", "linear_regions",
                                   "az_expressivity", "az_trainability"])
def test_proxies_that_read_relu_patterns_or_feature_maps_are_refused_in_one_line(proxy):
    with pytest.raises(ConfigError, match=f"proxy '{proxy}' reads .*, which the transformer "
                                          "networks of space 'vit' lack") as info:
        _study(proxy, {})
    assert "\n" not in str(info.value)


def test_an_ensemble_with_such_a_member_is_refused_and_grasp_differentiates_attention_twice():
    with pytest.raises(ConfigError, match="proxy 'swap' reads ReLU activation patterns"):
        _study("rank-ensemble", {"proxies": "selected"})
    study = _study("grasp", {"batch_size": 8})
    study.optimize(n_trials=2)
    assert all(t.state.name == "COMPLETE" for t in study.trials)
