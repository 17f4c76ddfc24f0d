"""Networks of the ``mobilenet`` space: stand-alone ones of plain torch modules, and the
shared ones whose searched blocks are elastic blocks of a weight store run at one
configuration each."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.ports.architecture import Architecture
from frugalnas.nn.elastic import ElasticMBConv, MBConv, MBConvConfig

if TYPE_CHECKING:
    from frugalnas.spaces.mobilenet.space import MobileNetSpace


class Resize(nn.Module):
    """Bilinear resize of the input to ``size`` x ``size`` (the space's ``resolution``)."""

    def __init__(self, size: int):
        super().__init__()
        self.size = int(size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] == self.size and x.shape[-2] == self.size:
            return x
        return F.interpolate(x, size=(self.size, self.size), mode="bilinear", align_corners=False)

    def extra_repr(self) -> str:
        # The size is part of the layer's configuration (latency tables key layers by repr).
        return f"size={self.size}"


def make_stem(space: MobileNetSpace, input_shape: Sequence[int],
              resolution: int | None = None) -> nn.Sequential:
    """Resize (to ``resolution`` when given), 3x3 convolution, batch norm, ReLU6."""
    layers: list[nn.Module] = [Resize(resolution)] if resolution else []
    c = space.scaled_channels(space.stem_channels)
    layers += [nn.Conv2d(int(input_shape[0]), c, 3, space.stem_stride_for(input_shape), 1,
                         bias=False), nn.BatchNorm2d(c), nn.ReLU6()]
    return nn.Sequential(*layers)


def make_first(space: MobileNetSpace) -> MBConv:
    """MobileNetV2's first bottleneck: ratio 1, kernel 3, stride 1 (not searched)."""
    return MBConv(space.scaled_channels(space.stem_channels),
                  space.scaled_channels(space.first_channels), 3, 1)


def make_head(space: MobileNetSpace, num_classes: int) -> nn.Sequential:
    """1x1 convolution to the head width, batch norm, ReLU6, pooling, dropout, classifier."""
    cin, width = space.stage_channels()[-1][1], space.head_width()
    layers: list[nn.Module] = [nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width),
                               nn.ReLU6(), nn.AdaptiveAvgPool2d(1), nn.Flatten()]
    if space.dropout > 0:
        layers.append(nn.Dropout(space.dropout))
    layers.append(nn.Linear(width, int(num_classes)))
    return nn.Sequential(*layers)


class MobileNetNetwork(nn.Module):
    """Stem, blocks, head, run in order; the blocks are listed for block-wise components
    (:class:`~frugalnas.ports.network.BlockNetwork`)."""

    def __init__(self, stem: nn.Module, blocks: Sequence[nn.Module], head: nn.Module):
        super().__init__()
        self.stem, self.blocks, self.head = stem, nn.ModuleList(blocks), head

    def forward_blocks(self) -> list[nn.Module]:
        return [self.stem, *self.blocks, self.head]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.stem(x)
        for block in self.blocks:
            x = block(x)
        return self.head(x)


def build_network(space: MobileNetSpace, arch: Architecture, num_classes: int,
                  input_shape: Sequence[int]) -> MobileNetNetwork:
    """The stand-alone network of ``arch`` with fresh weights."""
    blocks: list[nn.Module] = [make_first(space)]
    for stage, (cin, cout), configs in zip(space.stages, space.stage_channels(),
                                           space.block_configs(arch)):
        for b, config in enumerate(configs):
            blocks.append(MBConv(cin if b == 0 else cout, cout, config.kernel, config.expand,
                                 stage.stride if b == 0 else 1, config.se))
    return MobileNetNetwork(make_stem(space, input_shape, space.resolution_of(arch)), blocks,
                            make_head(space, num_classes))


class ActiveBlock(nn.Module):
    """An elastic block of the weight store run at one configuration. The configuration
    lives here, not in the shared block, so networks of different architectures can use one
    block at the same time."""

    def __init__(self, block: ElasticMBConv, config: MBConvConfig):
        super().__init__()
        self.block, self.config = block, config

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.block(x, self.config)

    def export(self) -> MBConv:
        return self.block.export(self.config)

    def extra_repr(self) -> str:
        c = self.config
        return f"kernel={c.kernel}, expand={c.expand}, se={c.se}"
