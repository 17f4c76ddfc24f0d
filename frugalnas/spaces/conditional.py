"""Spaces whose decisions are conditional on earlier ones (a depth decides which blocks or
layers exist): the variation they share, built on one method each space writes,
:meth:`ConditionalSpace.complete`, which settles the decisions in order and asks a
``fill(key, distribution)`` function for each one it lacks."""

from __future__ import annotations

import random
from abc import abstractmethod
from collections.abc import Callable, Mapping
from typing import Any

import optuna
from optuna.distributions import BaseDistribution, CategoricalDistribution, IntDistribution

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ArchitectureParseError
from frugalnas.ports.space import (SearchSpace, changed_decision, contains,
                                   describe_distribution, draw)

Fill = Callable[[str, BaseDistribution], Any]


def extreme(dist: BaseDistribution, largest: bool) -> Any:
    """The largest (or smallest) value of an integer or sorted categorical decision."""
    if isinstance(dist, IntDistribution):
        return dist.high if largest else dist.low
    assert isinstance(dist, CategoricalDistribution)
    return dist.choices[-1 if largest else 0]


class ConditionalSpace(SearchSpace):
    """A search space whose architectures hold only the decisions their network uses."""

    @abstractmethod
    def complete(self, values: Mapping[str, Any], fill: Fill) -> Architecture:
        """The architecture whose decisions come from ``values``; each decision the network
        has that ``values`` lacks (or holds an invalid value for) is ``fill(key, dist)``,
        asked in genotype order after the decisions it depends on."""

    def from_params(self, params: Mapping[str, Any]) -> Architecture:
        """The architecture of ``params`` (values of decisions the network does not have are
        ignored); a missing or invalid decision it has is refused."""
        def refuse(key: str, dist: BaseDistribution) -> Any:
            if key in params:
                raise ArchitectureParseError(
                    f"invalid value {params[key]!r} for decision {key!r} of space "
                    f"{self.name!r}; valid: {describe_distribution(dist)}")
            raise ArchitectureParseError(f"parameters for space {self.name!r} miss decision "
                                         f"{key!r} ({describe_distribution(dist)})")

        return self.complete(params, refuse)

    def suggest(self, trial: optuna.trial.BaseTrial) -> Architecture:
        """Ask ``trial`` for each decision the network has, in order, so that optuna's
        samplers see only those."""
        def ask(key: str, dist: BaseDistribution) -> Any:
            if isinstance(dist, IntDistribution):
                return trial.suggest_int(key, dist.low, dist.high)
            assert isinstance(dist, CategoricalDistribution)
            return trial.suggest_categorical(key, dist.choices)

        return self.complete({}, ask)

    def sample(self, rng: random.Random) -> Architecture:
        return self.complete({}, lambda key, dist: draw(dist, rng))

    def mutate(self, arch: Architecture, rng: random.Random) -> Architecture:
        """Change one decision the network has; decisions a change brings in are drawn."""
        change = changed_decision(self.active_decisions(arch), arch, rng)
        if change is None:
            return arch
        key, value = change
        return self.complete({**arch.decisions, key: value}, lambda k, d: draw(d, rng))

    def crossover(self, a: Architecture, b: Architecture, rng: random.Random) -> Architecture:
        """Each decision from either parent (from the one that has it when only one does)."""
        da, db = a.decisions, b.decisions

        def either(key: str, dist: BaseDistribution) -> Any:
            options = [d[key] for d in (da, db) if key in d and contains(dist, d[key])]
            return rng.choice(options) if options else draw(dist, rng)

        return self.complete({}, either)

    def largest(self) -> Architecture:
        """The network with every decision at its largest value."""
        return self.complete({}, lambda key, dist: extreme(dist, largest=True))

    def smallest(self) -> Architecture:
        """The network with every decision at its smallest value."""
        return self.complete({}, lambda key, dist: extreme(dist, largest=False))
