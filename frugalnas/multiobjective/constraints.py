"""Constraints by metric name: reading a trial's feasibility, ranking infeasible trials, and
handing the constraints to optuna's samplers.

A study's ``constraints`` are upper bounds, ``{metric: bound}``. After each completed trial the
study records, as user attributes (names in :mod:`frugalnas.ports.keys`; read through
:mod:`frugalnas.ports.trial_constraints`, the record of truth), each constraint's
``value - bound`` (:data:`CONSTRAINTS_ATTR`, optuna's convention: <= 0 is feasible), whether the
trial is feasible (:data:`FEASIBLE_ATTR`) and its total relative violation
``sum(max(0, value - bound) / |bound|)`` (:data:`VIOLATION_ATTR`). With optuna >= 5 it also calls
``trial.set_constraint``, which optuna's TPE, NSGA-II/III and GP samplers read; with optuna 4
those samplers get ``constraints_func`` (:func:`sampler_constraint_options`). Ranking follows
Deb's constrained domination (Deb et al., IEEE TEVC 2002): a feasible trial beats an
infeasible one, and of two infeasible trials the smaller violation wins.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import optuna
from optuna.trial import FrozenTrial

# The readers of a trial's record live in core (the study reads it too); the same names here.
from frugalnas.ports.trial_constraints import constraint_values, is_feasible, violation

__all__ = ["constraint_values", "constraints_func", "is_feasible", "sampler_constraint_options",
           "violation"]


def constraints_func(names: Sequence[str]) -> Callable[[FrozenTrial], list[float]]:
    """optuna's ``constraints_func`` for a frugalnas study: the recorded ``value - bound`` of
    each constraint in ``names`` (a trial without a record counts as violating by 1.0)."""
    names = list(names)

    def func(trial: FrozenTrial) -> list[float]:
        recorded = constraint_values(trial)
        return [recorded.get(n, 1.0) for n in names]

    return func


def sampler_constraint_options(constraints: Mapping[str, float] | None) -> dict[str, Any]:
    """Keyword arguments that make an optuna sampler (TPE, NSGA-II/III, GP) prefer feasible
    trials: none with optuna >= 5 (the study calls ``trial.set_constraint``, which those
    samplers read; ``constraints_func`` is deprecated there), ``constraints_func`` with
    optuna 4."""
    if not constraints or hasattr(optuna.trial.Trial, "set_constraint"):
        return {}
    return {"constraints_func": constraints_func(list(constraints))}
