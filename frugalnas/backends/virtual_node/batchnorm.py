"""Batch-norm statistics per virtual node, and one definition of the running-estimate update.

While virtual nodes run, each batch-norm layer normalises with its node's own batch statistics
(as PyTorch does in training mode); its running buffers are restored afterwards, and the
recorded per-node means and unbiased variances are applied in virtual-node order 0..V-1 by
:func:`apply_running_updates`, wherever each node ran."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn
from torch.nn.modules.batchnorm import _BatchNorm


def tracked_batchnorms(model: nn.Module) -> list[_BatchNorm]:
    """Batch-norm layers of ``model`` that keep running estimates, in module order."""
    return [m for m in model.modules()
            if isinstance(m, _BatchNorm) and m.track_running_stats and m.running_mean is not None]


def stats_width(bns: list[_BatchNorm]) -> int:
    """Number of values one virtual node records: mean and variance per channel."""
    return sum(2 * m.num_features for m in bns)


class BatchNormRecorder:
    """Records the batch statistics each tracked batch-norm layer computes during one forward.

    The layer's own kernel provides them: while recording, its momentum is 1 and its running
    buffers are zeroed before it runs, so afterwards they hold exactly this batch's mean and
    unbiased variance (no second pass over the activations). ``stats[i]`` is ``None`` when
    layer ``i`` did not run in training mode, else the concatenated ``(mean, var)``."""

    def __init__(self, bns: list[_BatchNorm]):
        self.bns = bns
        self.stats: list[torch.Tensor | None] = [None] * len(bns)

    def reset(self) -> None:
        self.stats = [None] * len(self.bns)

    @contextmanager
    def recording(self) -> Iterator["BatchNormRecorder"]:
        """Hooks in place and momentum 1 (use inside :func:`preserved_buffers`)."""
        momenta = [bn.momentum for bn in self.bns]
        handles = []
        for i, bn in enumerate(self.bns):
            bn.momentum = 1.0
            handles.append(bn.register_forward_pre_hook(self._before(i)))
            handles.append(bn.register_forward_hook(self._after(i)))
        try:
            yield self
        finally:
            for h in handles:
                h.remove()
            for bn, m in zip(self.bns, momenta):
                bn.momentum = m

    def _before(self, index: int):
        def hook(module: nn.Module, args: tuple) -> None:
            if not module.training:
                return
            if self.stats[index] is not None:
                raise RuntimeError("virtual-node backend: a BatchNorm layer ran twice in one forward; "
                                   "shared batch-norm layers are not supported")
            with torch.no_grad():
                module.running_mean.zero_()
                module.running_var.zero_()
        return hook

    def _after(self, index: int):
        def hook(module: nn.Module, args: tuple, output: torch.Tensor) -> None:
            if module.training:
                self.stats[index] = torch.cat([module.running_mean, module.running_var])
        return hook


@contextmanager
def preserved_buffers(bns: list[_BatchNorm]) -> Iterator[None]:
    """Restore the running buffers of ``bns`` on exit, undoing PyTorch's own per-forward updates."""
    saved = [(bn.running_mean.clone(), bn.running_var.clone(),
              None if bn.num_batches_tracked is None else bn.num_batches_tracked.clone())
             for bn in bns]
    try:
        yield
    finally:
        with torch.no_grad():
            for bn, (mean, var, count) in zip(bns, saved):
                bn.running_mean.copy_(mean)
                bn.running_var.copy_(var)
                if count is not None:
                    bn.num_batches_tracked.copy_(count)


@torch.no_grad()
def apply_running_updates(bns: list[_BatchNorm], table: torch.Tensor, seen: torch.Tensor) -> None:
    """Update running estimates from per-node statistics, node after node in VN order.

    ``table`` is ``(V, stats_width)``; ``seen`` is ``(V, len(bns))`` with 1 where the layer ran.
    For each node: ``running = (1 - f) * running + f * stat`` with ``f = momentum`` (or the
    cumulative ``1 / num_batches_tracked`` when momentum is None)."""
    col = 0
    for i, bn in enumerate(bns):
        c = bn.num_features
        for v in range(table.shape[0]):
            if seen[v, i] <= 0:
                continue
            if bn.num_batches_tracked is not None:
                bn.num_batches_tracked.add_(1)
            f = bn.momentum if bn.momentum is not None else 1.0 / float(bn.num_batches_tracked)
            mean = table[v, col:col + c].to(bn.running_mean)
            var = table[v, col + c:col + 2 * c].to(bn.running_var)
            bn.running_mean.mul_(1.0 - f).add_(mean, alpha=f)
            bn.running_var.mul_(1.0 - f).add_(var, alpha=f)
        col += 2 * c
