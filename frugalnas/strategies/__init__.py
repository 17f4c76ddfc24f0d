"""Search strategies (built-in plugin ``strategies``): regularized evolution, local search,
surrogate-assisted evolution, BANANAS, multi-objective evolution and the proxy pre-screen
wrapper, each an optuna sampler that rebuilds its state from the study's storage; and optuna's
TPE, NSGA-II/III and GP samplers by name (``tpe``, ``nsga2``, ``nsga3``, ``gp``). Random search
is the plugin ``random`` (:mod:`frugalnas.strategies.random`)."""

from __future__ import annotations

from typing import Any

from frugalnas.core.plugins import hookimpl
from frugalnas.strategies.base import ArchSampler, strategy_factory
from frugalnas.strategies.local_search import LocalSearchSampler
from frugalnas.strategies.mo_evolution import (MultiObjectiveEvolutionSampler,
                                               check_reference_point)
from frugalnas.strategies.optuna_samplers import optuna_strategies
from frugalnas.strategies.prescreen import prescreen_strategy
from frugalnas.strategies.regularized import RegularizedEvolutionSampler
from frugalnas.strategies.surrogate_search import BananasSampler, SurrogateEvolutionSampler


STRATEGIES: dict[str, type[ArchSampler]] = {
    "regularized-evolution": RegularizedEvolutionSampler,
    "local-search": LocalSearchSampler,
    "surrogate-evolution": SurrogateEvolutionSampler,
    "bananas": BananasSampler,
    "mo-evolution": MultiObjectiveEvolutionSampler,
}


@hookimpl
def frugalnas_check_config(config: Any, host: Any) -> None:
    """Before the first trial: ``mo-evolution``'s reference point has one value per objective."""
    if config.strategy == "mo-evolution":
        check_reference_point(config.strategy_options.get("reference_point"),
                              len(config.directions))


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {**{name: strategy_factory(cls) for name, cls in STRATEGIES.items()},
            "prescreen": prescreen_strategy, **optuna_strategies()}
