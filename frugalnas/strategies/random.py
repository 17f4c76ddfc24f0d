"""Random search (built-in plugin ``random``)."""

from __future__ import annotations

import random
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.space import SearchSpace
from frugalnas.strategies.base import ArchSampler, History


class RandomArchSampler(ArchSampler):
    """Uniform random architectures, never one already evaluated or running (while the space
    has unseen ones); seeded per trial, so workers sharing a storage do not repeat each other."""

    fixed_options = ("n_init", "bridge_infeasible")

    def __init__(self, space: SearchSpace, seed: int = 0, *, warm_start_proxy: str | None = None,
                 warm_start_pool: int = 100, warm_start_options: dict[str, Any] | None = None,
                 constraint_model: bool = True, feasibility_threshold: float = 0.5,
                 screen_size: int = 10, violation_penalty: float = 5.0, host: Any = None):
        super().__init__(space, seed, 1, warm_start_proxy=warm_start_proxy,
                         warm_start_pool=warm_start_pool, warm_start_options=warm_start_options,
                         constraint_model=constraint_model,
                         feasibility_threshold=feasibility_threshold, screen_size=screen_size,
                         violation_penalty=violation_penalty, host=host)

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        return self.fresh_random(hist, rng)
