"""Random search (built-in plugin ``random``)."""

from __future__ import annotations

import random
from typing import Any

import optuna
from optuna.trial import FrozenTrial

from frugalnas.core.architecture import Architecture
from frugalnas.core.plugins import hookimpl
from frugalnas.strategies.base import ArchSampler, History, strategy_factory


class RandomArchSampler(ArchSampler):
    """Uniform random architectures, never one already evaluated or running (while the space
    has unseen ones); seeded per trial, so workers sharing a storage do not repeat each other."""

    fixed_options = ("n_init",)

    def __init__(self, space, seed: int = 0, **options):
        super().__init__(space, seed, 1, **options)

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        return self.fresh_random(hist, rng)


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"random": strategy_factory(RandomArchSampler)}
