"""An elastic vision transformer: the image split into square patches, each projected to the
chosen width, learned positions added, bidirectional pre-norm blocks (the
:class:`~frugalnas.nn.transformer.ElasticBlock` of the language models, without the causal
mask), a final norm, the mean over patches and a linear classifier, as ViT (Dosovitskiy et
al., 2021) with global average pooling and as AutoFormer (Chen et al., 2021) searches it.

:class:`ElasticViT` holds the largest network of every patch size: one patch projection and
one table of positions per patch size (a patch size changes the kernel and the number of
patches), and blocks, final norm and classifier shared by all of them. A sub-network
(:class:`ViTSubnet`) picks a patch size and a :class:`~frugalnas.nn.transformer.SubnetConfig`
(width, depth, per block heads and MLP units) and is computed from the first slices of those
weights. ``export`` gives a :class:`DenseViT` of plain torch modules computing the same
output, bitwise on the CPU.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import cast

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.nn.dense_transformer import DenseBlock, export_linear, sliced_linear
from frugalnas.nn.transformer import (NORMS, ElasticBlock, ElasticEmbedding, SubnetConfig,
                                      make_norm)
from frugalnas.ports.errors import ConfigError, check_choice, check_range


@dataclass(frozen=True)
class ViTSubnet:
    """A sub-network of an :class:`ElasticViT`: the patch size and the transformer's shape."""

    patch: int
    config: SubnetConfig


class ElasticPatches(nn.Module):
    """Non-overlapping ``patch`` x ``patch`` patches of a ``channels``-channel image, each
    projected to ``max_width`` features (a convolution of kernel and stride ``patch``); a
    configuration keeps the first ``width`` features. Returns (N, patches, width)."""

    def __init__(self, channels: int, max_width: int, patch: int):
        super().__init__()
        self.proj = nn.Conv2d(channels, max_width, patch, stride=patch)
        self.patch, self.max_width = patch, max_width

    def forward(self, images: torch.Tensor, width: int) -> torch.Tensor:
        weight = self.proj.weight[:width].contiguous()
        bias = self.proj.bias[:width].contiguous() if self.proj.bias is not None else None
        return F.conv2d(images, weight, bias, stride=self.patch).flatten(2).transpose(1, 2)

    def export(self, width: int) -> nn.Conv2d:
        """A plain convolution of the first ``width`` output channels."""
        conv = nn.Conv2d(self.proj.in_channels, width, self.patch, stride=self.patch)
        with torch.no_grad():
            conv.weight.copy_(self.proj.weight[:width])
            if self.proj.bias is not None and conv.bias is not None:
                conv.bias.copy_(self.proj.bias[:width])
        return conv


