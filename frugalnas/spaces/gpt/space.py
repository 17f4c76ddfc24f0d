"""The ``gpt`` macro space: decoder-only language models with a searched embedding width,
depth, and per layer the number of attention heads and the MLP ratio, in the manner of
HW-GPT-Bench's GPT-2 spaces (Sukthanker et al., 2024) scaled to what a CPU trains.

A network is: token embedding (+ learned or rotary positions) of the chosen width, ``depth``
pre-norm blocks (causal self-attention of ``heads`` heads of ``head_dim`` features, MLP of
``mlp_ratio x width`` hidden units), a final norm and the next-token head. Its decisions, text
form and variation are those of every layer-stack space (:mod:`frugalnas.spaces.stack.space`):
``gpt:w128/h4r4,h4r4,h2r2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from frugalnas.nn.transformer import NORMS, POSITIONS
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.capabilities import (CellGraph, OwnEncodings, ProgressiveShrinking,
                                          SandwichRule, WeightSharing, itself)
from frugalnas.ports.errors import check_choice, check_range
from frugalnas.spaces.gpt.network import build_network
from frugalnas.spaces.stack.space import WIDTH_KEY, LayerStackSpace

if TYPE_CHECKING:
    from torch import nn


class GPTSpace(LayerStackSpace):
    """Decoder-only language models: embedding width, depth, per-layer heads and MLP ratio;
    options widths, min_depth, max_depth, heads, mlp_ratios, head_dim, context, positions,
    norm. Weight sharing through elastic transformer blocks.

    ``widths``, ``heads`` and ``mlp_ratios`` are the choices of the embedding width, of each
    layer's number of heads (each ``head_dim`` wide) and of each layer's MLP ratio (hidden
    units = ratio x width); the depth ranges over ``min_depth..max_depth``. ``context`` is the
    longest sequence a network reads (its positions); ``positions`` is ``"learned"`` or
    ``"rotary"``; ``norm`` is ``"layernorm"`` or ``"rmsnorm"``. Networks predict the next
    token of a ``text`` dataset (the vocabulary comes from the data)."""

    name = "gpt"
    tasks = ("language-modelling",)
    capabilities = {
        WeightSharing: "frugalnas.spaces.gpt.supernet:GPTSharing",
        OwnEncodings: "frugalnas.spaces.stack.encodings:StackEncodings",
        SandwichRule: "frugalnas.spaces.stack.space:StackSandwich",
        ProgressiveShrinking: "frugalnas.spaces.stack.space:StackShrinking",
        CellGraph: itself}

    def __init__(self, widths: Sequence[int] = (64, 96, 128, 160, 192), min_depth: int = 2,
                 max_depth: int = 6, heads: Sequence[int] = (2, 4, 6),
                 mlp_ratios: Sequence[int] = (2, 3, 4), head_dim: int = 32, context: int = 256,
                 positions: str = "learned", norm: str = "layernorm"):
        super().__init__(widths, min_depth, max_depth, heads, mlp_ratios)
        check_range("head_dim", head_dim, 1)
        check_range("context", context, 1)
        check_choice("positions", positions, POSITIONS)
        check_choice("norm", norm, NORMS)
        self.head_dim, self.context = int(head_dim), int(context)
        self.positions, self.norm = positions, norm

    def build(self, arch: Architecture, num_classes: int,
              input_shape: tuple[int, ...]) -> nn.Module:
        """A stand-alone language model of ``arch`` with fresh weights: ``num_classes`` is
        the vocabulary size, ``input_shape`` ``(context,)``."""
        return build_network(self, arch, num_classes, input_shape)

    def cell_graph(self, arch: Architecture) -> list[tuple[str, str, str]]:
        """The network as a chain for drawings: embedding, one edge per layer labelled with
        its heads and MLP units, the head."""
        return self.layer_edges(arch, f"embedding ({arch.decisions[WIDTH_KEY]})",
                                "next-token head")

    def describe(self) -> dict[str, Any]:
        return {**super().describe(), "head_dim": self.head_dim, "context": self.context,
                "positions": self.positions, "norm": self.norm}
