"""Local search over the one-edit neighbourhood (after White et al., "Local search is state
of the art for NAS benchmarks", 2020)."""

from __future__ import annotations

import random
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from frugalnas.core.architecture import Architecture
from frugalnas.core.space import SearchSpace
from frugalnas.strategies.base import ArchSampler, History


class LocalSearchSampler(ArchSampler):
    """Local search: evaluate unseen one-edit neighbours of the best architecture so far.

    At a local optimum (all neighbours seen) it continues from the next best architecture
    that still has unseen neighbours (best-first). With constraints, feasible architectures
    come first and infeasible ones by increasing violation."""

    def __init__(self, space: SearchSpace, seed: int = 0, n_init: int = 5, *,
                 warm_start_proxy: str | None = None,
                 warm_start_pool: int = 100, warm_start_options: dict[str, Any] | None = None,
                 constraint_model: bool = True, feasibility_threshold: float = 0.5,
                 screen_size: int = 10, violation_penalty: float = 5.0, host: Any = None):
        super().__init__(space, seed, n_init, warm_start_proxy=warm_start_proxy,
                         warm_start_pool=warm_start_pool, warm_start_options=warm_start_options,
                         constraint_model=constraint_model,
                         feasibility_threshold=feasibility_threshold, screen_size=screen_size,
                         violation_penalty=violation_penalty, host=host)

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        fit = self.fitness(study, hist.values, hist.violations)
        order = sorted(range(len(hist)), key=lambda i: (-fit[i], hist.numbers[i]))
        for i in order:
            fresh = [n for n in self.space.neighbours(hist.archs[i]) if n.key not in hist.seen]
            if fresh:
                if not self.constrained(hist):
                    return rng.choice(fresh)
                rng.shuffle(fresh)
                return self.prefer_feasible(study, hist, fresh)
        # Spaces with numeric decisions have neighbours only along categorical ones.
        return self.fresh_mutation(hist.archs[order[0]], hist, rng)
