"""TrialReport: what the plugins learn of a finished trial (``frugalnas_trial_finished``).

The study builds one report per finished trial, in the process that ran it
(:class:`frugalnas.engine.runner.TrialRunner`), and :meth:`TrialReport.from_frozen` builds one
from the optuna storage alone: for a trial of a dead worker that the heartbeat check failed,
and for a plugin that catches up with trials another process ran (the MLflow plugin's
reconciliation). A plugin therefore needs one mapping from a report to whatever it keeps.
"""

from __future__ import annotations

import datetime
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import COST_FIELDS, Cost
from frugalnas.ports.keys import (ARCHITECTURE_ATTR, COST_ATTR, FAIL_REASON_ATTR,
                                 INTERMEDIATE_ATTR, METRICS_ATTR)
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.trial_architecture import architecture_of
from frugalnas.ports.trial_constraints import recorded_feasible

_EMPTY: Mapping[Any, Any] = MappingProxyType({})


def _read_only(mapping: Mapping[Any, Any]) -> Mapping[Any, Any]:
    """A read-only copy of ``mapping`` (one shared empty mapping for an empty one)."""
    return MappingProxyType(dict(mapping)) if mapping else _EMPTY

#: The states of a finished trial, the only ones a report has.
FINISHED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.FAIL)


def per_step_vectors(per_step: Any, single: Mapping[int, float] | None = None
                     ) -> dict[int, tuple[float, ...]]:
    """Per-step objective vectors from a trial's user attribute :data:`INTERMEDIATE_ATTR`
    (``{str(step): [v1, v2, ...]}``) or, without it, from optuna's intermediate values of a
    single objective (``{step: value}``, each a vector of one)."""
    out = {int(k): tuple(float(v) for v in vector) for k, vector in (per_step or {}).items()}
    if not out and single:
        out = {int(k): (float(v),) for k, v in single.items()}
    return dict(sorted(out.items()))


