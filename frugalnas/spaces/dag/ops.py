"""Candidate operations and building blocks of the evolvable DAG cell space.

Each operation maps ``C`` channels to ``C`` channels; ``stride=2`` halves the spatial size
(rounding up, so odd sizes such as 7x7 work). Every operation with parameters or pooling ends
in batch norm. ``bn(C)`` makes the batch norm, so the same
constructors build stand-alone networks (running statistics) and weight-sharing networks
(:class:`~frugalnas.nn.shared_bn.SharedBatchNorm2d`: batch statistics, since one set of running statistics cannot fit
many candidates, or statistics recalibrated for one candidate with :func:`~frugalnas.nn.shared_bn.recalibrated_bn`).
"""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.nn.shared_bn import SharedBatchNorm2d

BatchNorm = Callable[[int], nn.Module]

OPS = ("sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "dil_conv_5x5", "conv_1x1",
       "max_pool_3x3", "avg_pool_3x3", "skip_connect")
DEFAULT_OPS = ("sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "max_pool_3x3",
               "avg_pool_3x3", "skip_connect")


def running_bn(c: int) -> nn.Module:
    """Batch norm with running statistics (stand-alone networks)."""
    return nn.BatchNorm2d(c)


def batch_stat_bn(c: int) -> nn.Module:
    """Batch norm of shared weights: batch statistics unless recalibrated (see above)."""
    return SharedBatchNorm2d(c)


class ReLUConvBN(nn.Sequential):
    def __init__(self, c_in: int, c_out: int, kernel: int, stride: int, bn: BatchNorm):
        super().__init__(nn.ReLU(), nn.Conv2d(c_in, c_out, kernel, stride, kernel // 2, bias=False),
                         bn(c_out))


class SepConv(nn.Sequential):
    """ReLU, depthwise conv (optionally dilated), pointwise conv, batch norm."""

    def __init__(self, c: int, kernel: int, stride: int, dilation: int, bn: BatchNorm):
        pad = dilation * (kernel - 1) // 2
        super().__init__(nn.ReLU(),
                         nn.Conv2d(c, c, kernel, stride, pad, dilation=dilation, groups=c, bias=False),
                         nn.Conv2d(c, c, 1, bias=False), bn(c))


class FactorizedReduce(nn.Module):
    """Halve the spatial size with two offset strided 1x1 convolutions (Zoph et al., 2018)."""

    def __init__(self, c_in: int, c_out: int, bn: BatchNorm):
        super().__init__()
        self.relu = nn.ReLU()
        self.conv1 = nn.Conv2d(c_in, c_out // 2, 1, 2, bias=False)
        self.conv2 = nn.Conv2d(c_in, c_out - c_out // 2, 1, 2, bias=False)
        self.bn = bn(c_out)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.relu(x)
        shifted = F.pad(x[:, :, 1:, 1:], (0, 1, 0, 1))
        return self.bn(torch.cat([self.conv1(x), self.conv2(shifted)], dim=1))


class SqueezeExcite(nn.Module):
    """Channel attention (Hu et al., 2018): rescale channels by a gate computed from their
    global average."""

    def __init__(self, c: int, reduction: int = 4):
        super().__init__()
        hidden = max(2, c // reduction)
        self.fc1 = nn.Conv2d(c, hidden, 1)
        self.fc2 = nn.Conv2d(hidden, c, 1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate = torch.sigmoid(self.fc2(F.relu(self.fc1(x.mean(dim=(2, 3), keepdim=True)))))
        return x * gate


def make_op(name: str, c: int, stride: int, bn: BatchNorm) -> nn.Module:
    """The operation ``name`` on ``c`` channels with ``stride`` 1 or 2."""
    if name == "skip_connect":
        return nn.Identity() if stride == 1 else FactorizedReduce(c, c, bn)
    if name == "conv_1x1":
        return ReLUConvBN(c, c, 1, stride, bn)
    if name.startswith(("sep_conv_", "dil_conv_")):
        kernel = int(name[-1])
        return SepConv(c, kernel, stride, 2 if name.startswith("dil") else 1, bn)
    # Pooling is followed by batch norm (as in DARTS's search network) so that every
    # operation's output has the same scale: a node adds two of them, and under weight sharing
    # the modules downstream were trained on the mixtures other candidates produced.
    if name == "max_pool_3x3":
        return nn.Sequential(nn.MaxPool2d(3, stride, 1), bn(c))
    if name == "avg_pool_3x3":
        return nn.Sequential(nn.AvgPool2d(3, stride, 1, count_include_pad=False), bn(c))
    raise ValueError(f"unknown DAG operation {name!r}; valid: {', '.join(OPS)}")
