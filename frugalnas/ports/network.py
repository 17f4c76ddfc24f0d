"""Declared structure of the networks a space builds, for components that work block by block
(the out-of-core backend, the AZ-NAS proxies), and of the shared builders of weight
sharing (a ``WeightSharing`` capability's ``shared_builder``) that DARTS can relax."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, runtime_checkable

if TYPE_CHECKING:
    import torch
    from torch import nn


@runtime_checkable
class BlockNetwork(Protocol):
    """A network that lists its main blocks (stem, cells, reductions) in forward order, each
    a submodule its forward calls once. Networks built by the ``nb201``, ``dag`` and ``gpt`` spaces
    declare it; a network without it is taken as a whole by the out-of-core backend (an
    ``nn.Sequential`` child by child) and child by child by AZ-NAS."""

    def forward_blocks(self) -> Sequence["nn.Module"]:
        """The blocks, in forward order."""
        ...


@runtime_checkable
class RelaxedBuilder(Protocol):
    """A shared builder (a ``WeightSharing`` capability's ``shared_builder``) with DARTS's continuous relaxation:
    ``mixed(get, alphas)`` is the network whose every decision mixes its choices by
    softmax(alphas) rows, its modules from ``get(key)``."""

    def mixed(self, get: Callable[[Any], "nn.Module"], alphas: "torch.Tensor") -> "nn.Module":
        ...


@runtime_checkable
class SharedBuilder(Protocol):
    """What a ``WeightSharing`` capability's ``shared_builder`` returns (weight sharing, docs/weight_sharing.md):
    every store key of the supernet, a fresh module for a key, and the network of an
    architecture assembled from the store's modules."""

    def keys(self) -> Sequence[Any]:
        """Every key of the supernet's weight store."""
        ...

    def factory(self, key: Any) -> "nn.Module":
        """A freshly initialised module for ``key``."""
        ...

    def subnet(self, arch: Any, get: Callable[[Any], "nn.Module"]) -> "nn.Module":
        """The network of ``arch`` built from ``get(key)`` modules."""
        ...


@runtime_checkable
class Relaxation(Protocol):
    """A continuous relaxation of a space for DARTS (a ``DartsRelaxation`` capability): the
    shape of its mixing weights, the mixed network, and how an architecture is read off or
    drawn from the weights."""

    shape: tuple[int, ...]

    def weights(self, alphas: "torch.Tensor") -> "torch.Tensor":
        """The mixing weights (e.g. a softmax) of raw ``alphas``."""
        ...

    def network(self, builder: Any, get: Callable[[Any], "nn.Module"],
                alphas: "torch.Tensor") -> "nn.Module":
        """The mixed network of ``builder``'s modules under ``alphas``."""
        ...

    def read(self, alphas: "torch.Tensor") -> Any:
        """The architecture of the strongest choices."""
        ...

    def sample(self, alphas: "torch.Tensor", rng: Any) -> Any:
        """An architecture drawn from the mixing weights."""
        ...
