"""Batch-norm recalibration for one candidate of a weight-sharing store.

Statistics accumulated while many paths trained describe none of them, so a candidate is
scored with statistics gathered for it alone. One mechanism serves every space: the
``dag`` space's shared batch norms keep no running statistics (see
:class:`~frugalnas.nn.shared_bn.SharedBatchNorm2d`), NB201's are ordinary ones.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

from frugalnas.ports.data import Dataset
from frugalnas.nn.shared_bn import SharedBatchNorm2d, recalibrated_bn


def calibration_batches(dataset: Dataset, batches: int, batch_size: int, *, seed: int,
                        epoch: int, device: torch.device | None = None) -> list[torch.Tensor]:
    """The first ``batches`` training batches of the shuffle ``(seed, epoch)``: every
    candidate is recalibrated on the same examples, so its score depends only on the
    architecture and the data."""
    out: list[torch.Tensor] = []
    for x, _ in dataset.batches("train", batch_size, seed=seed, epoch=epoch):
        if len(out) >= batches:
            break
        out.append(x if device is None else x.to(device))
    return out


@contextmanager
def recalibrated(model: nn.Module, batches: list[torch.Tensor]) -> Iterator[int]:
    """Within the block, every batch norm of ``model`` normalises in evaluation with
    statistics averaged over ``batches`` (forwarded in training mode, no gradients,
    cumulative averaging as ``momentum=None``). Shared batch norms (``dag``) keep them aside
    (:func:`~frugalnas.nn.shared_bn.recalibrated_bn`); ordinary ones that track running
    statistics (NB201) have them replaced, and the store's own are put back on exit, so
    scoring leaves the store as it was. Yields the number of examples forwarded."""
    plain = [m for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm)
             and not isinstance(m, SharedBatchNorm2d) and m.track_running_stats]
    saved = [(m.momentum, m.running_mean.clone(), m.running_var.clone(),
              m.num_batches_tracked.clone()) for m in plain]
    for m in plain:
        m.reset_running_stats()
        m.momentum = None  # cumulative average
    try:
        with recalibrated_bn(model, batches) as seen:
            yield seen
    finally:
        with torch.no_grad():
            for m, (momentum, mean, var, count) in zip(plain, saved):
                m.momentum = momentum
                m.running_mean.copy_(mean)
                m.running_var.copy_(var)
                m.num_batches_tracked.copy_(count)
