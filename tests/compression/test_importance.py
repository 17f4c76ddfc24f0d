"""Importance ordering (frugalnas.compression.importance): the reordered parent computes the same
outputs, and the parts that matter least end up where a smaller sub-network drops them."""

from __future__ import annotations

import pytest
import torch

from frugalnas.compression.importance import METHODS, measure, reorder
from frugalnas.nn.transformer import BlockChoice, ElasticGPT, SubnetConfig
from frugalnas.ports.errors import ConfigError

VOCAB, WIDTH, DEPTH, HEADS, HEAD_DIM, HIDDEN, CONTEXT = 300, 64, 3, 4, 16, 128, 24
FAMILIES = {
    "gpt2": {},
    "llama": dict(positions="rotary", norm="rmsnorm", gated=True, activation="silu",
                  bias=False, kv_heads=2, tie_weights=True, rope_base=5000.0),
}


def _network(family: str, seed: int = 0) -> ElasticGPT:
    torch.manual_seed(seed)
    model = ElasticGPT(VOCAB, WIDTH, DEPTH, HEADS, HEAD_DIM, HIDDEN, CONTEXT, **FAMILIES[family])
    with torch.no_grad():
        for p in model.parameters():
            p.normal_(0.0, 0.1)
    return model.eval()


def _tokens(seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return (torch.randint(0, VOCAB, (4, CONTEXT), generator=g),
            torch.randint(0, VOCAB, (4, CONTEXT), generator=g))


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", METHODS)
def test_reordering_keeps_the_parents_outputs(family: str, method: str) -> None:
    model = _network(family)
    x, y = _tokens(1)
    with torch.no_grad():
        before = model(x)
    importance = measure(model, [x], method, [y])
    reorder(model, importance)
    with torch.no_grad():
        after = model(x)
    torch.testing.assert_close(after, before, atol=2e-5, rtol=1e-5)


@pytest.mark.parametrize("family", list(FAMILIES))
def test_after_reordering_the_scores_are_in_descending_order(family: str) -> None:
    model = _network(family)
    x, _ = _tokens(2)
    reorder(model, measure(model, [x]))
    again = measure(model, [x])
    for scores in (*again.groups, *again.units, again.channels):
        assert torch.all(scores[:-1] >= scores[1:] - 1e-5)
    ranked = again.layers[list(model.layer_order)]
    assert torch.all(ranked[:-1] >= ranked[1:] - 1e-6)


def _silence(model: ElasticGPT) -> None:
    """Heads 0 and 1 of every block and half of its MLP units contribute nothing (no values,
    no activations, no output weights); block 1 passes its input through unchanged."""
    with torch.no_grad():
        for i, block in enumerate(model.blocks):
            attn, mlp = block.attn, block.mlp
            kv = HEAD_DIM * 2 // attn.group
            attn.v.weight[:kv] = 0
            if attn.v.bias is not None:
                attn.v.bias[:kv] = 0
            attn.out.weight[:, :HEAD_DIM * 2] = 0
            mlp.fc.weight[:HIDDEN // 2] = 0
            if mlp.fc.bias is not None:
                mlp.fc.bias[:HIDDEN // 2] = 0
            mlp.proj.weight[:, :HIDDEN // 2] = 0
            if i == 1:
                for layer in (attn.out, mlp.proj):
                    layer.weight.zero_()
                    if layer.bias is not None:
                        layer.bias.zero_()


@pytest.mark.parametrize("family", list(FAMILIES))
@pytest.mark.parametrize("method", METHODS)
def test_the_parts_that_do_nothing_are_dropped_first(family: str, method: str) -> None:
    model = _network(family)
    _silence(model)
    x, y = _tokens(3)
    with torch.no_grad():
        full = model(x)
    reorder(model, measure(model, [x], method, [y]))
    assert sorted(model.layer_order[:DEPTH - 1]) == [0, 2]
    smaller = SubnetConfig(WIDTH, DEPTH - 1, (BlockChoice(HEADS // 2, HIDDEN // 2),) * 2)
    with torch.no_grad():
        sub = model(x, smaller)
    torch.testing.assert_close(sub, full, atol=2e-5, rtol=1e-5)
    assert torch.equal(model.export(smaller)(x), sub)


def test_a_layer_order_must_rank_every_block_once() -> None:
    model = _network("gpt2")
    with pytest.raises(ConfigError, match=r"layer order \[0, 0, 1\] must rank each of the 3"):
        model.set_layer_order([0, 0, 1])


def test_unknown_method_is_refused() -> None:
    with pytest.raises(ConfigError, match="invalid method 'taylor'.*activation.*gradient"):
        measure(_network("gpt2"), [], "taylor")
