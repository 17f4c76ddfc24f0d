"""Elastic transformer blocks: one module holds the weights of its largest configuration, and
every smaller sub-network is computed from slices of them (the Once-for-All idea of
:mod:`frugalnas.nn.elastic`, applied to a GPT-style decoder as in HAT and LiteTransformerSearch).

A sub-network (:class:`SubnetConfig`) picks a ``width`` (the first embedding features, shared by
every layer), a ``depth`` (the first blocks) and, per block, a :class:`BlockChoice`: the first
``heads`` attention heads and the first ``mlp_hidden`` units of the feed-forward layer.

* :class:`ElasticEmbedding`, :class:`ElasticLayerNorm`, :class:`ElasticRMSNorm`,
  :class:`ElasticAttention` (multi-head or grouped-query, causal or not, optional rotary
  positions), :class:`ElasticMLP`, :class:`ElasticBlock` (pre-norm residual) and
  :class:`ElasticGPT` (the whole language model).

Every elastic module runs a configuration with ``forward`` and turns it into stand-alone plain
torch modules (:class:`DenseAttention`, :class:`DenseMLP`, :class:`DenseBlock`,
:class:`DenseGPT`, ``nn.LayerNorm``, ...) with ``export``. Both compute the same output, bitwise
on the CPU: the elastic forward calls the same functional operations on contiguous copies of the
same slices. A :class:`DenseGPT` goes through ``torch.export`` (:func:`export_program`), so the
saved program loads and runs where frugalnas is not installed. A :class:`DenseGPT` lists its
stages (:class:`GPTEmbedding`, each :class:`DenseBlock`, :class:`GPTOutput`) as a
:class:`~frugalnas.ports.network.BlockNetwork`, for the out-of-core backend's per-block plans.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.ports.errors import ConfigError, check_choice, check_range

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
POSITIONS = ("learned", "rotary")
NORMS = ("layernorm", "rmsnorm")


# -- sub-network configurations ----------------------------------------------------------------
@dataclass(frozen=True)
class BlockChoice:
    """One block of a sub-network: its first ``heads`` attention heads and its first
    ``mlp_hidden`` feed-forward units."""

    heads: int
    mlp_hidden: int


@dataclass(frozen=True)
class SubnetConfig:
    """A sub-network: embedding ``width``, the first ``depth`` blocks, and one
    :class:`BlockChoice` per block (those beyond ``depth`` are ignored)."""

    width: int
    depth: int
    blocks: tuple[BlockChoice, ...]

    def __post_init__(self) -> None:
        object.__setattr__(self, "blocks", tuple(self.blocks))
        if len(self.blocks) < self.depth:
            raise ConfigError(f"depth {self.depth} needs as many block choices, got "
                              f"{len(self.blocks)}")


# -- functions shared by the elastic and the dense modules -----------------------------------
def _sliced_linear(x: torch.Tensor, layer: nn.Linear, out_features: int) -> torch.Tensor:
    """``layer`` restricted to its first ``out_features`` outputs and the input's features."""
    weight = layer.weight[:out_features, :x.shape[-1]].contiguous()
    bias = None if layer.bias is None else layer.bias[:out_features].contiguous()
    return F.linear(x, weight, bias)


def _export_linear(layer: nn.Linear, in_features: int, out_features: int) -> nn.Linear:
    """A plain ``nn.Linear`` holding a copy of the slice :func:`_sliced_linear` uses."""
    dense = nn.Linear(in_features, out_features, bias=layer.bias is not None)
    with torch.no_grad():
        dense.weight.copy_(layer.weight[:out_features, :in_features])
        if layer.bias is not None:
            dense.bias.copy_(layer.bias[:out_features])
    return dense