def patch_count(image_size: int, patch: int) -> int:
    """Patches of an ``image_size`` square image (the size must be a multiple of ``patch``)."""
    if image_size % patch:
        raise ConfigError(f"patch size {patch} does not divide the image size {image_size}")
    return (image_size // patch) ** 2


class ElasticViT(nn.Module):
    """A vision transformer holding its largest network for each of ``patch_sizes``:
    ``max_depth`` bidirectional blocks of ``max_width`` features, ``max_heads`` heads of
    ``head_dim``, ``max_mlp_hidden`` MLP units, over ``channels`` x ``image_size`` x
    ``image_size`` images, classifying into ``num_classes``. ``forward(images, subnet)`` runs
    the :class:`ViTSubnet` (None: the largest of the first patch size) and returns logits (N,
    classes); ``export(subnet)`` gives the matching :class:`DenseViT`."""

    def __init__(self, image_size: int, channels: int, num_classes: int,
                 patch_sizes: Sequence[int], max_width: int, max_depth: int, max_heads: int,
                 head_dim: int, max_mlp_hidden: int, norm: str = "layernorm"):
        super().__init__()
        check_choice("norm", norm, NORMS)
        if not patch_sizes:
            raise ConfigError("a vision transformer needs at least one patch size")
        self.image_size, self.num_classes = image_size, num_classes
        self.patch_sizes = tuple(int(p) for p in patch_sizes)
        self.max_width, self.max_depth = max_width, max_depth
        self.patches = nn.ModuleDict({str(p): ElasticPatches(channels, max_width, p)
                                      for p in self.patch_sizes})
        self.pos = nn.ModuleDict({str(p): ElasticEmbedding(patch_count(image_size, p),
                                                           max_width)
                                  for p in self.patch_sizes})
        self.blocks = nn.ModuleList(
            ElasticBlock(max_width, max_heads, head_dim, max_mlp_hidden, causal=False,
                         norm=norm)
            for _ in range(max_depth))
        self.norm = make_norm(norm, max_width)
        self.head = nn.Linear(max_width, num_classes)

    def _blocks(self) -> list[ElasticBlock]:
        return [cast(ElasticBlock, b) for b in self.blocks]

    def _stage(self, subnet: ViTSubnet) -> tuple[ElasticPatches, ElasticEmbedding]:
        key = str(subnet.patch)
        return cast(ElasticPatches, self.patches[key]), cast(ElasticEmbedding, self.pos[key])

    def largest(self, patch: int | None = None) -> ViTSubnet:
        """The whole network at ``patch`` (default: the first patch size)."""
        blocks = tuple(b.largest() for b in self._blocks())
        return ViTSubnet(self.patch_sizes[0] if patch is None else patch,
                         SubnetConfig(self.max_width, self.max_depth, blocks))

    def check(self, subnet: ViTSubnet) -> None:
        """Refuses a sub-network this network cannot run."""
        check_choice("patch size", subnet.patch, self.patch_sizes)
        config = subnet.config
        check_range("width", config.width, 1, self.max_width)
        check_range("depth", config.depth, 1, self.max_depth)
        for block, choice in zip(self._blocks(), config.blocks):
            block.check(config.width, choice)

    def forward(self, images: torch.Tensor, subnet: ViTSubnet | None = None) -> torch.Tensor:
        subnet = subnet or self.largest()
        self.check(subnet)
        width, (patches, pos) = subnet.config.width, self._stage(subnet)
        x = patches(images, width)
        x = x + pos(torch.arange(x.shape[1], device=x.device), width)
        for block, choice in zip(self._blocks(), subnet.config.blocks):
            x = block(x, choice)
        pooled = self.norm(x).mean(dim=1)
        return sliced_linear(pooled, self.head, self.num_classes)

    def export(self, subnet: ViTSubnet | None = None) -> DenseViT:
        """The stand-alone :class:`DenseViT` of ``subnet``, with copies of its weights."""
        subnet = subnet or self.largest()
        self.check(subnet)
        w, (patches, pos) = subnet.config.width, self._stage(subnet)
        blocks = [b.export(w, c) for b, c in zip(self._blocks(), subnet.config.blocks)]
        head = export_linear(self.head, w, self.num_classes)
        return DenseViT(patches.export(w), pos.export(w), blocks, self.norm.export(w),
                        head).train(self.training)


class ViTEmbedding(nn.Module):
    """The input stage of a :class:`DenseViT`: patches projected, positions added."""

    def __init__(self, patches: nn.Conv2d, pos: nn.Embedding):
        super().__init__()
        self.patches, self.pos = patches, pos

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x: torch.Tensor = self.patches(images).flatten(2).transpose(1, 2)
        out: torch.Tensor = x + self.pos(torch.arange(x.shape[1], device=x.device))
        return out


class ViTOutput(nn.Module):
    """The output stage of a :class:`DenseViT`: final norm, mean over patches, classifier."""

    def __init__(self, norm: nn.Module, head: nn.Linear):
        super().__init__()
        self.norm, self.head = norm, head

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        logits: torch.Tensor = self.head(self.norm(x).mean(dim=1))
        return logits


class DenseViT(nn.Module):
    """A plain vision transformer: input stage, blocks, output stage, each called once in
    order, so it is a :class:`~frugalnas.ports.network.BlockNetwork` for the out-of-core
    backend. ``forward(images)`` returns logits (N, classes)."""

    def __init__(self, patches: nn.Conv2d, pos: nn.Embedding, blocks: list[DenseBlock],
                 norm: nn.Module, head: nn.Linear):
        super().__init__()
        self.embedding = ViTEmbedding(patches, pos)
        self.blocks = nn.ModuleList(blocks)
        self.output = ViTOutput(norm, head)

    def forward_blocks(self) -> list[nn.Module]:
        """The stages in forward order: embedding, each block, output."""
        return [self.embedding, *self.blocks, self.output]

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        x = self.embedding(images)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.output(x)
        return logits
