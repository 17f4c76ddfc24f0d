"""The batch norm of shared weights: :class:`SharedBatchNorm2d` normalises with batch
statistics (one set of running statistics cannot fit the many candidates that share it), or
with statistics recalibrated for one candidate by :func:`recalibrated_bn`. Used by every space
with weight sharing (NB201, DAG) and by :mod:`frugalnas.weight_sharing`."""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager

import torch
import torch.nn.functional as F
from torch import nn


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
