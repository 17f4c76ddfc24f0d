"""SearchSpace: the decisions of a space, as optuna distributions, and what to do with them."""

from __future__ import annotations

import math
import random
from abc import ABC, abstractmethod
from collections.abc import Mapping
from typing import TYPE_CHECKING, Any, ClassVar

import optuna
from optuna.distributions import (BaseDistribution, CategoricalDistribution,
                                  FloatDistribution, IntDistribution)

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ArchitectureParseError

if TYPE_CHECKING:
    from torch import nn


class SearchSpace(ABC):
    """A space of architectures. Every decision is an optuna distribution, so any optuna
    sampler can search any space; evolutionary strategies use ``mutate``/``crossover``."""

    name: str = "space"
    #: The class of this space's architectures (a subclass with its own text form, or the
    #: generic :class:`Architecture`).
    genotype: ClassVar[type[Architecture]] = Architecture
    #: The space's optional capabilities (weight sharing, progressive shrinking, ...): each
    #: protocol of :mod:`frugalnas.ports.capabilities` mapped to its adapter's factory
    #: ``(space) -> adapter``, or to ``"package.module:attribute"`` naming it.
    capabilities: ClassVar[Mapping[type, Any]] = {}
    #: The tasks (:mod:`frugalnas.ports.task` names) the space's networks are built for:
    #: estimators that know only other tasks refuse the space before the first trial.
    tasks: ClassVar[tuple[str, ...]] = ("image-classification",)
    #: What the space's networks are built of (``"convolutional"``, ``"transformer"``), for
    #: components that read one kind of structure; None: not declared (a user's builder).
    network_family: ClassVar[str | None] = None

    @abstractmethod
    def distributions(self) -> dict[str, BaseDistribution]:
        """The decisions, in genotype order, as optuna distributions."""

    @abstractmethod
    def build(self, arch: Architecture, num_classes: int,
              input_shape: tuple[int, ...]) -> nn.Module:
        """A freshly initialised ``torch.nn.Module`` for ``arch``."""

    # -- conversions ---------------------------------------------------------------------
    def from_params(self, params: Mapping[str, Any]) -> Architecture:
        dists = self.distributions()
        missing = [k for k in dists if k not in params]
        if missing:
            raise ArchitectureParseError(
                f"parameters for space {self.name!r} miss decision(s) {missing}")
        arch = self.genotype.create(self.name, {k: params[k] for k in dists})
        self.validate(arch)
        return arch

    def suggest(self, trial: optuna.trial.BaseTrial) -> Architecture:
        """Ask ``trial`` for every decision (so the trial's sampler decides)."""
        params: dict[str, Any] = {}
        for key, dist in self.distributions().items():
            if isinstance(dist, CategoricalDistribution):
                params[key] = trial.suggest_categorical(key, dist.choices)
            elif isinstance(dist, IntDistribution):
                params[key] = trial.suggest_int(key, dist.low, dist.high, step=dist.step, log=dist.log)
            elif isinstance(dist, FloatDistribution):
                params[key] = trial.suggest_float(key, dist.low, dist.high, step=dist.step, log=dist.log)
            else:
                raise TypeError(f"unsupported distribution {dist!r} for decision {key!r}")
        return self.from_params(params)

    def parse(self, text: str) -> Architecture:
        """Parse ``str(arch)``; subclasses also accept their conventional bare form."""
        arch = self.genotype.parse(text if ":" in text else f"{self.name}:{text}")
        self.validate(arch)
        return arch

    def validate(self, arch: Architecture) -> None:
        """Raise ArchitectureParseError unless ``arch`` belongs to this space: it holds
        exactly its :meth:`active_decisions`, in order, each with a valid value."""
        if arch.space != self.name:
            raise ArchitectureParseError(
                f"architecture of space {arch.space!r} given to space {self.name!r}")
        dists = self.active_decisions(arch)
        decisions = arch.decisions
        if list(decisions) != list(dists):
            # Not str(arch): a space's text form may need the very decisions that are missing.
            missing = [k for k in dists if k not in decisions]
            extra = [k for k in decisions if k not in dists]
            raise ArchitectureParseError(
                f"architecture for space {self.name!r} has decisions {list(decisions)} "
                f"(missing {missing}, unexpected {extra}); the space expects {list(dists)}")
        for key, dist in dists.items():
            if not contains(dist, decisions[key]):
                raise ArchitectureParseError(
                    f"invalid value {decisions[key]!r} for decision {key!r} of space "
                    f"{self.name!r}; valid: {describe_distribution(dist)}")

    # -- sampling and variation ----------------------------------------------------------
    def sample(self, rng: random.Random) -> Architecture:
        return self.from_params({k: draw(d, rng) for k, d in self.distributions().items()})

    def mutate(self, arch: Architecture, rng: random.Random) -> Architecture:
        """Change one decision to a different valid value."""
        dists = self.distributions()
        keys = [k for k, d in dists.items() if not _is_fixed(d)]
        key = rng.choice(keys)
        current = arch[key]
        while True:
            value = draw(dists[key], rng)
            if value != current:
                return self.from_params({**arch.decisions, key: value})

    def crossover(self, a: Architecture, b: Architecture, rng: random.Random) -> Architecture:
        """Uniform crossover: each decision from either parent."""
        return self.from_params({k: (a[k] if rng.random() < 0.5 else b[k])
                                 for k in self.distributions()})

    def neighbours(self, arch: Architecture) -> list[Architecture]:
        """Every architecture that differs from ``arch`` in one categorical decision."""
        out = []
        for key, dist in self.distributions().items():
            if isinstance(dist, CategoricalDistribution):
                for choice in dist.choices:
                    if choice != arch[key]:
                        out.append(self.from_params({**arch.decisions, key: choice}))
        return out

    def active_decisions(self, arch: Architecture) -> dict[str, BaseDistribution]:
        """The decisions ``arch`` holds, in order: every decision of :meth:`distributions`
        (the default), or, in a space with conditional decisions (a define-by-run space), only
        those its network uses; the others are neither stored nor mutated."""
        return self.distributions()

    def describe(self) -> dict[str, Any]:
        return {k: describe_distribution(d) for k, d in self.distributions().items()}