@dataclass(frozen=True)
class TrialReport:
    """One finished trial, as the lifecycle hook ``frugalnas_trial_finished`` receives it.

    ``state`` is optuna's ``TrialState`` (``COMPLETE``, ``PRUNED`` or ``FAIL``);
    ``architecture`` the evaluated :class:`Architecture` (always set in the hook; ``None``
    only in a report built from a storage trial whose architecture cannot be read, which
    then may still have ``architecture_text``, the recorded string); ``values`` the objective
    values of a COMPLETE trial (``None`` otherwise); ``metrics`` the evaluation's metrics by
    name (the estimator's ``value`` where known, its and the backend's metrics); ``cost``
    what the evaluation cost (``None`` when nothing was measured: a failed evaluation);
    ``error`` why the trial did not complete (a failed trial's reason, a pruned trial's
    pruner message; ``None`` otherwise and for a failed trial whose reason was never
    recorded); ``artifacts`` the files the estimator and backend attached (only known to the
    process that ran the trial); ``started``/``finished`` its start and end (local time, as
    optuna records them); ``intermediate`` the per-step objective vectors reported during
    training (``{step: (v1, ...)}``); ``feasible`` whether it met the study's constraints
    (``None`` without constraints or without a completed evaluation)."""

    number: int
    state: TrialState
    architecture: Architecture | None
    architecture_text: str | None = None
    values: tuple[float, ...] | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    cost: Cost | None = None
    error: str | None = None
    artifacts: Mapping[str, str | bytes] = field(default_factory=dict)
    started: datetime.datetime | None = None
    finished: datetime.datetime | None = None
    intermediate: Mapping[int, tuple[float, ...]] = field(default_factory=dict)
    feasible: bool | None = None

    def __post_init__(self) -> None:
        if self.state not in FINISHED_STATES:
            raise ValueError(f"a trial report is for a finished trial; got state {self.state!r}")
        put = object.__setattr__  # frozen: fill in the normalised fields once, here
        if self.architecture_text is None and self.architecture is not None:
            put(self, "architecture_text", str(self.architecture))
        if self.values is not None:
            put(self, "values", tuple(float(v) for v in self.values))
        if self.cost is not None:
            put(self, "cost", replace(self.cost))
        put(self, "metrics", MappingProxyType({k: float(v) for k, v in self.metrics.items()}))
        put(self, "artifacts", _read_only(self.artifacts))
        put(self, "intermediate", MappingProxyType(
            {int(k): tuple(float(x) for x in v) for k, v in sorted(self.intermediate.items())})
            if self.intermediate else _EMPTY)

    @classmethod
    def _normalised(cls, *, number: int, state: TrialState, architecture: Architecture,
                    values: tuple[float, ...] | None, metrics: dict[str, float],
                    cost: Cost | None, error: str | None,
                    artifacts: Mapping[str, str | bytes], started: datetime.datetime | None,
                    finished: datetime.datetime, intermediate: dict[int, tuple[float, ...]],
                    feasible: bool | None) -> "TrialReport":
        """The report the constructor makes, from fields its caller already holds in the
        normalised types (floats, tuples, a sorted ``intermediate``; a ``metrics`` dict and a
        ``cost`` nobody else changes): the runner's report of each trial it ran, without a
        second pass over the metrics it has just converted."""
        if state not in FINISHED_STATES:
            raise ValueError(f"a trial report is for a finished trial; got state {state!r}")
        report = cls.__new__(cls)
        report.__dict__.update(  # frozen: filled in once, here, as __post_init__ would
            number=number, state=state, architecture=architecture,
            architecture_text=str(architecture), values=values,
            metrics=MappingProxyType(metrics), cost=cost, error=error,
            artifacts=_read_only(artifacts),
            started=started, finished=finished,
            intermediate=MappingProxyType(intermediate) if intermediate else _EMPTY,
            feasible=feasible)
        return report

    @classmethod
    def from_frozen(cls, frozen: FrozenTrial, space: SearchSpace, objectives: Sequence[str],
                    *, error: str | None = None) -> "TrialReport":
        """The report of a finished trial as the optuna storage records it (no artifacts: the
        storage does not keep them). ``objectives`` are the study's objective names (a
        COMPLETE trial's ``value`` is known when it is one); ``error`` replaces the recorded
        failure reason (a stale trial of a dead worker)."""
        state = frozen.state
        try:
            arch = architecture_of(frozen, space)
        except Exception:  # a stale trial gets its report even without an architecture
            arch = None
        text = frozen.user_attrs.get(ARCHITECTURE_ATTR)
        values = None
        metrics: dict[str, float] = {}
        if state == TrialState.COMPLETE and frozen.values is not None:
            values = tuple(frozen.values)
            if "value" in objectives:
                metrics["value"] = float(values[list(objectives).index("value")])
        for k, v in (frozen.user_attrs.get(METRICS_ATTR) or {}).items():
            metrics[k] = float(v)
        recorded = frozen.user_attrs.get(COST_ATTR)
        cost = None
        if isinstance(recorded, dict):
            names = set(COST_FIELDS)
            # The numbers as recorded (JSON keeps an int an int). Cost's fields mix int and
            # float, which one dict value type cannot match, hence Any for the keywords.
            fields_found: dict[str, Any] = {
                k: v for k, v in recorded.items()
                if k in names and isinstance(v, (int, float)) and not isinstance(v, bool)}
            cost = Cost(**fields_found)
        if error is None and state == TrialState.FAIL:
            error = frozen.user_attrs.get(FAIL_REASON_ATTR) or None
        return cls(number=frozen.number, state=state, architecture=arch,
                   architecture_text=str(text) if text else (str(arch) if arch else None),
                   values=values, metrics=metrics, cost=cost,
                   error=str(error) if error is not None else None,
                   started=frozen.datetime_start, finished=frozen.datetime_complete,
                   intermediate=per_step_vectors(frozen.user_attrs.get(INTERMEDIATE_ATTR),
                                                 frozen.intermediate_values),
                   feasible=recorded_feasible(frozen))
