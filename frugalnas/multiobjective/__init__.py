"""Multi-objective tools (built-in plugin ``multiobjective``): hypervolume, constraints by
metric name and the ``pareto`` pruner for studies with several objectives; the plugin also
registers optuna's single-objective pruners by name (``median``, ``successive-halving``,
``hyperband``, ``nop``). See docs/multiobjective.md."""

from __future__ import annotations

from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory
# Eager: the module and this function share the name ``hypervolume`` (numpy only).
from frugalnas.multiobjective.hypervolume import hypervolume

__getattr__ = lazy_attributes(__name__, {
    **{name: "frugalnas.multiobjective.constraints" for name in (
        "constraints_func", "is_feasible", "sampler_constraint_options", "violation")},
    "ParetoPruner": "frugalnas.multiobjective.pruning"})

__all__ = ["ParetoPruner", "constraints_func", "hypervolume", "is_feasible",
           "sampler_constraint_options", "violation"]


@hookimpl
def frugalnas_pruners() -> dict[str, Any]:
    """``pareto``, ``pareto-halving`` and ``pareto-hv`` (several objectives) and optuna's
    single-objective pruners by name, imported (with optuna) when first used."""
    def lazy(attribute: str, summary: str) -> LazyFactory:
        return LazyFactory(f"frugalnas.multiobjective.pruning:{attribute}", summary)

    return {
        "pareto": lazy("pareto_pruner", "Multi-objective pruning: stop a trial whose objective "
                       "vector at a step is dominated by other trials' vectors at that step "
                       "(warm-up: n_startup_trials, n_warmup_steps; margin: the benefit of the "
                       "doubt as a fraction of each objective's range)."),
        "pareto-halving": lazy("pareto_halving_pruner", "Multi-objective successive halving: at "
                               "steps min_resource * reduction_factor**k keep the best "
                               "1/reduction_factor of the trials by non-dominated rank and "
                               "crowding distance."),
        "pareto-hv": lazy("pareto_hv_pruner", "Multi-objective pruning by hypervolume chance: "
                          "stop a trial when at most min_chance of the completed trials' gains "
                          "from this step would carry it to a result no completed trial "
                          "dominates."),
        "median": lazy("MedianPruner", "optuna's median stopping rule (one objective)."),
        "successive-halving": lazy("SuccessiveHalvingPruner", "optuna's asynchronous "
                                   "successive halving (one objective)."),
        "hyperband": lazy("HyperbandPruner", "optuna's Hyperband (one objective)."),
        "nop": lazy("NopPruner", "No pruning."),
    }