def params_of(space: SearchSpace, arch: Architecture) -> dict[str, Any]:
    """The optuna parameters of ``arch`` (checked to belong to ``space``): its decisions."""
    space.validate(arch)
    return dict(arch.decisions)


def contains(dist: BaseDistribution, value: Any) -> bool:
    """Whether ``value`` is one of the values ``dist`` allows."""
    if isinstance(dist, CategoricalDistribution):
        return value in dist.choices
    if isinstance(dist, (IntDistribution, FloatDistribution)):
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            return False
        if isinstance(dist, IntDistribution) and value != int(value):
            return False
        return bool(dist.low <= value <= dist.high)
    return True


def _is_fixed(dist: BaseDistribution) -> bool:
    return dist.single()


def draw(dist: BaseDistribution, rng: random.Random) -> Any:
    """A value of ``dist`` drawn with ``rng`` (uniform; log-uniform where ``dist.log``; on
    the grid of ``dist.step``)."""
    if isinstance(dist, CategoricalDistribution):
        return rng.choice(dist.choices)
    if isinstance(dist, IntDistribution):
        if dist.log:
            return min(dist.high, int(round(math.exp(rng.uniform(math.log(dist.low),
                                                                 math.log(dist.high))))))
        return rng.randrange(dist.low, dist.high + 1, dist.step)
    if isinstance(dist, FloatDistribution):
        if dist.step is not None:
            n = int(round((dist.high - dist.low) / dist.step))
            return dist.low + dist.step * rng.randint(0, n)
        if dist.log:
            return math.exp(rng.uniform(math.log(dist.low), math.log(dist.high)))
        return rng.uniform(dist.low, dist.high)
    raise TypeError(f"cannot sample from {dist!r}")


def changed_decision(active: Mapping[str, BaseDistribution], arch: Architecture,
                     rng: random.Random, tries: int = 101) -> tuple[str, Any] | None:
    """One change of ``arch`` for a mutation: a key drawn among the decisions of ``active``
    that have more than one value, and a value of it drawn with ``rng`` until it differs from
    ``arch``'s (at most ``tries`` draws); ``None`` when no decision can change."""
    keys = [k for k, d in active.items() if not d.single()]
    if not keys:
        return None
    key = rng.choice(keys)
    value = draw(active[key], rng)
    for _ in range(tries - 1):
        if value != arch[key]:
            break
        value = draw(active[key], rng)
    return key, value


def describe_distribution(dist: BaseDistribution) -> str:
    """The values ``dist`` allows, for messages: ``'a', 'b'`` or ``[1, 8]``."""
    if isinstance(dist, CategoricalDistribution):
        return ", ".join(map(repr, dist.choices))
    if isinstance(dist, (IntDistribution, FloatDistribution)):
        step = f" step {dist.step}" if dist.step not in (None, 1) else ""
        return f"[{dist.low}, {dist.high}]{step}{' log' if dist.log else ''}"
    return repr(dist)
