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

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Generic, Protocol, TypeVar, cast

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.nn.dense_transformer import (ACTIVATIONS, ROPE_BASE, DenseAttention, DenseBlock,
                                            DenseGPT, DenseMLP, GPTEmbedding, GPTOutput,
                                            apply_rotary, attend, count_non_embedding_params,
                                            export_linear, export_program, sliced_linear)
from frugalnas.ports.errors import ConfigError, check_choice, check_range

__all__ = ["ACTIVATIONS", "NORMS", "POSITIONS", "ROPE_BASE", "BlockChoice", "DenseAttention",
           "DenseBlock", "DenseGPT", "DenseMLP", "ElasticAttention", "ElasticBlock",
           "ElasticEmbedding", "ElasticGPT", "ActiveNetwork", "ElasticLayerNorm", "ElasticMLP",
           "ElasticRMSNorm", "GPTConfig", "GPTEmbedding", "GPTOutput", "SubnetConfig", "apply_rotary", "attend",
           "count_non_embedding_params", "export_program", "make_norm"]

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
                 bias: bool = True, rope_base: float = ROPE_BASE):
        super().__init__()
        kv_heads = kv_heads or max_heads
        if kv_heads < 1 or max_heads % kv_heads:
            raise ConfigError(f"kv_heads {kv_heads} must divide max_heads {max_heads}")
        if rotary and head_dim % 2:
            raise ConfigError(f"rotary positions need an even head_dim, got {head_dim}")
        self.max_width, self.max_heads, self.head_dim = max_width, max_heads, head_dim
        self.group, self.causal, self.rotary = max_heads // kv_heads, causal, rotary
        self.rope_base = rope_base
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
        q = sliced_linear(x, self.q, inner)
        k, v = sliced_linear(x, self.k, kv_inner), sliced_linear(x, self.v, kv_inner)
        y = attend(q, k, v, self.head_dim, self.causal, self.rotary, self.rope_base)
        return sliced_linear(y, self.out, x.shape[-1])

    def param_count(self, width: int, heads: int) -> int:
        inner, kv_inner = heads * self.head_dim, heads // self.group * self.head_dim
        biases = (inner + 2 * kv_inner + width) if self.out.bias is not None else 0
        return 2 * width * (inner + kv_inner) + biases

    def export(self, width: int, heads: int) -> DenseAttention:
        """The stand-alone attention of ``width`` inputs and the first ``heads`` heads."""
        self.check(width, heads)
        kv_heads, d = heads // self.group, self.head_dim
        dense = DenseAttention(width, heads, d, kv_heads, self.causal, self.rotary,
                               self.out.bias is not None, self.rope_base)
        dense.q = export_linear(self.q, width, heads * d)
        dense.k = export_linear(self.k, width, kv_heads * d)
        dense.v = export_linear(self.v, width, kv_heads * d)
        dense.out = export_linear(self.out, heads * d, width)
        return dense


class ElasticMLP(nn.Module):
    """Feed-forward layer of ``max_hidden`` units; a configuration uses the first ``hidden``
    units over the input's ``width`` features. ``gated`` adds a ``gate`` projection whose
    activation multiplies ``fc``'s output (SwiGLU with ``activation="silu"``)."""

    def __init__(self, max_width: int, max_hidden: int, activation: str = "gelu",
                 bias: bool = True, gated: bool = False):
        super().__init__()
        check_choice("activation", activation, list(ACTIVATIONS))
        self.max_width, self.max_hidden, self.activation = max_width, max_hidden, activation
        self.fc = nn.Linear(max_width, max_hidden, bias=bias)
        self.gate = nn.Linear(max_width, max_hidden, bias=bias) if gated else None
        self.proj = nn.Linear(max_hidden, max_width, bias=bias)

    def check(self, width: int, hidden: int) -> None:
        check_range("width", width, 1, self.max_width)
        check_range("mlp_hidden", hidden, 1, self.max_hidden)

    def forward(self, x: torch.Tensor, hidden: int | None = None) -> torch.Tensor:
        hidden = self.max_hidden if hidden is None else hidden
        self.check(x.shape[-1], hidden)
        act = ACTIVATIONS[self.activation]
        h = act(sliced_linear(x, self.fc, hidden)) if self.gate is None else \
            act(sliced_linear(x, self.gate, hidden)) * sliced_linear(x, self.fc, hidden)
        return sliced_linear(h, self.proj, x.shape[-1])

    def param_count(self, width: int, hidden: int) -> int:
        inputs = 2 if self.gate is not None else 1
        biases = (inputs * hidden + width) if self.fc.bias is not None else 0
        return (inputs + 1) * width * hidden + biases

    def export(self, width: int, hidden: int) -> DenseMLP:
        """The stand-alone layer of ``width`` inputs and the first ``hidden`` units."""
        self.check(width, hidden)
        dense = DenseMLP(width, hidden, self.activation, self.fc.bias is not None,
                         self.gate is not None)
        dense.fc = export_linear(self.fc, width, hidden)
        if self.gate is not None:
            dense.gate = export_linear(self.gate, width, hidden)
        dense.proj = export_linear(self.proj, hidden, width)
        return dense


