"""What a trial recorded of its study's constraints: the one reader.

The study records each constrained trial twice (``TrialRunner.record_constraints``): as
frugalnas's user attributes :data:`~frugalnas.ports.keys.CONSTRAINTS_ATTR` (``{metric: value -
bound}``), :data:`~frugalnas.ports.keys.FEASIBLE_ATTR` and
:data:`~frugalnas.ports.keys.VIOLATION_ATTR`, and, with optuna >= 5, through
``trial.set_constraint`` for optuna's samplers. The user attributes are the record of truth:
optuna 4 (which ``pyproject.toml`` allows) has no ``set_constraint``, and the relative
violation exists only there. Every frugalnas reader goes through these functions.
"""

from __future__ import annotations

from typing import Any, Protocol

from frugalnas.ports.keys import CONSTRAINTS_ATTR, FEASIBLE_ATTR, VIOLATION_ATTR


class RecordedTrial(Protocol):
    """A trial with user attributes: optuna's ``FrozenTrial`` or a running ``Trial``."""

    @property
    def user_attrs(self) -> dict[str, Any]: ...


def feasible_flag(value: Any) -> bool | None:
    """A trial's feasibility user attribute as a bool (``"true"``, ``"1"``, ``"yes"`` count as
    true); ``None`` without one (a study without constraints)."""
    if value is None:
        return None
    if isinstance(value, str):
        return value.strip().lower() in ("true", "1", "yes")
    return bool(value)


def recorded_feasible(trial: RecordedTrial) -> bool | None:
    """Whether ``trial`` met its study's constraints; ``None`` without a record (a study
    without constraints, a trial that did not finish)."""
    return feasible_flag(trial.user_attrs.get(FEASIBLE_ATTR))


def is_feasible(trial: RecordedTrial) -> bool:
    """Whether a trial met its study's constraints (``True`` in a study without any)."""
    return recorded_feasible(trial) is not False


def violation(trial: RecordedTrial, default: float = 0.0) -> float:
    """A trial's total relative constraint violation (0.0 when feasible; ``default`` without
    a record)."""
    return float(trial.user_attrs.get(VIOLATION_ATTR, default))


def constraint_values(trial: RecordedTrial) -> dict[str, float]:
    """``{metric: value - bound}`` of a trial (empty in a study without constraints)."""
    return {k: float(v) for k, v in (trial.user_attrs.get(CONSTRAINTS_ATTR) or {}).items()}
