"""Built-in plugin: seeded random search."""

from __future__ import annotations

from typing import Any

import optuna

from frugalnas.core.plugins import hookimpl
from frugalnas.core.space import SearchSpace


def random_strategy(space: SearchSpace | None = None, seed: int = 0) -> optuna.samplers.BaseSampler:
    """Uniform random sampling of every decision (optuna's RandomSampler, seeded)."""
    return optuna.samplers.RandomSampler(seed=seed)


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"random": random_strategy}
