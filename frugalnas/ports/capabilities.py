"""Optional capabilities of a search space, kept apart from the space's port.

A :class:`~frugalnas.ports.space.SearchSpace` holds decisions, sampling and variation,
building, the text form and validation. What only some spaces can do (weight sharing,
progressive shrinking, the sandwich rule, DARTS's relaxation, scaling for low-fidelity
training, encodings of their own for surrogates) is an adapter object declared beside the
space: the class attribute ``SearchSpace.capabilities`` maps each capability protocol below to
the adapter's factory, ``factory(space) -> adapter``, given as the factory itself or as
``"package.module:attribute"`` (imported on first use, so a space module need not import its
supernet)::

    class MySpace(SearchSpace):
        capabilities = {WeightSharing: "mypkg.supernet:MySharing"}

A feature asks with :func:`capability` (``None`` when the space has none) or
:func:`require_capability` (a ConfigError naming the space, the capability and the built-in
spaces that have it).
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.lazy import load_reference
from frugalnas.ports.network import Relaxation

if TYPE_CHECKING:
    from frugalnas.ports.network import SharedBuilder
    from frugalnas.ports.space import SearchSpace


class WeightSharing(Protocol):
    """Networks of the space over one shared weight store (:mod:`frugalnas.weight_sharing`)."""

    def shared_builder(self, num_classes: int, input_shape: tuple[int, ...],
                       sharing: str = "operation") -> SharedBuilder:
        """An object with ``keys()`` (every store key of the supernet), ``factory(key)`` (a
        fresh module for a key), ``subnet(arch, get)`` (the network of ``arch`` built from
        ``get(key)`` modules) and, for differentiable search, ``mixed(get, alphas)``."""
        ...


class ProgressiveShrinking(Protocol):
    """Progressive shrinking (Once-for-All, Cai et al., ICLR 2020)."""

    def shrinking_phases(self) -> list[tuple[str, Callable[[random.Random], Architecture]]]:
        """The supernet's training phases in order, each a name and a sampler of the
        architectures trained in it, from the largest network alone to the whole space."""
        ...


class SandwichRule(Protocol):
    """An order of size for the sandwich rule (BigNAS, Yu et al., ECCV 2020)."""

    def sandwich_bounds(self) -> tuple[Architecture, Architecture]:
        """The largest and the smallest network of the space."""
        ...


class DartsRelaxation(Relaxation, Protocol):
    """The space's own continuous relaxation for the ``darts`` strategy (the adapter is the
    relaxation itself); without it DARTS mixes the choices of every decision (all
    categorical, equally many)."""


class Scaling(Protocol):
    """Copies of the space with narrower or shallower networks, for low-fidelity training."""

    def scaled(self, *, width: int | None = None, depth: int | None = None) -> SearchSpace:
        """A copy whose networks are ``width`` wide and ``depth`` deep (each mapped to the
        space's own options; ``None`` keeps it)."""
        ...


class OwnEncodings(Protocol):
    """Architecture encodings of the space's own for surrogates; the generic ``onehot`` and
    ``proxy`` encodings work on every space without it."""

    def encodings(self) -> Mapping[str, Callable[[SearchSpace], Any]]:
        """Each encoding's factory ``(space) -> encoding`` by name."""
        ...


class _BuilderSharing:
    def __init__(self, space: SearchSpace, builder: Callable[..., SharedBuilder]):
        self.space, self.builder = space, builder

    def shared_builder(self, num_classes: int, input_shape: tuple[int, ...],
                       sharing: str = "operation") -> SharedBuilder:
        return self.builder(self.space, num_classes, input_shape, sharing)


def sharing_by(builder: Callable[..., SharedBuilder]) -> Callable[[SearchSpace], WeightSharing]:
    """The factory of a :class:`WeightSharing` adapter whose shared builder is
    ``builder(space, num_classes, input_shape, sharing)`` (a shared-builder class)."""
    return lambda space: _BuilderSharing(space, builder)


class _AttributeScaling:
    def __init__(self, space: SearchSpace, width: str, depth: str):
        self.space, self.width, self.depth = space, width, depth

    def scaled(self, *, width: int | None = None, depth: int | None = None) -> SearchSpace:
        out = copy.copy(self.space)
        for attribute, value in ((self.width, width), (self.depth, depth)):
            if value is not None:
                setattr(out, attribute, int(value))
        return out


def scaling_by(width: str, depth: str) -> Callable[[SearchSpace], Scaling]:
    """The factory of a :class:`Scaling` adapter that copies the space with the attribute
    ``width`` set to the width asked for and ``depth`` to the depth."""
    return lambda space: _AttributeScaling(space, width, depth)


class CellGraph(Protocol):
    """A graph form of the space's architectures, for drawings; without it a drawing lists
    the decisions."""

    def cell_graph(self, arch: Architecture) -> list[tuple[str, str, str]]:
        """Edges ``(source, target, label)`` of ``arch``'s cell (or macro network)."""
        ...


def itself(space: SearchSpace) -> Any:
    """The factory of a capability the space implements itself (its own method)."""
    return space


#: Each capability as messages name it, with the built-in spaces that have it.
CAPABILITIES: dict[type, tuple[str, str]] = {
    WeightSharing: ("weight sharing", "nb201, dag, mobilenet, gpt"),
    ProgressiveShrinking: ("progressive shrinking", "mobilenet, gpt"),
    SandwichRule: ("the sandwich rule (an order of size)", "mobilenet, gpt"),
    DartsRelaxation: ("a DARTS relaxation of its own", "dag"),
    Scaling: ("scaling in width or depth", "nb201, dag"),
    OwnEncodings: ("encodings of its own", "nb201, mobilenet, gpt"),
    CellGraph: ("a cell graph for drawings", "nb201, dag, mobilenet, gpt"),
}

C = TypeVar("C")


def supports(space: SearchSpace, kind: type) -> bool:
    """Whether ``space`` declares the capability ``kind`` (nothing is imported to say)."""
    return kind in type(space).capabilities


def capability(space: SearchSpace, kind: type[C]) -> C | None:
    """The adapter of ``space`` for the capability ``kind``, or ``None`` when the space
    declares none."""
    declared = type(space).capabilities.get(kind)
    if declared is None:
        return None
    factory = _load(declared, space, kind) if isinstance(declared, str) else declared
    adapter: C = factory(space)
    return adapter


def require_capability(space: SearchSpace, kind: type[C], needed_by: str) -> C:
    """:func:`capability`, or a ConfigError naming what needs it (``needed_by``: an option,
    an estimator, a strategy), the space, what it lacks and the built-in spaces that have it."""
    found = capability(space, kind)
    if found is None:
        label, spaces = CAPABILITIES.get(kind, (kind.__name__, "(none)"))
        raise ConfigError(f"{needed_by} needs a search space with {label}; search space "
                          f"{space.name!r} has none (it declares no {kind.__name__} "
                          f"capability); built-in spaces that have it: {spaces}")
    return found


def _load(target: str, space: SearchSpace, kind: type) -> Callable[[SearchSpace], Any]:
    try:
        found = load_reference(target)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"search space {space.name!r} declares its {kind.__name__} "
                          f"capability as {target!r}, which failed to load: "
                          f"{type(exc).__name__}: {exc}") from exc
    factory: Callable[[SearchSpace], Any] = found
    return factory
