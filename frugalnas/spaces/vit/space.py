"""The ``vit`` macro space: vision transformers with a searched patch size, embedding width,
depth, and per layer the number of attention heads and the MLP ratio, as AutoFormer (Chen et
al., ICCV 2021) searches them, scaled to what a CPU trains.

A network is: the image cut into square patches, each projected to the chosen width, learned
positions added, ``depth`` bidirectional pre-norm blocks (``heads`` heads of ``head_dim``
features, MLP of ``mlp_ratio x width`` hidden units), a final norm, the mean over patches and
a linear classifier (:mod:`frugalnas.nn.vision_transformer`).

Text form: ``vit:p<patch>w<width>/`` then the layers, each ``h<heads>r<ratio>``:
``vit:p4w64/h4r4,h2r2``.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from optuna.distributions import BaseDistribution, CategoricalDistribution

from frugalnas.nn.transformer import NORMS
from frugalnas.nn.vision_transformer import ViTSubnet
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.capabilities import (CellGraph, OwnEncodings, ProgressiveShrinking,
                                          SandwichRule, WeightSharing, itself)
from frugalnas.ports.errors import check_choice, check_range
from frugalnas.spaces.stack.space import WIDTH_KEY, LayerStackSpace, StackGenotype, choices
from frugalnas.spaces.vit.network import build_network

if TYPE_CHECKING:
    from torch import nn

PATCH_KEY = "patch_size"


class ViTGenotype(StackGenotype):
    """A ``vit`` architecture: ``vit:p<patch>w<width>/h<heads>r<ratio>,...``."""

    LETTERS: ClassVar[dict[str, str]] = {"p": PATCH_KEY, "w": WIDTH_KEY}


class ViTSpace(LayerStackSpace):
    """Vision transformers: patch size, embedding width, depth, per-layer heads and MLP
    ratio; options patch_sizes, widths, min_depth, max_depth, heads, mlp_ratios, head_dim,
    norm. Weight sharing through elastic transformer blocks.

    ``patch_sizes`` must divide the images' side (a 32 x 32 image: 2, 4, 8, 16); a smaller
    patch makes more tokens, so the largest network has the smallest patch. ``widths``,
    ``heads`` and ``mlp_ratios`` are the choices of the embedding width, of each layer's
    number of heads (each ``head_dim`` wide) and of each layer's MLP ratio (hidden units =
    ratio x width); the depth ranges over ``min_depth..max_depth``; ``norm`` is
    ``"layernorm"`` or ``"rmsnorm"``. Networks classify the images of a dataset."""

    name = "vit"
    genotype = ViTGenotype
    tasks = ("image-classification",)
    capabilities = {
        WeightSharing: "frugalnas.spaces.vit.supernet:ViTSharing",
        OwnEncodings: "frugalnas.spaces.stack.encodings:StackEncodings",
        SandwichRule: "frugalnas.spaces.stack.space:StackSandwich",
        ProgressiveShrinking: "frugalnas.spaces.stack.space:StackShrinking",
        CellGraph: itself}

    def __init__(self, patch_sizes: Sequence[int] = (4, 8), widths: Sequence[int] = (32, 48, 64),
                 min_depth: int = 1, max_depth: int = 4, heads: Sequence[int] = (1, 2, 4),
                 mlp_ratios: Sequence[int] = (2, 3, 4), head_dim: int = 16,
                 norm: str = "layernorm"):
        super().__init__(widths, min_depth, max_depth, heads, mlp_ratios)
        # largest patch first: a decision's last choice is its largest network
        self.patch_sizes = tuple(reversed(choices("patch_sizes", patch_sizes)))
        check_range("head_dim", head_dim, 1)
        check_choice("norm", norm, NORMS)
        self.head_dim, self.norm = int(head_dim), norm

    def _top(self) -> dict[str, BaseDistribution]:
        return {PATCH_KEY: CategoricalDistribution(self.patch_sizes), **super()._top()}

    def uniform(self, width: int, depth: int, heads: int, mlp_ratio: int,
                **top: Any) -> Architecture:
        """The network whose layers are all alike (``patch_size=`` defaults to the
        smallest)."""
        top.setdefault(PATCH_KEY, min(self.patch_sizes))
        return super().uniform(width, depth, heads, mlp_ratio, **top)

    def vit_subnet(self, arch: Architecture) -> ViTSubnet:
        """The patch size and transformer shape of ``arch``."""
        return ViTSubnet(int(arch.decisions[PATCH_KEY]), self.subnet_config(arch))

    def build(self, arch: Architecture, num_classes: int,
              input_shape: tuple[int, ...]) -> nn.Module:
        """A stand-alone vision transformer of ``arch`` with fresh weights for images of
        ``input_shape`` (C, H, W), H = W."""
        return build_network(self, arch, num_classes, input_shape)

    def cell_graph(self, arch: Architecture) -> list[tuple[str, str, str]]:
        """The network as a chain for drawings: patches, one edge per layer, the
        classifier."""
        d = arch.decisions
        first = f"{d[PATCH_KEY]}x{d[PATCH_KEY]} patches ({d[WIDTH_KEY]})"
        return self.layer_edges(arch, first, "classifier")

    def describe(self) -> dict[str, Any]:
        return {"patch_sizes": sorted(self.patch_sizes), **super().describe(),
                "head_dim": self.head_dim, "norm": self.norm}