def apply_rotary(x: torch.Tensor, base: float = 10000.0) -> torch.Tensor:
    """Rotary position embedding (RoPE, Su et al. 2021) of ``x`` shaped (N, heads, T, d): the
    two halves of each head's features are rotated by an angle growing with the position."""
    t, d = x.shape[-2], x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    angles = torch.outer(torch.arange(t, dtype=torch.float32, device=x.device), inv_freq)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int, causal: bool,
           rotary: bool) -> torch.Tensor:
    """Scaled dot-product attention of projected queries (N, T, heads * d) over keys and values
    (N, T, kv_heads * d); each group of ``heads / kv_heads`` query heads shares one key/value
    head. Returns (N, T, heads * d)."""
    n, t, _ = q.shape
    q, k, v = (z.view(n, t, -1, head_dim).transpose(1, 2) for z in (q, k, v))
    if rotary:
        q, k = apply_rotary(q), apply_rotary(k)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return y.transpose(1, 2).reshape(n, t, -1)


# -- dense (stand-alone) modules -----------------------------------------------------------------
class DenseAttention(nn.Module):
    """Plain multi-head (``kv_heads == heads``) or grouped-query attention."""

    def __init__(self, width: int, heads: int, head_dim: int, kv_heads: int, causal: bool = True,
                 rotary: bool = False, bias: bool = True):
        super().__init__()
        self.head_dim, self.causal, self.rotary = head_dim, causal, rotary
        self.q = nn.Linear(width, heads * head_dim, bias=bias)
        self.k = nn.Linear(width, kv_heads * head_dim, bias=bias)
        self.v = nn.Linear(width, kv_heads * head_dim, bias=bias)
        self.out = nn.Linear(heads * head_dim, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = attend(self.q(x), self.k(x), self.v(x), self.head_dim, self.causal, self.rotary)
        out: torch.Tensor = self.out(y)
        return out


class DenseMLP(nn.Module):
    """Plain feed-forward layer: ``fc`` (width -> hidden), activation, ``proj`` (back)."""

    def __init__(self, width: int, hidden: int, activation: str = "gelu", bias: bool = True):
        super().__init__()
        self.activation = activation
        self.fc = nn.Linear(width, hidden, bias=bias)
        self.proj = nn.Linear(hidden, width, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out: torch.Tensor = self.proj(ACTIVATIONS[self.activation](self.fc(x)))
        return out


class DenseBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, norm1: nn.Module, attn: DenseAttention, norm2: nn.Module, mlp: DenseMLP):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out


class GPTEmbedding(nn.Module):
    """The embedding stage of a :class:`DenseGPT`: token embedding plus, when ``pos`` is
    given, learned positions. It holds plain references to its parent's ``tok`` and ``pos``
    (not submodules), so the parent's parameters and state-dict keys stay where they are."""

    parts: tuple[nn.Embedding, nn.Embedding | None]

    def __init__(self, tok: nn.Embedding, pos: nn.Embedding | None):
        super().__init__()
        self.parts = (tok, pos)          # a tuple: not registered as submodules

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        tok, pos = self.parts
        x: torch.Tensor = tok(tokens)
        if pos is not None:
            x = x + pos(torch.arange(tokens.shape[1], device=tokens.device))
        return x

    def extra_repr(self) -> str:
        return "tok + pos" if self.parts[1] is not None else "tok"


class GPTOutput(nn.Module):
    """The output stage of a :class:`DenseGPT`: final norm, then the language-model head
    (references to its parent's ``norm`` and ``head``, as :class:`GPTEmbedding`)."""

    parts: tuple[nn.Module, nn.Linear]

    def __init__(self, norm: nn.Module, head: nn.Linear):
        super().__init__()
        self.parts = (norm, head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm, head = self.parts
        logits: torch.Tensor = head(norm(x))
        return logits

    def extra_repr(self) -> str:
        return "norm, head"


class DenseGPT(nn.Module):
    """A plain decoder: token embedding (plus learned positions when ``pos`` is given), blocks,
    final norm and language-model head. ``forward(tokens)`` returns logits (N, T, vocab).

    It is a :class:`~frugalnas.ports.network.BlockNetwork`: :meth:`forward_blocks` lists the
    embedding stage (``embedding``: ``tok`` + ``pos``), every :class:`DenseBlock` and the output
    stage (``output``: ``norm`` + ``head``), which ``forward`` calls once each, in order; the
    out-of-core backend plans per stage. The stages hold references to ``tok``, ``pos``,
    ``norm`` and ``head`` (kept in step when those are reassigned), so the parameters and the
    state-dict keys are ``tok.*``, ``pos.*``, ``blocks.<i>.*``, ``norm.*`` and ``head.*``."""

    _STAGE_PARTS = ("tok", "pos", "norm", "head")

    def __init__(self, tok: nn.Embedding, pos: nn.Embedding | None, blocks: list[DenseBlock],
                 norm: nn.Module, head: nn.Linear):
        super().__init__()
        self.tok, self.pos, self.norm, self.head = tok, pos, norm, head
        self.blocks = nn.ModuleList(blocks)
        self.embedding = GPTEmbedding(tok, pos)
        self.output = GPTOutput(norm, head)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self._STAGE_PARTS and "output" in self._modules:
            self.embedding.parts = (self.tok, self.pos)
            self.output.parts = (self.norm, self.head)

    def forward_blocks(self) -> list[nn.Module]:
        """The stages in forward order: embedding, each block, output (norm + head)."""
        return [self.embedding, *self.blocks, self.output]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.output(x)
        return logits


def count_non_embedding_params(model: DenseGPT | ElasticGPT) -> int:
    """Parameters of the decoder blocks and the final norm: neither token nor position
    embeddings, nor the language-model head (for an :class:`ElasticGPT`, of its largest
    network)."""
    return sum(p.numel() for part in (model.blocks, model.norm) for p in part.parameters())


def export_program(model: DenseGPT, example: torch.Tensor) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` for ``example`` tokens (N, T), with the batch size and the
    sequence length (up to the model's positions, when learned) left dynamic. Save it with
    ``torch.export.save``; ``torch.export.load(path).module()`` runs without frugalnas."""
    max_len = model.pos.num_embeddings if model.pos is not None else None
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=max_len)
    return torch.export.export(model, (example,),
                               dynamic_shapes={"tokens": {0: batch, 1: seq}})


# -- elastic modules -------------------------------------------------------------------------------
class ElasticEmbedding(nn.Module):
    """Token embedding of ``max_width`` features; a configuration keeps the first ``width``."""

    def __init__(self, vocab_size: int, max_width: int):
        super().__init__()
        self.vocab_size, self.max_width = vocab_size, max_width
        self.weight = nn.Parameter(torch.randn(vocab_size, max_width) * 0.02)

    def forward(self, tokens: torch.Tensor, width: int | None = None) -> torch.Tensor:
        width = self.max_width if width is None else width
        check_range("width", width, 1, self.max_width)
        return F.embedding(tokens, self.weight[:, :width].contiguous())

    def export(self, width: int) -> nn.Embedding:
        """A plain ``nn.Embedding`` of the first ``width`` features."""
        check_range("width", width, 1, self.max_width)
        dense = nn.Embedding(self.vocab_size, width)
        with torch.no_grad():
            dense.weight.copy_(self.weight[:, :width])
        return dense


class ElasticLayerNorm(nn.Module):
    """Layer normalisation of the input's ``width`` features (the first of ``max_width``),
    with the first ``width`` scales and shifts."""

    def __init__(self, max_width: int, eps: float = 1e-5, bias: bool = True):
        super().__init__()
        self.max_width, self.eps = max_width, eps
        self.weight = nn.Parameter(torch.ones(max_width))
        self.bias = nn.Parameter(torch.zeros(max_width)) if bias else None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = x.shape[-1]
        check_range("width", w, 1, self.max_width)
        bias = None if self.bias is None else self.bias[:w].contiguous()
        return F.layer_norm(x, (w,), self.weight[:w].contiguous(), bias, self.eps)

    def param_count(self, width: int) -> int:
        return width * (1 if self.bias is None else 2)

    def export(self, width: int) -> nn.LayerNorm:
        """A plain ``nn.LayerNorm`` of ``width`` features."""
        check_range("width", width, 1, self.max_width)
        dense = nn.LayerNorm(width, eps=self.eps, bias=self.bias is not None)
        with torch.no_grad():
            dense.weight.copy_(self.weight[:width])
            if self.bias is not None:
                dense.bias.copy_(self.bias[:width])
        return dense


class ElasticRMSNorm(nn.Module):
    """Root-mean-square normalisation of the input's ``width`` features (the first of
    ``max_width``), with the first ``width`` scales."""

    def __init__(self, max_width: int, eps: float = 1e-5):
        super().__init__()
        self.max_width, self.eps = max_width, eps
        self.weight = nn.Parameter(torch.ones(max_width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        w = x.shape[-1]
        check_range("width", w, 1, self.max_width)
        return F.rms_norm(x, (w,), self.weight[:w].contiguous(), self.eps)

    def param_count(self, width: int) -> int:
        return width

    def export(self, width: int) -> nn.RMSNorm:
        """A plain ``nn.RMSNorm`` of ``width`` features."""
        check_range("width", width, 1, self.max_width)
        dense = nn.RMSNorm(width, eps=self.eps)
        with torch.no_grad():
            dense.weight.copy_(self.weight[:width])
        return dense


class ElasticAttention(nn.Module):
    """Attention holding ``max_heads`` query heads of ``head_dim`` features over ``max_width``
    inputs. ``kv_heads`` (None: as many as query heads) key/value heads make it grouped-query
    attention: each group of ``max_heads / kv_heads`` query heads shares one key/value head.

    A configuration takes the input's ``width`` features (the first ones) and the first
    ``heads`` query heads, with the key/value heads of their groups: ``heads`` must be a
    multiple of the group size, so that the kept query heads fill whole groups."""

    def __init__(self, max_width: int, max_heads: int, head_dim: int,
                 kv_heads: int | None = None, causal: bool = True, rotary: bool = False,
                 bias: bool = True):
        super().__init__()
        kv_heads = kv_heads or max_heads
        if kv_heads < 1 or max_heads % kv_heads:
            raise ConfigError(f"kv_heads {kv_heads} must divide max_heads {max_heads}")
        if rotary and head_dim % 2:
            raise ConfigError(f"rotary positions need an even head_dim, got {head_dim}")
        self.max_width, self.max_heads, self.head_dim = max_width, max_heads, head_dim
        self.group, self.causal, self.rotary = max_heads // kv_heads, causal, rotary
        inner, kv_inner = max_heads * head_dim, kv_heads * head_dim
        self.q = nn.Linear(max_width, inner, bias=bias)
        self.k = nn.Linear(max_width, kv_inner, bias=bias)
        self.v = nn.Linear(max_width, kv_inner, bias=bias)
        self.out = nn.Linear(inner, max_width, bias=bias)

    def check(self, width: int, heads: int) -> None:
        check_range("width", width, 1, self.max_width)
        check_range("heads", heads, 1, self.max_heads)
        if heads % self.group:
            valid = list(range(self.group, self.max_heads + 1, self.group))
            raise ConfigError(f"heads {heads} is not a multiple of the grouped-query group size "
                              f"{self.group}; choose one of {valid}")

    def forward(self, x: torch.Tensor, heads: int | None = None) -> torch.Tensor:
        heads = self.max_heads if heads is None else heads
        self.check(x.shape[-1], heads)
        inner, kv_inner = heads * self.head_dim, heads // self.group * self.head_dim
        q = _sliced_linear(x, self.q, inner)
        k, v = _sliced_linear(x, self.k, kv_inner), _sliced_linear(x, self.v, kv_inner)
        y = attend(q, k, v, self.head_dim, self.causal, self.rotary)
        return _sliced_linear(y, self.out, x.shape[-1])

    def param_count(self, width: int, heads: int) -> int:
        inner, kv_inner = heads * self.head_dim, heads // self.group * self.head_dim
        biases = (inner + 2 * kv_inner + width) if self.out.bias is not None else 0
        return 2 * width * (inner + kv_inner) + biases

    def export(self, width: int, heads: int) -> DenseAttention:
        """The stand-alone attention of ``width`` inputs and the first ``heads`` heads."""
        self.check(width, heads)
        kv_heads, d = heads // self.group, self.head_dim
        dense = DenseAttention(width, heads, d, kv_heads, self.causal, self.rotary,
                               self.out.bias is not None)
        dense.q = _export_linear(self.q, width, heads * d)
        dense.k = _export_linear(self.k, width, kv_heads * d)
        dense.v = _export_linear(self.v, width, kv_heads * d)
        dense.out = _export_linear(self.out, heads * d, width)
        return dense


class ElasticMLP(nn.Module):
    """Feed-forward layer of ``max_hidden`` units; a configuration uses the first ``hidden``
    units over the input's ``width`` features."""

    def __init__(self, max_width: int, max_hidden: int, activation: str = "gelu",
                 bias: bool = True):
        super().__init__()
        check_choice("activation", activation, list(ACTIVATIONS))
        self.max_width, self.max_hidden, self.activation = max_width, max_hidden, activation
        self.fc = nn.Linear(max_width, max_hidden, bias=bias)
        self.proj = nn.Linear(max_hidden, max_width, bias=bias)

    def check(self, width: int, hidden: int) -> None:
        check_range("width", width, 1, self.max_width)
        check_range("mlp_hidden", hidden, 1, self.max_hidden)

    def forward(self, x: torch.Tensor, hidden: int | None = None) -> torch.Tensor:
        hidden = self.max_hidden if hidden is None else hidden
        self.check(x.shape[-1], hidden)
        h = ACTIVATIONS[self.activation](_sliced_linear(x, self.fc, hidden))
        return _sliced_linear(h, self.proj, x.shape[-1])

    def param_count(self, width: int, hidden: int) -> int:
        return 2 * width * hidden + ((hidden + width) if self.fc.bias is not None else 0)

    def export(self, width: int, hidden: int) -> DenseMLP:
        """The stand-alone layer of ``width`` inputs and the first ``hidden`` units."""
        self.check(width, hidden)
        dense = DenseMLP(width, hidden, self.activation, self.fc.bias is not None)
        dense.fc = _export_linear(self.fc, width, hidden)
        dense.proj = _export_linear(self.proj, hidden, width)
        return dense


ElasticNorm = ElasticLayerNorm | ElasticRMSNorm


def make_norm(norm: str, max_width: int) -> ElasticNorm:
    """An elastic ``"layernorm"`` or ``"rmsnorm"``."""
    check_choice("norm", norm, NORMS)
    return ElasticLayerNorm(max_width) if norm == "layernorm" else ElasticRMSNorm(max_width)


class ElasticBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``; a
    :class:`BlockChoice` picks its heads and hidden units, the input its width."""

    def __init__(self, max_width: int, max_heads: int, head_dim: int, max_mlp_hidden: int,
                 kv_heads: int | None = None, causal: bool = True, rotary: bool = False,
                 norm: str = "layernorm", activation: str = "gelu", bias: bool = True):
        super().__init__()
        self.norm1, self.norm2 = make_norm(norm, max_width), make_norm(norm, max_width)
        self.attn = ElasticAttention(max_width, max_heads, head_dim, kv_heads, causal, rotary,
                                     bias)
        self.mlp = ElasticMLP(max_width, max_mlp_hidden, activation, bias)

    def largest(self) -> BlockChoice:
        return BlockChoice(self.attn.max_heads, self.mlp.max_hidden)

    def check(self, width: int, choice: BlockChoice) -> None:
        self.attn.check(width, choice.heads)
        self.mlp.check(width, choice.mlp_hidden)

    def forward(self, x: torch.Tensor, choice: BlockChoice | None = None) -> torch.Tensor:
        choice = choice or self.largest()
        x = x + self.attn(self.norm1(x), choice.heads)
        out: torch.Tensor = x + self.mlp(self.norm2(x), choice.mlp_hidden)
        return out

    def param_count(self, width: int, choice: BlockChoice) -> int:
        return (self.norm1.param_count(width) + self.attn.param_count(width, choice.heads)
                + self.norm2.param_count(width) + self.mlp.param_count(width, choice.mlp_hidden))

    def export(self, width: int, choice: BlockChoice) -> DenseBlock:
        """The stand-alone block of ``width`` features and ``choice``."""
        self.check(width, choice)
        return DenseBlock(self.norm1.export(width), self.attn.export(width, choice.heads),
                          self.norm2.export(width), self.mlp.export(width, choice.mlp_hidden))


class ElasticGPT(nn.Module):
    """A GPT-style decoder holding its largest network: ``max_depth`` blocks of ``max_width``
    features, ``max_heads`` heads of ``head_dim`` and ``max_mlp_hidden`` units, over sequences
    of up to ``context`` tokens. ``positions`` is ``"learned"`` (an embedding added to the
    tokens') or ``"rotary"`` (RoPE in every attention); ``tie_weights`` shares the token
    embedding with the language-model head.

    ``forward(tokens, config)`` runs the sub-network :class:`SubnetConfig` (None: the largest)
    and returns logits (N, T, vocab); ``export(config)`` gives the matching :class:`DenseGPT`."""

    def __init__(self, vocab_size: int, max_width: int, max_depth: int, max_heads: int,
                 head_dim: int, max_mlp_hidden: int, context: int, positions: str = "learned",
                 norm: str = "layernorm", causal: bool = True, tie_weights: bool = False,
                 kv_heads: int | None = None, activation: str = "gelu", bias: bool = True):
        super().__init__()
        check_choice("positions", positions, POSITIONS)
        self.max_width, self.max_depth, self.context = max_width, max_depth, context
        self.tok = ElasticEmbedding(vocab_size, max_width)
        self.pos = ElasticEmbedding(context, max_width) if positions == "learned" else None
        self.blocks = nn.ModuleList(
            ElasticBlock(max_width, max_heads, head_dim, max_mlp_hidden, kv_heads, causal,
                         positions == "rotary", norm, activation, bias)
            for _ in range(max_depth))
        self.norm = make_norm(norm, max_width)
        self.head = nn.Linear(max_width, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok.weight

    def _blocks(self, depth: int) -> list[ElasticBlock]:
        return cast(list[ElasticBlock], list(self.blocks[:depth]))

    def largest(self) -> SubnetConfig:
        """The configuration of the whole network."""
        return SubnetConfig(self.max_width, self.max_depth,
                            tuple(block.largest() for block in self._blocks(self.max_depth)))

    def check(self, config: SubnetConfig, length: int | None = None) -> None:
        """Refuses a configuration (or a sequence ``length``) this network cannot run."""
        if length is not None and length > self.context:
            raise ConfigError(f"context length {length} is larger than the model's "
                              f"{self.context} positions")
        check_range("width", config.width, 1, self.max_width)
        check_range("depth", config.depth, 1, self.max_depth)
        for block, choice in zip(self._blocks(config.depth), config.blocks):
            block.check(config.width, choice)

    def forward(self, tokens: torch.Tensor, config: SubnetConfig | None = None) -> torch.Tensor:
        if tokens.dim() != 2:
            raise ConfigError(f"tokens must be shaped (batch, sequence), got {tuple(tokens.shape)}")
        config = config or self.largest()
        self.check(config, tokens.shape[1])
        x = self.tok(tokens, config.width)
        if self.pos is not None:
            x = x + self.pos(torch.arange(tokens.shape[1], device=tokens.device), config.width)
        for block, choice in zip(self._blocks(config.depth), config.blocks):
            x = block(x, choice)
        return _sliced_linear(self.norm(x), self.head, self.head.out_features)

    def non_embedding_params(self, config: SubnetConfig | None = None) -> int:
        """Parameters of the sub-network's blocks and final norm (no embeddings, no head), as
        :func:`count_non_embedding_params` counts them on its export, without building it."""
        config = config or self.largest()
        self.check(config)
        blocks = zip(self._blocks(config.depth), config.blocks)
        return (sum(b.param_count(config.width, c) for b, c in blocks)
                + self.norm.param_count(config.width))

    def export(self, config: SubnetConfig | None = None) -> DenseGPT:
        """The stand-alone :class:`DenseGPT` of ``config`` (None: the largest), with copies of
        this network's weights."""
        config = config or self.largest()
        self.check(config)
        w = config.width
        tok = self.tok.export(w)
        head = _export_linear(self.head, w, self.head.out_features)
        if self.head.weight is self.tok.weight:
            head.weight = tok.weight
        blocks = [b.export(w, c) for b, c in zip(self._blocks(config.depth), config.blocks)]
        pos = self.pos.export(w) if self.pos is not None else None
        dense = DenseGPT(tok, pos, blocks, self.norm.export(w), head)
        return dense.train(self.training)
