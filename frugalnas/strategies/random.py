"""Random search (built-in plugin ``random``)."""

from __future__ import annotations

import random
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.space import SearchSpace
from frugalnas.strategies.base import ArchSampler
from frugalnas.strategies.history import History


class RandomArchSampler(ArchSampler):
    """Uniform random architectures, never one already evaluated or running (while the space
    has unseen ones); seeded per trial, so workers sharing a storage do not repeat each other."""

    fixed_options = ("n_init", "bridge_infeasible")

    def __init__(self, space: SearchSpace, seed: int = 0, **common: Any):
        super().__init__(space, seed, 1, **common)

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        return self.fresh_random(hist, rng)
