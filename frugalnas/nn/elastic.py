"""Elastic building blocks: one module holds the weights of its largest configuration, and
every smaller configuration is computed from them, so that sub-networks share weights without
copies (Once-for-All, Cai et al., ICLR 2020).

* :class:`ElasticConv2d`: elastic output and input width (the first channels), and elastic
  kernel size. A smaller kernel is the centre of the larger one passed through a learnt
  per-layer transformation (initialised to the identity). Going 7 -> 5 -> 3 takes two steps,
  as in Once-for-All.
* :class:`ElasticBatchNorm2d`: statistics and affine parameters of the first channels.
* :class:`ElasticMBConv`: an inverted residual (MobileNetV2's MBConv) with elastic expansion
  ratio, elastic depthwise kernel and optional squeeze-excite.

Every elastic block runs a configuration through ``forward(x, config)`` and turns it into a
stand-alone block of plain torch modules, carrying the same weights, with
``export(config)``. The two compute the same output (bitwise on the CPU): an elastic forward
calls the same functional operations on contiguous copies of the same slices.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.ports.errors import ConfigError


def make_divisible(value: float, divisor: int = 8) -> int:
    """``value`` rounded to a multiple of ``divisor``, never below ``divisor`` nor more than
    10 % below ``value`` (MobileNet's channel rounding)."""
    rounded = max(divisor, int(value + divisor / 2) // divisor * divisor)
    return rounded + divisor if rounded < 0.9 * value else rounded


def _check_choices(what: str, choices: Sequence[int]) -> tuple[int, ...]:
    values = tuple(sorted({int(c) for c in choices}))
    if not values or values[0] < 1:
        raise ConfigError(f"{what} needs at least one positive choice, got {list(choices)!r}")
    return values


class ElasticConv2d(nn.Module):
    """A convolution whose weight is that of its largest configuration (``max_out`` x
    ``max_in / groups`` x ``max(kernel_sizes)``). ``forward(x, out_channels, kernel)`` uses
    the first ``out_channels`` filters over the input's channels (the first ones of the stored
    weight), with a ``kernel`` from ``kernel_sizes`` (odd sizes). ``depthwise=True`` makes one
    filter per input channel (``groups`` = channels)."""

    def __init__(self, max_in: int, max_out: int, kernel_sizes: Sequence[int] = (3,),
                 stride: int = 1, depthwise: bool = False, bias: bool = False):
        super().__init__()
        self.kernel_sizes = _check_choices("ElasticConv2d kernel_sizes", kernel_sizes)
        if any(k % 2 == 0 for k in self.kernel_sizes):
            raise ConfigError(f"ElasticConv2d kernel sizes must be odd, got {list(kernel_sizes)}")
        if depthwise and max_in != max_out:
            raise ConfigError(f"a depthwise ElasticConv2d has as many outputs as inputs, got "
                              f"{max_in} and {max_out}")
        self.max_in, self.max_out, self.stride, self.depthwise = max_in, max_out, stride, depthwise
        k = self.kernel_sizes[-1]
        self.weight = nn.Parameter(torch.empty(max_out, 1 if depthwise else max_in, k, k))
        self.bias = nn.Parameter(torch.zeros(max_out)) if bias else None
        nn.init.kaiming_normal_(self.weight, mode="fan_out")
        # One transformation per step down (7 -> 5, 5 -> 3), shared by all filters.
        self.transforms = nn.ParameterDict({
            f"{big}to{small}": nn.Parameter(torch.eye(small * small))
            for big, small in zip(self.kernel_sizes[::-1], self.kernel_sizes[-2::-1])})

    def kernel_weight(self, out_channels: int, in_channels: int, kernel: int) -> torch.Tensor:
        """The weight of one configuration, contiguous."""
        if kernel not in self.kernel_sizes:
            raise ConfigError(f"kernel {kernel} is not one of this layer's kernel sizes "
                              f"{list(self.kernel_sizes)}")
        if not 0 < out_channels <= self.max_out:
            raise ConfigError(f"out_channels {out_channels} outside 1..{self.max_out}")
        w = self.weight[:out_channels] if self.depthwise else self.weight[:out_channels, :in_channels]
        size = self.kernel_sizes[-1]
        for small in self.kernel_sizes[-2::-1]:
            if small < kernel:
                break
            start = (size - small) // 2
            centre = w[:, :, start:start + small, start:start + small]
            flat = centre.reshape(-1, small * small) @ self.transforms[f"{size}to{small}"]
            w, size = flat.reshape(centre.shape), small
        return w.contiguous()

    def forward(self, x: torch.Tensor, out_channels: int | None = None,
                kernel: int | None = None) -> torch.Tensor:
        cin = x.shape[1]
        cout = cin if self.depthwise else (out_channels or self.max_out)
        k = kernel or self.kernel_sizes[-1]
        w = self.kernel_weight(cout, cin, k)
        b = None if self.bias is None else self.bias[:cout].contiguous()
        return F.conv2d(x, w, b, self.stride, k // 2, 1, cin if self.depthwise else 1)

    def export(self, in_channels: int, out_channels: int, kernel: int) -> nn.Conv2d:
        """A plain ``nn.Conv2d`` of one configuration, with this layer's weights."""
        cout = in_channels if self.depthwise else out_channels
        conv = nn.Conv2d(in_channels, cout, kernel, self.stride, kernel // 2,
                         groups=in_channels if self.depthwise else 1, bias=self.bias is not None)
        with torch.no_grad():
            conv.weight.copy_(self.kernel_weight(cout, in_channels, kernel))
            if self.bias is not None:
                conv.bias.copy_(self.bias[:cout])
        return conv


class ElasticBatchNorm2d(nn.BatchNorm2d):
    """Batch normalisation of the first ``C`` channels of ``max_channels`` (C = the input's
    channels); running statistics of those channels are updated in place."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        c = x.shape[1]
        if c == self.num_features:
            return super().forward(x)
        # The running-statistics update of nn.BatchNorm2d: ``momentum=None`` (batch-norm
        # recalibration sets it) averages cumulatively over the batches seen.
        factor = 0.0
        if self.training and self.track_running_stats and self.num_batches_tracked is not None:
            self.num_batches_tracked.add_(1)
            factor = (1.0 / float(self.num_batches_tracked) if self.momentum is None
                      else self.momentum)
        use_batch = self.training or not self.track_running_stats
        return F.batch_norm(x, self.running_mean[:c], self.running_var[:c], self.weight[:c],
                            self.bias[:c], use_batch, factor, self.eps)

    def export(self, channels: int) -> nn.BatchNorm2d:
        """A plain ``nn.BatchNorm2d`` of the first ``channels``, with their statistics."""
        bn = nn.BatchNorm2d(channels, eps=self.eps, momentum=self.momentum)
        with torch.no_grad():
            bn.weight.copy_(self.weight[:channels])
            bn.bias.copy_(self.bias[:channels])
            bn.running_mean.copy_(self.running_mean[:channels])
            bn.running_var.copy_(self.running_var[:channels])
            bn.num_batches_tracked.copy_(self.num_batches_tracked)
        return bn


@dataclass(frozen=True)
class MBConvConfig:
    """One configuration of an :class:`ElasticMBConv`."""

    kernel: int
    expand: int
    se: bool = False


def se_channels(hidden: int) -> int:
    """Squeeze-excite bottleneck width for ``hidden`` channels (a quarter, rounded to 8)."""
    return make_divisible(hidden / 4, 8)


class SqueezeExcite(nn.Module):
    """Squeeze-excite (Hu et al., CVPR 2018) with a hard sigmoid, as in MobileNetV3."""

    def __init__(self, channels: int, squeeze: int):
        super().__init__()
        self.reduce = nn.Conv2d(channels, squeeze, 1)
        self.expand = nn.Conv2d(squeeze, channels, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        s = F.adaptive_avg_pool2d(x, 1)
        s = F.hardsigmoid(self.expand(F.relu(self.reduce(s))))
        return x * s


class MBConv(nn.Module):
    """A stand-alone inverted residual: 1x1 expansion (omitted at ratio 1), depthwise
    ``kernel`` x ``kernel`` convolution (``stride``), optional squeeze-excite, 1x1 projection;
    a residual connection where shapes allow (stride 1, as many outputs as inputs)."""

    def __init__(self, in_channels: int, out_channels: int, kernel: int, expand: int,
                 stride: int = 1, se: bool = False):
        super().__init__()
        hidden = make_divisible(in_channels * expand) if expand != 1 else in_channels
        self.residual = stride == 1 and in_channels == out_channels
        self.expand_conv = (nn.Sequential(nn.Conv2d(in_channels, hidden, 1, bias=False),
                                          nn.BatchNorm2d(hidden), nn.ReLU6())
                            if expand != 1 else None)
        self.depthwise = nn.Sequential(
            nn.Conv2d(hidden, hidden, kernel, stride, kernel // 2, groups=hidden, bias=False),
            nn.BatchNorm2d(hidden), nn.ReLU6())
        self.se = SqueezeExcite(hidden, se_channels(hidden)) if se else None
        self.project = nn.Sequential(nn.Conv2d(hidden, out_channels, 1, bias=False),
                                     nn.BatchNorm2d(out_channels))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.expand_conv(x) if self.expand_conv is not None else x
        h = self.depthwise(h)
        if self.se is not None:
            h = self.se(h)
        h = self.project(h)
        return x + h if self.residual else h


class ElasticMBConv(nn.Module):
    """An inverted residual holding the weights of its largest configuration: expansion
    ``max(expand_ratios)``, kernel ``max(kernel_sizes)``, and squeeze-excite weights when
    ``se`` may be on. ``forward(x, config)`` runs one :class:`MBConvConfig` on the first
    hidden channels; ``export`` gives the matching :class:`MBConv`. Expansion ratio 1 (no
    expansion layer) cannot be elastic: it is either the only ratio or not one."""

    def __init__(self, in_channels: int, out_channels: int,
                 kernel_sizes: Sequence[int] = (3, 5, 7), expand_ratios: Sequence[int] = (3, 4, 6),
                 stride: int = 1, se: bool = True):
        super().__init__()
        self.kernel_sizes = _check_choices("ElasticMBConv kernel_sizes", kernel_sizes)
        self.expand_ratios = _check_choices("ElasticMBConv expand_ratios", expand_ratios)
        if 1 in self.expand_ratios and len(self.expand_ratios) > 1:
            raise ConfigError(f"expansion ratio 1 cannot be mixed with others, got "
                              f"{list(expand_ratios)}")
        self.in_channels, self.out_channels, self.stride = in_channels, out_channels, stride
        self.has_expansion = self.expand_ratios != (1,)
        self.residual = stride == 1 and in_channels == out_channels
        max_hidden = self.hidden(self.expand_ratios[-1])
        if self.has_expansion:
            self.expand_conv = ElasticConv2d(in_channels, max_hidden, (1,))
            self.expand_bn = ElasticBatchNorm2d(max_hidden)
        self.depthwise = ElasticConv2d(max_hidden, max_hidden, self.kernel_sizes, stride,
                                       depthwise=True)
        self.depthwise_bn = ElasticBatchNorm2d(max_hidden)
        self.se = SqueezeExcite(max_hidden, se_channels(max_hidden)) if se else None
        self.project = ElasticConv2d(max_hidden, out_channels, (1,))
        self.project_bn = ElasticBatchNorm2d(out_channels)

    def hidden(self, expand: int) -> int:
        return make_divisible(self.in_channels * expand) if expand != 1 else self.in_channels

    def check(self, config: MBConvConfig) -> None:
        if config.kernel not in self.kernel_sizes:
            raise ConfigError(f"kernel {config.kernel!r} is not one of {list(self.kernel_sizes)}")
        if config.expand not in self.expand_ratios:
            raise ConfigError(f"expansion ratio {config.expand!r} is not one of "
                              f"{list(self.expand_ratios)}")
        if config.se and self.se is None:
            raise ConfigError("squeeze-excite asked of a block built without it (se=False)")

    def largest(self) -> MBConvConfig:
        return MBConvConfig(self.kernel_sizes[-1], self.expand_ratios[-1], self.se is not None)

    def _se(self, h: torch.Tensor) -> torch.Tensor:
        se, c = self.se, h.shape[1]
        assert se is not None
        sq = se_channels(c)
        s = F.adaptive_avg_pool2d(h, 1)
        s = F.conv2d(s, se.reduce.weight[:sq, :c].contiguous(), se.reduce.bias[:sq].contiguous())
        s = F.conv2d(F.relu(s), se.expand.weight[:c, :sq].contiguous(),
                     se.expand.bias[:c].contiguous())
        return h * F.hardsigmoid(s)

    def forward(self, x: torch.Tensor, config: MBConvConfig | None = None) -> torch.Tensor:
        config = config or self.largest()
        self.check(config)
        hidden = self.hidden(config.expand)
        h = x
        if self.has_expansion:
            h = F.relu6(self.expand_bn(self.expand_conv(h, hidden)))
        h = F.relu6(self.depthwise_bn(self.depthwise(h, hidden, config.kernel)))
        if config.se:
            h = self._se(h)
        h = self.project_bn(self.project(h, self.out_channels))
        return x + h if self.residual else h

    def export(self, config: MBConvConfig) -> MBConv:
        """The stand-alone :class:`MBConv` of ``config`` with this block's weights."""
        self.check(config)
        block = MBConv(self.in_channels, self.out_channels, config.kernel, config.expand,
                       self.stride, config.se)
        hidden = self.hidden(config.expand)
        if self.has_expansion:
            assert block.expand_conv is not None
            block.expand_conv[0] = self.expand_conv.export(self.in_channels, hidden, 1)
            block.expand_conv[1] = self.expand_bn.export(hidden)
        block.depthwise[0] = self.depthwise.export(hidden, hidden, config.kernel)
        block.depthwise[1] = self.depthwise_bn.export(hidden)
        if config.se:
            assert self.se is not None and block.se is not None
            sq = se_channels(hidden)
            with torch.no_grad():
                block.se.reduce.weight.copy_(self.se.reduce.weight[:sq, :hidden])
                block.se.reduce.bias.copy_(self.se.reduce.bias[:sq])
                block.se.expand.weight.copy_(self.se.expand.weight[:hidden, :sq])
                block.se.expand.bias.copy_(self.se.expand.bias[:hidden])
        block.project[0] = self.project.export(hidden, self.out_channels, 1)
        block.project[1] = self.project_bn.export(self.out_channels)
        block.train(self.training)
        return block


class ElasticStage(nn.Module):
    """Elastic depth: ``max_depth`` blocks of which a configuration runs the first ``depth``
    (Once-for-All keeps the first blocks of a stage). The first block may change the shape
    (stride, channels); the others keep it."""

    def __init__(self, blocks: Sequence[ElasticMBConv]):
        super().__init__()
        if not blocks:
            raise ConfigError("an ElasticStage needs at least one block")
        self.blocks = nn.ModuleList(blocks)

    def forward(self, x: torch.Tensor, configs: Sequence[MBConvConfig] | None = None) -> torch.Tensor:
        configs = list(configs) if configs is not None else [b.largest() for b in self.blocks]
        if not 1 <= len(configs) <= len(self.blocks):
            raise ConfigError(f"depth {len(configs)} outside 1..{len(self.blocks)}")
        for block, config in zip(self.blocks, configs):
            x = block(x, config)
        return x

    def export(self, configs: Sequence[MBConvConfig]) -> nn.Sequential:
        """The stand-alone blocks of the first ``len(configs)`` blocks."""
        if not 1 <= len(configs) <= len(self.blocks):
            raise ConfigError(f"depth {len(configs)} outside 1..{len(self.blocks)}")
        return nn.Sequential(*(b.export(c) for b, c in zip(self.blocks, configs)))
