"""Estimator: scores an architecture and says what the score cost."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any, TypeVar

from frugalnas.core.architecture import Architecture
from frugalnas.core.backend import Backend
from frugalnas.core.cost import Cost
from frugalnas.core.data import Dataset
from frugalnas.core.space import SearchSpace

T = TypeVar("T")


@dataclass
class EstimateResult:
    """An estimator's answer: the score, extra metrics, the cost, optional artifacts
    (file name -> text or bytes, logged with the trial)."""

    value: float
    metrics: dict[str, float] = field(default_factory=dict)
    cost: Cost = field(default_factory=Cost)
    artifacts: dict[str, str | bytes] = field(default_factory=dict)

    def objective(self, name: str) -> float:
        """An objective by name: ``value``, a metric, or a cost field (``params``, ``flops``,
        ``seconds``, ``epochs``, ``peak_memory``)."""
        if name == "value":
            return float(self.value)
        if name in self.metrics:
            return float(self.metrics[name])
        if hasattr(self.cost, name):
            return float(getattr(self.cost, name))
        valid = ["value", *self.metrics, "params", "flops", "seconds", "epochs", "peak_memory"]
        raise KeyError(f"unknown objective {name!r}; valid: {', '.join(valid)}")

    def all_metrics(self) -> dict[str, float]:
        return {"value": float(self.value), **{k: float(v) for k, v in self.metrics.items()},
                **self.cost.to_metrics()}


@dataclass
class EvaluationContext:
    """What an estimator may use: the space, the data (loaded on first use), the backend,
    the seed, the study/trial it runs for (``None`` outside a study), and the objects the
    study's strategy shares with estimators (``shared(Type)``)."""

    space: SearchSpace
    backend: Backend
    seed: int = 0
    dataset_loader: Callable[[], Dataset] | None = None
    study: Any = None
    trial: Any = None
    shared_states: dict[type, Any] = field(default_factory=dict)

    @cached_property
    def dataset(self) -> Dataset:
        if self.dataset_loader is None:
            raise ValueError("this estimator needs a dataset, but the study has none")
        return self.dataset_loader()

    def shared(self, kind: type[T]) -> T:
        """The object of type ``kind`` the study's strategy shares with estimators; a
        ConfigError names the type when the strategy shares none."""
        for state in self.shared_states.values():
            if isinstance(state, kind):
                return state
        from frugalnas.core.errors import ConfigError

        raise ConfigError(f"this estimator needs a strategy that shares a {kind.__name__} "
                          "(see the estimator's documentation for the strategy to pair it with)")

    def report(self, value: float, step: int) -> None:
        """Report an intermediate value to the trial (for optuna pruners); raises
        ``optuna.TrialPruned`` when the pruner says stop. In a study with several objectives
        optuna has no intermediate values, so nothing is reported."""
        if self.trial is None or not hasattr(self.trial, "report"):
            return
        import optuna

        if len(self.trial.study.directions) > 1:
            return

        self.trial.report(value, step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} with value {value:.4g}")

    def report_step(self, metrics: dict[str, float], step: int, *, last: bool = False) -> None:
        """Report what the estimator knows after ``step`` (an epoch): ``value``, its metrics
        and the cost so far, by name. The study turns it into the objective value (optuna's
        pruners) or the objective vector (multi-objective pruners such as ``pareto``) and
        raises ``optuna.TrialPruned`` when the pruner says stop. Nothing happens outside a
        study."""
        if self.study is not None and self.trial is not None:
            self.study.report_step(self.trial, metrics, step, last=last)

    def log_study_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.study is not None:
            self.study.log_metrics(metrics, step)


class Estimator(ABC):
    """Scores architectures. Parameters go in ``__init__``; ``evaluate`` does the work."""

    name: str = "estimator"
    needs_dataset: bool = True
    #: Metrics ``evaluate`` puts in ``EstimateResult.metrics`` (objectives may name them).
    provides: tuple[str, ...] = ()
    #: ``Cost`` fields ``evaluate`` really measures (objectives may name them).
    measures: tuple[str, ...] = ("seconds",)

    def objective_names(self) -> tuple[str, ...]:
        """Every name a study may use as an objective with this estimator: ``value``, the
        declared metrics and the measured cost fields. A study naming anything else is refused
        before its first trial."""
        return ("value", *self.provides, *self.measures)

    def check_space(self, space: SearchSpace) -> None:
        """Raise :class:`~frugalnas.core.errors.ConfigError` when this estimator cannot score
        architectures of ``space``. Studies call it before the first trial; the default
        accepts every space."""

    @abstractmethod
    def evaluate(self, arch: Architecture, context: EvaluationContext) -> EstimateResult:
        """Score ``arch``; higher is better unless the study says otherwise."""
