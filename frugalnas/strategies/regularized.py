"""Regularized (aging) evolution, Real et al., AAAI 2019."""

from __future__ import annotations

import random
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import check_range
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.strategy import StrategyServices
from frugalnas.strategies.base import ArchSampler
from frugalnas.strategies.history import History

#: Population and tournament sizes: by default, and with constraints known before evaluation
#: (chosen on seeds 100-299 of benchmarks/hw_nb201.py, apart from the reported seeds 0-9).
DEFAULT_POPULATION, DEFAULT_SAMPLE = 20, 5
KNOWN_CONSTRAINTS_POPULATION, KNOWN_CONSTRAINTS_SAMPLE = 40, 10


class RegularizedEvolutionSampler(ArchSampler):
    """Regularized (aging) evolution of Real et al. 2019: mutate the best of a random sample.

    The population is the last ``population_size`` completed trials (trial-number order, so
    the oldest leaves first); each child mutates the fittest of ``sample_size`` members drawn
    at random. Both default to 20 and 5, and to 40 and 10 when the study's estimator knows the
    constrained metrics before evaluating: the feasible region is then searched from a larger
    (feasible) initial design by more selective tournaments, which halves the regret of a
    100-trial constrained search on NAS-Bench-201 and costs an unconstrained one early
    progress (docs/benchmarks/hardware_aware.md). ``n_init`` defaults to the
    population size."""

    def __init__(self, space: SearchSpace, seed: int = 0, population_size: int | None = None,
                 sample_size: int | None = None, n_init: int | None = None, **common: Any):
        if population_size is not None:
            check_range("population_size", population_size, 2)
        if sample_size is not None:
            check_range("sample_size", sample_size, 1,
                        DEFAULT_POPULATION if population_size is None else population_size)
        self.population_size, self.sample_size = population_size, sample_size
        super().__init__(space, seed, n_init,
                         **common)
        self._population, self._sample = population_size or DEFAULT_POPULATION, \
            sample_size or DEFAULT_SAMPLE

    def bind(self, services: StrategyServices) -> None:
        super().bind(services)
        known = self.constraints_known()
        self._population = self.population_size or (
            KNOWN_CONSTRAINTS_POPULATION if known else DEFAULT_POPULATION)
        self._sample = self.sample_size or (KNOWN_CONSTRAINTS_SAMPLE if known else DEFAULT_SAMPLE)

    def default_initial_design(self, constraints_known: bool) -> int:
        """The population size (``population_size``, or its default)."""
        return self.population_size or (KNOWN_CONSTRAINTS_POPULATION if constraints_known
                                        else DEFAULT_POPULATION)

    def population(self, study: optuna.Study, hist: History) -> tuple[list[Architecture], list[float]]:
        """The last ``population_size`` completed trials and their fitness; with known
        constraints, the last ``population_size`` feasible ones (while there are any)."""
        # Read from the end: a proposal costs the same at trial 100 and at trial 10,000.
        rows = list(range(max(0, len(hist) - self._population), len(hist)))
        if self.constraints_known():
            feasible: list[int] = []
            for i in reversed(range(len(hist))):
                if hist.violations[i] <= 0:
                    feasible.append(i)
                    if len(feasible) == self._population:
                        break
            rows = feasible[::-1] or rows
        fit = self.fitness(study, [hist.values[i] for i in rows],
                           [hist.violations[i] for i in rows])
        return [hist.archs[i] for i in rows], list(fit)

    def tournament(self, archs: list[Architecture], fit: list[float], rng: random.Random) -> Architecture:
        idx = rng.sample(range(len(archs)), min(self._sample, len(archs)))
        return archs[max(idx, key=lambda i: (fit[i], -i))]

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        archs, fit = self.population(study, hist)
        return self.screened_mutation(study, self.tournament(archs, fit, rng), hist, rng)
