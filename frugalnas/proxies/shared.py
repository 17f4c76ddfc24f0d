"""SharedPasses: work that several proxies of one network have in common, done once.

Several proxies start with the same computation on the same network and batch:

* ``az_expressivity`` and ``az_progressivity``: Kaiming re-initialisation, one forward, the
  spectral entropy of every primary block's output (``az_nas.entropies``);
* ``swap`` and ``swap_reg``: Gaussian re-initialisation, one forward of the first
  ``samples`` inputs, the number of distinct sample-wise patterns (``swap.patterns``);
* ``jacob_cov`` and ``epe_nas``: one forward and one backward to the inputs, the per-sample
  input Jacobians (``input_jacobian``).

Whoever scores one network with several proxies (the :class:`~frugalnas.proxies.runner.
ProxyRunner`, :func:`~frugalnas.proxies.base.score_network`) creates one ``SharedPasses``
for that network and batch and passes it to every :meth:`Proxy.score
<frugalnas.proxies.base.Proxy.score>` call; it is dropped with the network. There is no
global state: without a ``SharedPasses`` every proxy computes everything itself.

**Why a shared value equals the one a proxy computes alone.** ``Proxy.score`` restores the
network (weights, buffers, gradients, flags, modes) after every proxy and seeds torch's
random generator with the proxy's ``seed`` before it. A shared computation is keyed by a
name and every parameter it depends on (for instance the initialisation and the seed), it
is the first thing the proxy does after that seeding, and it depends on nothing else than
the network, the batch and the key. So whichever proxy computes it first sees exactly the
state the other would have seen, and runs the same code: the value is bitwise the one the
other would compute alone (``tests/proxies/test_proxies_shared.py`` checks this for every sharing
pair on NB201 cells). Shared values are read-only (numbers, tuples, read-only arrays).

**Fast paths.** A proxy given a ``SharedPasses`` may also take a faster route of its own to
bitwise the same value (``compute_shared``): meco batches its eigenvalue problems, swap
counts patterns in a table of flags, ntk_cond fills one Jacobian in place. So
:func:`~frugalnas.proxies.base.score_network` passes one even to a single proxy, and
``share=False`` there and in the runner is the reference path the fast one is tested and
timed against (``tests/proxies/test_fast_scoring.py``, ``benchmarks/proxy_speed.py``).
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

import torch
from torch import nn

from frugalnas.ports.errors import ConfigError

T = TypeVar("T")


class SharedPasses:
    """The shared computations of one network on one batch (see the module docstring).

    ``model``, ``inputs`` and ``targets`` are the objects the proxies will be scored on;
    :meth:`Proxy.score` refuses a ``SharedPasses`` bound to other objects. ``hits`` and
    ``misses`` count the lookups that were answered from / added to it."""

    def __init__(self, model: nn.Module, inputs: torch.Tensor,
                 targets: torch.Tensor | None = None):
        self.model, self.inputs, self.targets = model, inputs, targets
        self._values: dict[Hashable, Any] = {}
        self.hits = 0
        self.misses = 0

    def check(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None) -> None:
        """Raise ``ConfigError`` unless this object belongs to this network and batch."""
        if model is not self.model or inputs is not self.inputs or (
                targets is not None and self.targets is not None and targets is not self.targets):
            raise ConfigError("SharedPasses belongs to another network or batch: create one "
                              "per network, with the tensors the proxies are scored on")

    def get(self, key: Hashable, compute: Callable[[], T]) -> T:
        """The value stored under ``key``, computed with ``compute()`` the first time.
        An exception from ``compute`` is not stored (the next caller computes again)."""
        if key in self._values:
            self.hits += 1
            return self._values[key]
        value = compute()
        self._values[key] = value
        self.misses += 1
        return value

    def __contains__(self, key: Hashable) -> bool:
        return key in self._values

    def __len__(self) -> int:
        return len(self._values)


def shared_value(shared: SharedPasses | None, key: Hashable, compute: Callable[[], T]) -> T:
    """``compute()`` when there is nothing to share with, else ``shared.get(key, compute)``."""
    return compute() if shared is None else shared.get(key, compute)
