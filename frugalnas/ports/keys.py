"""Names under which frugalnas stores things in optuna's storage, shared by every module that
reads or writes them (the study, strategies, estimators, tracking)."""

from __future__ import annotations

#: Study user attribute: the study's :class:`StudyConfig` as JSON.
CONFIG_ATTR = "frugalnas_config"
#: Trial user attribute: the architecture string (``str(Architecture)``).
ARCHITECTURE_ATTR = "architecture"
#: Trial user attribute: the estimator's metrics, ``{name: float}``.
METRICS_ATTR = "metrics"
#: Trial user attribute: the evaluation's cost (``Cost`` as a dict).
COST_ATTR = "cost"
#: Trial user attribute: the one-line reason a trial failed.
FAIL_REASON_ATTR = "fail_reason"
#: Trial system attribute: a pre-screen's proxy scores of the chosen candidate.
PRESCREEN_ATTR = "frugalnas_prescreen"
#: Prefix of trial system attributes a strategy records (``frugalnas:<metric>``).
STRATEGY_METRIC_PREFIX = "frugalnas:"
#: Trial user attribute of a study with constraints: ``{metric: value - bound}`` for each
#: constraint (optuna's convention: a trial is feasible when every entry is <= 0).
CONSTRAINTS_ATTR = "constraints"
#: Trial user attribute of a study with constraints: ``True`` when every constraint holds.
FEASIBLE_ATTR = "feasible"
#: Trial user attribute of a study with constraints: the total relative violation,
#: ``sum(max(0, value - bound) / |bound|)`` (0.0 for a feasible trial); strategies rank
#: infeasible trials by it.
VIOLATION_ATTR = "violation"
#: Trial user attribute of a study with several objectives whose estimator reports per step:
#: ``{str(step): [value of each objective, in the study's objective order]}``, written after
#: every step (multi-objective pruning reads it, the MLflow plugin can log it).
INTERMEDIATE_ATTR = "intermediate_values"
#: Trial user attribute of a trial whose evaluation process died (run isolated: aborted,
#: segfaulted, killed for memory): how it died (``"SIGABRT"``, ``"exit 3"``). A candidate
#: with two such trials is not evaluated again.
CRASH_ATTR = "candidate_crash"
#: How the fail reason of a trial stopped by a signal starts (``"interrupted by SIGTERM"``).
#: Like a dead worker's trial, its MLflow run ends KILLED: nothing is wrong with the candidate.
INTERRUPTED_PREFIX = "interrupted by "