ElasticNorm = ElasticLayerNorm | ElasticRMSNorm


def make_norm(norm: str, max_width: int, eps: float = 1e-5) -> ElasticNorm:
    """An elastic ``"layernorm"`` or ``"rmsnorm"``."""
    check_choice("norm", norm, NORMS)
    return ElasticLayerNorm(max_width, eps) if norm == "layernorm" else \
        ElasticRMSNorm(max_width, eps)


class ElasticBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``; a
    :class:`BlockChoice` picks its heads and hidden units, the input its width."""

    def __init__(self, max_width: int, max_heads: int, head_dim: int, max_mlp_hidden: int,
                 kv_heads: int | None = None, causal: bool = True, rotary: bool = False,
                 norm: str = "layernorm", activation: str = "gelu", bias: bool = True,
                 gated: bool = False, norm_eps: float = 1e-5, rope_base: float = ROPE_BASE):
        super().__init__()
        self.norm1 = make_norm(norm, max_width, norm_eps)
        self.norm2 = make_norm(norm, max_width, norm_eps)
        self.attn = ElasticAttention(max_width, max_heads, head_dim, kv_heads, causal, rotary,
                                     bias, rope_base)
        self.mlp = ElasticMLP(max_width, max_mlp_hidden, activation, bias, gated)

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


@dataclass(frozen=True)
class GPTConfig:
    """The shape of an :class:`ElasticGPT`'s largest network, as its constructor takes it
    (what a checkpoint stores beside the weights)."""

    vocab_size: int
    max_width: int
    max_depth: int
    max_heads: int
    head_dim: int
    max_mlp_hidden: int
    context: int
    positions: str = "learned"
    norm: str = "layernorm"
    causal: bool = True
    tie_weights: bool = False
    kv_heads: int | None = None
    activation: str = "gelu"
    bias: bool = True
    gated: bool = False
    norm_eps: float = 1e-5
    rope_base: float = ROPE_BASE

    @property
    def group(self) -> int:
        """Query heads per key/value head (1: multi-head attention)."""
        return self.max_heads // (self.kv_heads or self.max_heads)


class ElasticGPT(nn.Module):
    """A GPT-style decoder holding its largest network: ``max_depth`` blocks of ``max_width``
    features, ``max_heads`` heads of ``head_dim`` and ``max_mlp_hidden`` units, over sequences
    of up to ``context`` tokens. ``positions`` is ``"learned"`` (an embedding added to the
    tokens') or ``"rotary"`` (RoPE in every attention, angles of base ``rope_base``);
    ``tie_weights`` shares the token embedding with the language-model head; ``gated`` makes
    every MLP a gated one (SwiGLU with ``activation="silu"``, as Llama's).

    ``forward(tokens, config)`` runs the sub-network :class:`SubnetConfig` (None: the largest)
    and returns logits (N, T, vocab); ``export(config)`` gives the matching :class:`DenseGPT`.

    ``layer_order`` lists the blocks from the most to the least important (default: in
    order): a sub-network of depth ``d`` runs the first ``d`` blocks of that list, in the
    network's order, so an importance ranking decides which layers a shallower network keeps
    without changing the largest network's outputs."""

    def __init__(self, vocab_size: int, max_width: int, max_depth: int, max_heads: int,
                 head_dim: int, max_mlp_hidden: int, context: int, positions: str = "learned",
                 norm: str = "layernorm", causal: bool = True, tie_weights: bool = False,
                 kv_heads: int | None = None, activation: str = "gelu", bias: bool = True,
                 gated: bool = False, norm_eps: float = 1e-5, rope_base: float = ROPE_BASE):
        super().__init__()
        check_choice("positions", positions, POSITIONS)
        self.config = GPTConfig(vocab_size, max_width, max_depth, max_heads, head_dim,
                                max_mlp_hidden, context, positions, norm, causal, tie_weights,
                                kv_heads, activation, bias, gated, norm_eps, rope_base)
        self.max_width, self.max_depth, self.context = max_width, max_depth, context
        self.layer_order: tuple[int, ...] = tuple(range(max_depth))
        self.tok = ElasticEmbedding(vocab_size, max_width)
        self.pos = ElasticEmbedding(context, max_width) if positions == "learned" else None
        self.blocks = nn.ModuleList(
            ElasticBlock(max_width, max_heads, head_dim, max_mlp_hidden, kv_heads, causal,
                         positions == "rotary", norm, activation, bias, gated, norm_eps,
                         rope_base)
            for _ in range(max_depth))
        self.norm = make_norm(norm, max_width, norm_eps)
        self.head = nn.Linear(max_width, vocab_size, bias=False)
        if tie_weights:
            self.head.weight = self.tok.weight

    @classmethod
    def from_config(cls, config: GPTConfig) -> ElasticGPT:
        """The network of ``config`` (weights as the constructor leaves them)."""
        return cls(**asdict(config))

    def set_layer_order(self, order: Sequence[int]) -> None:
        """Which blocks a shallower sub-network keeps: ``order`` ranks every block index,
        most important first."""
        order = tuple(int(i) for i in order)
        if sorted(order) != list(range(self.max_depth)):
            raise ConfigError(f"layer order {list(order)} must rank each of the "
                              f"{self.max_depth} blocks 0..{self.max_depth - 1} once")
        self.layer_order = order

    def _blocks(self, depth: int) -> list[ElasticBlock]:
        kept = sorted(self.layer_order[:depth])
        return [cast(ElasticBlock, self.blocks[i]) for i in kept]

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
        return sliced_linear(self.norm(x), self.head, self.head.out_features)

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
        head = export_linear(self.head, w, self.head.out_features)
        if self.head.weight is self.tok.weight:
            head.weight = tok.weight
        blocks = [b.export(w, c) for b, c in zip(self._blocks(config.depth), config.blocks)]
        pos = self.pos.export(w) if self.pos is not None else None
        dense = DenseGPT(tok, pos, blocks, self.norm.export(w), head)
        return dense.train(self.training)


ConfigT = TypeVar("ConfigT")
ConfigIn = TypeVar("ConfigIn", contravariant=True)


class Elastic(Protocol[ConfigIn]):
    """An elastic network: ``forward(x, config)`` runs one configuration on its weights,
    ``export(config)`` copies it out (:class:`ElasticGPT`, and the vision transformer's
    ``ElasticViT``)."""

    def __call__(self, x: torch.Tensor, config: ConfigIn) -> torch.Tensor: ...

    def export(self, config: ConfigIn) -> nn.Module: ...


class ActiveNetwork(nn.Module, Generic[ConfigT]):
    """The network of one configuration of an elastic network, computed on the elastic
    network's own weights (no copy: training it trains them)."""

    def __init__(self, supernet: nn.Module, config: ConfigT):
        super().__init__()
        self.supernet, self.config = supernet, config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return cast(Elastic[ConfigT], self.supernet)(x, self.config)

    def export(self) -> nn.Module:
        """A stand-alone copy of this network with its weights."""
        return cast(Elastic[ConfigT], self.supernet).export(self.config)
