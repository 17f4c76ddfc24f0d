"""The ``gpt`` space: its decisions (conditional per layer), text form, networks, supernet and
capabilities, on real torch modules."""

from __future__ import annotations

import random

import optuna
import pytest
import torch

from frugalnas.nn.transformer import DenseGPT, count_non_embedding_params
from frugalnas.nn.weight_store import WeightStore
from frugalnas.ports.capabilities import (OwnEncodings, ProgressiveShrinking, SandwichRule,
                                          WeightSharing, capability)
from frugalnas.ports.errors import ArchitectureParseError, ConfigError
from frugalnas.spaces.gpt.space import GPTSpace
from frugalnas.spaces.stack.space import DEPTH_KEY, WIDTH_KEY, layer_keys
from frugalnas.testing.setups import SMALL_GPT

SPACE = GPTSpace(**SMALL_GPT)


def test_text_form_round_trips_and_holds_only_the_layers_a_network_has():
    arch = SPACE.parse("gpt:w32/h2r4")
    assert arch.decisions == {WIDTH_KEY: 32, DEPTH_KEY: 1, "layer0_heads": 2,
                              "layer0_mlp_ratio": 4}
    assert str(arch) == "gpt:w32/h2r4"
    for seed in range(20):
        sampled = SPACE.sample(random.Random(seed))
        assert SPACE.parse(str(sampled)) == sampled
        depth = sampled[DEPTH_KEY]
        assert all(k not in sampled.decisions for i in range(depth, SPACE.max_depth)
                   for k in layer_keys(i))


def test_inactive_decisions_are_neither_stored_nor_mutated():
    shallow = SPACE.parse("gpt:w16/h1r2")
    rng = random.Random(0)
    for _ in range(50):
        child = SPACE.mutate(shallow, rng)
        SPACE.validate(child)
        changed = {k for k in child.decisions if child.decisions.get(k) != shallow.decisions.get(k)}
        assert changed, "a mutation changes something"
        # a change of an existing decision never touches a layer the network lacks
        if child[DEPTH_KEY] == 1:
            assert set(child.decisions) == set(shallow.decisions)
    # parameters of a layer beyond the depth are ignored, as optuna may hold them
    params = {**shallow.decisions, "layer1_heads": 2, "layer1_mlp_ratio": 4}
    assert SPACE.from_params(params) == shallow


def test_bad_architectures_and_options_are_refused_in_one_line():
    for text, needle in (("gpt:w48/h1r2", "embed_width"), ("gpt:w16/h3r2", "layer0_heads"),
                         ("gpt:w16/h1r2,h1r2,h1r2", "depth"), ("gpt:16/h1r2", "malformed"),
                         ("gpt:w16/x1", "malformed layer")):
        with pytest.raises(ArchitectureParseError, match=needle) as info:
            SPACE.parse(text)
        assert "\n" not in str(info.value)
    for options, needle in (({"min_depth": 3, "max_depth": 2}, "exceeds max_depth"),
                            ({"positions": "alibi"}, "positions"),
                            ({"norm": "batchnorm"}, "norm"), ({"widths": []}, "widths"),
                            ({"context": 0}, "context")):
        with pytest.raises(ConfigError, match=needle):
            GPTSpace(**options)


def test_optuna_samplers_see_only_the_active_decisions():
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3))
    for _ in range(8):
        trial = study.ask()
        arch = SPACE.suggest(trial)
        assert set(trial.params) == set(arch.decisions)
        study.tell(trial, float(arch[WIDTH_KEY]))


def test_a_built_network_has_the_architectures_shape_and_predicts_next_tokens():
    arch = SPACE.parse("gpt:w32/h2r4,h1r2")
    torch.manual_seed(0)
    net = SPACE.build(arch, 11, (16,))
    assert isinstance(net, DenseGPT)
    tokens = torch.randint(0, 11, (3, 16))
    assert net(tokens).shape == (3, 16, 11)
    attn = [block.attn for block in net.blocks]
    assert [a.q.out_features // a.head_dim for a in attn] == [2, 1]
    assert [block.mlp.fc.out_features for block in net.blocks] == [128, 64]
    # non-embedding parameters grow with every decision
    small = SPACE.build(SPACE.parse("gpt:w32/h2r2,h1r2"), 11, (16,))
    assert count_non_embedding_params(small) < count_non_embedding_params(net)


def test_data_the_space_cannot_model_is_refused_in_one_line():
    arch = SPACE.smallest()
    with pytest.raises(ConfigError, match=r"larger than the 16 positions.*space.context=32"):
        SPACE.build(arch, 11, (32,))
    with pytest.raises(ConfigError, match=r"models text.*\(3, 8, 8\)"):
        SPACE.build(arch, 11, (3, 8, 8))


def test_a_shared_network_equals_its_stand_alone_export_bitwise():
    sharing = capability(SPACE, WeightSharing)
    builder = sharing.shared_builder(11, (16,))
    store = WeightStore(builder.factory, seed=0)
    tokens = torch.randint(0, 11, (2, 16), generator=torch.Generator().manual_seed(1))
    for text in ("gpt:w32/h2r4,h2r4", "gpt:w16/h1r2", "gpt:w32/h1r2,h2r4"):
        shared = builder.subnet(SPACE.parse(text), store.get)
        alone = shared.export()
        assert torch.equal(shared(tokens), alone(tokens))
        assert not {id(p) for p in alone.parameters()} & {id(p) for p in store.parameters()}


def test_sandwich_bounds_and_progressive_shrinking_widen_step_by_step():
    largest, smallest = capability(SPACE, SandwichRule).sandwich_bounds()
    assert str(largest) == "gpt:w32/h2r4,h2r4" and str(smallest) == "gpt:w16/h1r2"
    phases = capability(SPACE, ProgressiveShrinking).shrinking_phases()
    assert [name for name, _ in phases] == ["largest", "mlp ratio", "heads", "depth", "width"]
    rng = random.Random(0)
    seen = {name: {str(sample(rng)) for _ in range(40)} for name, sample in phases}
    assert seen["largest"] == {str(largest)}
    assert {a.split("/")[0] for a in seen["depth"]} == {"gpt:w32"}   # width still fixed
    assert len(seen["width"]) > len(seen["mlp ratio"]) > 1


def test_the_structure_encoding_ignores_layers_a_network_lacks():
    encodings = capability(SPACE, OwnEncodings).encodings()
    encoding = encodings["structure"](SPACE)
    a, b = SPACE.parse("gpt:w16/h1r2"), SPACE.parse("gpt:w16/h1r2,h2r4")
    ea, eb = encoding.encode_one(a), encoding.encode_one(b)
    assert ea.shape == eb.shape and not (ea == eb).all()
    again = SPACE.from_params({**a.decisions, "layer1_heads": 2, "layer1_mlp_ratio": 4})
    assert (encoding.encode_one(again) == ea).all()


def test_nanogpts_small_cpu_shape_is_a_point_of_the_default_space():
    space = GPTSpace()
    arch = space.uniform(128, 4, 4, 4)
    assert str(arch) == "gpt:w128/h4r4,h4r4,h4r4,h4r4"
    net = space.build(arch, 65, (64,))
    assert count_non_embedding_params(net) == 4 * (4 * 128 * 128 + 4 * 128 + 2 * 4 * 128 * 128
                                                   + 4 * 128 + 128 + 2 * 2 * 128) + 2 * 128
