"""Candidate operations and building blocks of the evolvable DAG cell space.

Each operation maps ``C`` channels to ``C`` channels; ``stride=2`` halves the spatial size
(rounding up, so odd sizes such as 7x7 work). Every operation with parameters or pooling ends
in batch norm. ``bn(C)`` makes the batch norm, so the same
constructors build stand-alone networks (running statistics) and weight-sharing networks
(:class:`SharedBatchNorm2d`: batch statistics, since one set of running statistics cannot fit
many candidates, or statistics recalibrated for one candidate with :func:`recalibrated_bn`).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn

BatchNorm = Callable[[int], nn.Module]

OPS = ("sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "dil_conv_5x5", "conv_1x1",
       "max_pool_3x3", "avg_pool_3x3", "skip_connect")
DEFAULT_OPS = ("sep_conv_3x3", "sep_conv_5x5", "dil_conv_3x3", "max_pool_3x3",
               "avg_pool_3x3", "skip_connect")


def running_bn(c: int) -> nn.Module:
    """Batch norm with running statistics (stand-alone networks)."""
    return nn.BatchNorm2d(c)


class SharedBatchNorm2d(nn.BatchNorm2d):
    """Batch norm of a weight-sharing network. It normalises with the current batch's
    statistics, in training and in evaluation, unless statistics were recalibrated for the
    network being evaluated (:func:`recalibrated_bn`); those live in plain attributes, never
    in the state dict, so checkpoints hold only the learned affine parameters."""

    def __init__(self, c: int):
        super().__init__(c, track_running_stats=False)
        self.collecting = False
        self.stat_sums: list[torch.Tensor] | None = None   # [mean sum, var sum, batches]
        self.stats: tuple[torch.Tensor, torch.Tensor] | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.collecting:
            with torch.no_grad():  # cumulative average of the batches (momentum=None)
                mean = x.mean(dim=(0, 2, 3))
                var = x.var(dim=(0, 2, 3), unbiased=x.numel() // x.shape[1] > 1)
                if self.stat_sums is None:
                    self.stat_sums = [mean, var, torch.ones((), device=x.device)]
                else:
                    self.stat_sums = [self.stat_sums[0] + mean, self.stat_sums[1] + var,
                                      self.stat_sums[2] + 1]
        if self.stats is not None and not self.training and not self.collecting:
            mean, var = self.stats
            return F.batch_norm(x, mean, var, self.weight, self.bias, False, 0.0, self.eps)
        return super().forward(x)


def batch_stat_bn(c: int) -> nn.Module:
    """Batch norm of shared weights: batch statistics unless recalibrated (see above)."""
    return SharedBatchNorm2d(c)


@contextmanager
def recalibrated_bn(model: nn.Module, batches: Iterable[torch.Tensor]) -> Iterator[int]:
    """Within the block, ``model``'s shared batch norms normalise in evaluation with
    statistics averaged over ``batches`` (forward passes in training mode, no gradients,
    cumulative averaging as ``momentum=None``), computed for this network alone: statistics
    left by other networks sharing the modules are discarded first, and the block's are
    discarded on exit. Yields the number of examples forwarded."""
    norms = list({id(m): m for m in model.modules() if isinstance(m, SharedBatchNorm2d)}.values())
    for m in norms:
        m.stats, m.stat_sums, m.collecting = None, None, True
    was_training, seen = model.training, 0
    try:
        model.train()
        with torch.no_grad():
            for x in batches:
                model(x)
                seen += len(x)
        for m in norms:
            m.collecting = False
            if m.stat_sums is not None:
                total, var_total, n = m.stat_sums
                m.stats = (total / n, var_total / n)
            m.stat_sums = None
        model.train(was_training)
        yield seen
    finally:
        for m in norms:
            m.stats, m.stat_sums, m.collecting = None, None, False
        model.train(was_training)


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
