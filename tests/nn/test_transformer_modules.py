"""Elastic transformer modules: every configuration equals, bitwise on the CPU, the dense module
it exports (same weights); configurations train only the slices they use; bad configurations
are refused in one line; an exported network runs where frugalnas cannot be imported."""

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from frugalnas.nn.transformer import (
    BlockChoice,
    DenseGPT,
    ElasticAttention,
    ElasticBlock,
    ElasticEmbedding,
    ElasticGPT,
    ElasticLayerNorm,
    ElasticMLP,
    ElasticRMSNorm,
    SubnetConfig,
    apply_rotary,
    count_non_embedding_params,
    export_program,
)
from frugalnas.ports.errors import ConfigError
from frugalnas.nn.dense_transformer import DecodeStep

# vocab 50, width 32, depth 3, 4 heads of 8, 64 hidden units, 16 positions
SIZES = dict(vocab_size=50, max_width=32, max_depth=3, max_heads=4, head_dim=8,
             max_mlp_hidden=64, context=16)
VARIANTS = {
    "learned-layernorm": {},
    "rotary-rmsnorm-tied-gqa": dict(positions="rotary", norm="rmsnorm", tie_weights=True,
                                    kv_heads=2),
    "bidirectional-silu-nobias": dict(causal=False, activation="silu", bias=False),
}
SUBNETS = [
    None,
    SubnetConfig(32, 3, (BlockChoice(4, 64),) * 3),
    SubnetConfig(24, 2, (BlockChoice(2, 40), BlockChoice(4, 17), BlockChoice(2, 1))),
    SubnetConfig(8, 1, (BlockChoice(2, 64),)),
]


