"""Regularized (aging) evolution, Real et al., AAAI 2019."""

from __future__ import annotations

import random
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from frugalnas.core.architecture import Architecture
from frugalnas.core.errors import check_range
from frugalnas.core.space import SearchSpace
from frugalnas.strategies.base import ArchSampler, History


class RegularizedEvolutionSampler(ArchSampler):
    """Regularized (aging) evolution of Real et al. 2019: mutate the best of a random sample.

    The population is the last ``population_size`` completed trials (trial-number order, so
    the oldest leaves first); each child mutates the fittest of ``sample_size`` members drawn
    at random."""

    def __init__(self, space: SearchSpace, seed: int = 0, population_size: int = 20,
                 sample_size: int = 5, n_init: int | None = None, *,
                 warm_start_proxy: str | None = None, warm_start_pool: int = 100,
                 warm_start_options: dict[str, Any] | None = None,
                 constraint_model: bool = True, feasibility_threshold: float = 0.5,
                 screen_size: int = 10, violation_penalty: float = 5.0, host: Any = None):
        check_range("population_size", population_size, 2)
        check_range("sample_size", sample_size, 1, population_size)
        super().__init__(space, seed, n_init if n_init is not None else population_size,
                         warm_start_proxy=warm_start_proxy,
                         warm_start_pool=warm_start_pool, warm_start_options=warm_start_options,
                         constraint_model=constraint_model,
                         feasibility_threshold=feasibility_threshold, screen_size=screen_size,
                         violation_penalty=violation_penalty, host=host)
        self.population_size, self.sample_size = int(population_size), int(sample_size)

    def population(self, study: optuna.Study, hist: History) -> tuple[list[Architecture], list[float]]:
        """The last ``population_size`` completed trials and their fitness; with known
        constraints, the last ``population_size`` feasible ones (while there are any)."""
        rows = list(range(len(hist)))
        if self.constraints_known():
            rows = [i for i in rows if hist.violations[i] <= 0] or rows
        rows = rows[-self.population_size:]
        fit = self.fitness(study, [hist.values[i] for i in rows],
                           [hist.violations[i] for i in rows])
        return [hist.archs[i] for i in rows], list(fit)

    def tournament(self, archs: list[Architecture], fit: list[float], rng: random.Random) -> Architecture:
        idx = rng.sample(range(len(archs)), min(self.sample_size, len(archs)))
        return archs[max(idx, key=lambda i: (fit[i], -i))]

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        archs, fit = self.population(study, hist)
        return self.screened_mutation(study, self.tournament(archs, fit, rng), hist, rng)
