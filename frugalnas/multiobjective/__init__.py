"""Multi-objective tools (built-in plugin ``multiobjective``): hypervolume, constraints by
metric name and the ``pareto`` pruner for studies with several objectives; the plugin also
registers optuna's single-objective pruners by name (``median``, ``successive-halving``,
``hyperband``, ``nop``). See docs/multiobjective.md."""

from __future__ import annotations

from typing import Any

from frugalnas.core.plugins import hookimpl
from frugalnas.multiobjective.constraints import (constraints_func, is_feasible,
                                                  sampler_constraint_options, violation)
from frugalnas.multiobjective.hypervolume import hypervolume
from frugalnas.multiobjective.pruning import ParetoPruner, builtin_pruners

__all__ = ["ParetoPruner", "constraints_func", "hypervolume", "is_feasible",
           "sampler_constraint_options", "violation"]


@hookimpl
def frugalnas_pruners() -> dict[str, Any]:
    return builtin_pruners()