def _randomise(module: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Non-trivial weights everywhere (unit norms and zero biases would hide slicing errors)."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in module.parameters():
            p.copy_(torch.randn(p.shape, generator=g) * 0.3)
    return module


def _x(*shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(2))


def _tokens(n: int = 2, t: int = 10) -> torch.Tensor:
    return torch.randint(0, SIZES["vocab_size"], (n, t), generator=torch.Generator().manual_seed(3))


# -- each module equals its export ---------------------------------------------------------------
def test_embedding_keeps_the_first_features():
    emb = ElasticEmbedding(50, 32)
    tokens = _tokens()
    out = emb(tokens, 12)
    assert out.shape == (2, 10, 12) and torch.equal(out, emb(tokens)[..., :12])
    assert torch.equal(out, emb.export(12)(tokens))


@pytest.mark.parametrize("norm_class", [ElasticLayerNorm, ElasticRMSNorm])
def test_norms_use_the_first_affine_parameters(norm_class):
    norm = _randomise(norm_class(32))
    x = _x(2, 5, 20)
    dense = norm.export(20)
    assert torch.equal(norm(x), dense(x))
    assert sum(p.numel() for p in dense.parameters()) == norm.param_count(20)


ATTENTION = [  # (causal, kv_heads, rotary, heads of the configuration)
    (True, None, False, 3), (False, None, False, 1), (True, 2, False, 2), (False, 1, False, 4),
    (True, None, True, 3), (True, 2, True, 4), (False, 2, True, 2)]


@pytest.mark.parametrize("causal, kv_heads, rotary, heads", ATTENTION)
def test_attention_configuration_equals_its_export(causal, kv_heads, rotary, heads):
    attn = _randomise(ElasticAttention(32, 4, 8, kv_heads, causal, rotary))
    x = _x(2, 7, 24)
    dense = attn.export(24, heads)
    out = attn(x, heads)
    assert out.shape == x.shape and torch.equal(out, dense(x))
    assert sum(p.numel() for p in dense.parameters()) == attn.param_count(24, heads)
    later = x.clone()
    later[:, -1] += 1.0   # a change of the last token reaches earlier ones only without a mask
    assert torch.equal(attn(later, heads)[:, :-1], out[:, :-1]) == causal


def test_grouped_query_heads_share_their_groups_key_value_head():
    attn = ElasticAttention(16, 4, 8, kv_heads=2)
    dense = attn.export(16, 2)
    assert dense.q.out_features == 16 and dense.k.out_features == 8 == dense.v.out_features


def test_rotary_positions_are_relative():
    g = torch.Generator().manual_seed(0)
    q, k = torch.randn(1, 1, 1, 8, generator=g), torch.randn(1, 1, 1, 8, generator=g)
    rq, rk = apply_rotary(q.expand(1, 1, 6, 8)), apply_rotary(k.expand(1, 1, 6, 8))
    scores = rq[0, 0] @ rk[0, 0].T       # scores[i, j] depends on i - j only
    assert torch.allclose(scores[3, 1], scores[4, 2], atol=1e-5)
    assert torch.allclose(rq.norm(dim=-1), q.norm(dim=-1).expand(1, 1, 6), atol=1e-5)


@pytest.mark.parametrize("activation", ["gelu", "gelu_tanh", "relu", "silu"])
def test_mlp_configuration_equals_its_export(activation):
    mlp = _randomise(ElasticMLP(32, 64, activation))
    x = _x(3, 4, 20)
    dense = mlp.export(20, 40)
    assert torch.equal(mlp(x, 40), dense(x))
    assert sum(p.numel() for p in dense.parameters()) == mlp.param_count(20, 40)


@pytest.mark.parametrize("norm", ["layernorm", "rmsnorm"])
def test_block_configuration_equals_its_export(norm):
    block = _randomise(ElasticBlock(32, 4, 8, 64, kv_heads=2, norm=norm))
    x = _x(2, 6, 16)
    for choice in (BlockChoice(2, 10), BlockChoice(4, 64), block.largest()):
        assert torch.equal(block(x, choice), block.export(16, choice)(x))


@pytest.mark.parametrize("config", SUBNETS, ids=str)
@pytest.mark.parametrize("variant", VARIANTS)
def test_gpt_subnetwork_equals_its_export(variant, config):
    model = _randomise(ElasticGPT(**SIZES, **VARIANTS[variant]))
    dense = model.export(config)
    tokens = _tokens()
    logits = model(tokens, config)
    assert logits.shape == (2, 10, 50)
    assert isinstance(dense, DenseGPT) and torch.equal(logits, dense(tokens))
    assert model.non_embedding_params(config) == count_non_embedding_params(dense)
    if VARIANTS[variant].get("tie_weights"):
        assert dense.head.weight is dense.tok.weight


def test_non_embedding_params_leave_out_embeddings_and_head():
    model = ElasticGPT(**SIZES)
    dense = model.export()
    total = sum(p.numel() for p in dense.parameters())
    embeddings_and_head = (50 * 32) + (16 * 32) + (32 * 50)
    assert count_non_embedding_params(dense) == total - embeddings_and_head
    assert model.non_embedding_params() == count_non_embedding_params(model)


# -- configurations share one set of weights -----------------------------------------------------
def test_a_subnetwork_trains_only_the_slices_it_uses():
    model = _randomise(ElasticGPT(**SIZES, kv_heads=2))
    config = SubnetConfig(24, 2, (BlockChoice(2, 40), BlockChoice(4, 64), BlockChoice(4, 64)))
    model(_tokens(t=10), config).sum().backward()

    def used_only(param, *slices):
        inside = torch.zeros_like(param, dtype=torch.bool)
        inside[slices] = True
        return param.grad[inside].abs().sum() > 0 and param.grad[~inside].abs().sum() == 0

    first = model.blocks[0]
    assert used_only(model.tok.weight, slice(None), slice(0, 24))
    assert used_only(model.pos.weight, slice(0, 10), slice(0, 24))
    assert used_only(first.norm1.weight, slice(0, 24))
    assert used_only(first.attn.q.weight, slice(0, 16), slice(0, 24))   # 2 heads of 8
    assert used_only(first.attn.k.weight, slice(0, 8), slice(0, 24))    # their 1 kv head
    assert used_only(first.attn.out.weight, slice(0, 24), slice(0, 16))
    assert used_only(first.mlp.fc.weight, slice(0, 40), slice(0, 24))
    assert used_only(first.mlp.proj.bias, slice(0, 24))
    assert used_only(model.blocks[1].attn.v.weight, slice(None), slice(0, 24))
    assert all(p.grad is None for p in model.blocks[2].parameters())   # beyond the depth
    assert used_only(model.head.weight, slice(None), slice(0, 24))


def test_an_export_holds_copies_not_the_shared_weights():
    model = ElasticGPT(**SIZES)
    dense = model.export()
    shared = {p.data_ptr() for p in model.parameters()}
    assert not shared & {p.data_ptr() for p in dense.parameters()}


# -- bad configurations ----------------------------------------------------------------------
FULL = (BlockChoice(4, 64),) * 3
BAD = [
    (dict(tokens=_tokens(1, 17)), "context length 17 is larger than the model's 16 positions"),
    (dict(config=SubnetConfig(40, 3, FULL)), r"invalid width 40; valid range: \[1, 32\]"),
    (dict(config=SubnetConfig(32, 4, FULL * 2)), r"invalid depth 4; valid range: \[1, 3\]"),
    (dict(config=SubnetConfig(32, 1, (BlockChoice(6, 64),))), r"invalid heads 6; valid range: \[1, 4\]"),
    (dict(config=SubnetConfig(32, 1, (BlockChoice(3, 64),))),
     r"heads 3 is not a multiple of the grouped-query group size 2; choose one of \[2, 4\]"),
    (dict(config=SubnetConfig(32, 1, (BlockChoice(4, 65),))), r"invalid mlp_hidden 65; valid range: \[1, 64\]"),
    (dict(tokens=_tokens()[0]), r"tokens must be shaped \(batch, sequence\), got \(10,\)"),
]


@pytest.mark.parametrize("bad, match", BAD, ids=[m[:24] for _, m in BAD])
def test_a_bad_configuration_is_refused_in_one_line(bad, match):
    model = ElasticGPT(**SIZES, kv_heads=2)
    with pytest.raises(ConfigError, match=match) as caught:
        model(bad.get("tokens", _tokens()), bad.get("config"))
    assert "\n" not in str(caught.value)
    if "config" in bad:
        with pytest.raises(ConfigError, match=match):
            model.export(bad["config"])


@pytest.mark.parametrize("make, match", [
    (lambda: SubnetConfig(32, 3, FULL[:2]), "depth 3 needs as many block choices, got 2"),
    (lambda: ElasticAttention(32, 4, 8, kv_heads=3), "kv_heads 3 must divide max_heads 4"),
    (lambda: ElasticAttention(32, 4, 7, rotary=True), "even head_dim, got 7"),
    (lambda: ElasticGPT(**SIZES, positions="alibi"),
     r"invalid positions 'alibi'; valid: 'learned', 'rotary'"),
    (lambda: ElasticGPT(**SIZES, norm="batchnorm"), "invalid norm 'batchnorm'; valid: 'layernorm', 'rmsnorm'"),
    (lambda: ElasticMLP(8, 16, "tanh"), "invalid activation 'tanh'; valid: 'gelu', 'gelu_tanh', 'relu', 'silu'"),
])
def test_a_bad_construction_is_refused(make, match):
    with pytest.raises(ConfigError, match=match):
        make()


# -- the exported network needs no frugalnas -----------------------------------------------------
LOAD_WITHOUT_FRUGALNAS = textwrap.dedent("""
    import sys
    sys.path.append(sys.argv[1])          # torch's site-packages, without its .pth files
    try:
        import frugalnas
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit(f"frugalnas is importable from {frugalnas.__file__}")
    import torch
    program = torch.export.load("gpt.pt2").module()
    for name, (tokens, logits) in torch.load("cases.pt").items():
        assert torch.equal(program(tokens), logits), name
    print("ok")
""")


def test_an_exported_gpt_loads_and_runs_without_frugalnas(tmp_path):
    model = _randomise(ElasticGPT(**SIZES, **VARIANTS["rotary-rmsnorm-tied-gqa"]))
    dense = model.export(SUBNETS[2]).eval()
    torch.export.save(export_program(dense, _tokens()), tmp_path / "gpt.pt2")
    cases = {f"{n}x{t}": _tokens(n, t) for n, t in ((2, 10), (3, 16), (1, 1))}
    torch.save({k: (x, model(x, SUBNETS[2]).detach()) for k, x in cases.items()},
               tmp_path / "cases.pt")
    site_packages = str(Path(torch.__file__).resolve().parents[1])
    # -I: no PYTHONPATH, no user site, no current folder; -S: no site-packages .pth files
    # (where an editable install of frugalnas hooks itself in).
    done = subprocess.run([sys.executable, "-I", "-S", "-c", LOAD_WITHOUT_FRUGALNAS,
                           site_packages], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0 and done.stdout.strip() == "ok", done.stderr[-2000:]


@pytest.mark.parametrize("variant", [
    dict(), dict(positions="rotary", kv_heads=2, norm="rmsnorm", gated=True, bias=False)])
def test_decoding_with_a_key_value_cache_computes_the_whole_sequence_s_logits(variant):
    torch.manual_seed(0)
    model = ElasticGPT(256, 64, 3, 4, 16, 128, 32, **variant).export().eval()
    tokens = torch.randint(0, 256, (2, 20))
    with torch.no_grad():
        whole = model(tokens)
        logits, cache = model.forward_cached(tokens[:, :12])   # a prompt
        steps = [logits]
        for i in range(12, 20):                                 # one token at a time
            logits, cache = model.forward_cached(tokens[:, i:i + 1], cache)
            steps.append(logits)
        chunk, _ = model.forward_cached(tokens[:, 12:], model.forward_cached(tokens[:, :12])[1])
        step = DecodeStep(model, tokens[:, :19])(tokens[:, 19:])
    assert cache[0][0].shape == (2, model.blocks[0].attn.k.out_features // 16, 20, 16)
    torch.testing.assert_close(torch.cat(steps, dim=1), whole, atol=1e-5, rtol=0)
    torch.testing.assert_close(chunk, whole[:, 12:], atol=1e-5, rtol=0)
    torch.testing.assert_close(step, whole[:, 19:], atol=1e-5, rtol=0)


def test_a_cache_is_refused_beyond_the_positions_and_for_bidirectional_attention():
    model = ElasticGPT(256, 32, 1, 2, 16, 64, 8).export().eval()
    _, cache = model.forward_cached(torch.randint(0, 256, (1, 8)))
    with pytest.raises(ConfigError, match="position 8 is beyond the model's 8 learned"):
        model.forward_cached(torch.randint(0, 256, (1, 1)), cache)
    both_ways = ElasticGPT(256, 32, 1, 2, 16, 64, 8, causal=False).export()
    with pytest.raises(ConfigError, match="bidirectional attention has no key/value cache"):
        both_ways.forward_cached(torch.randint(0, 256, (1, 4)))
