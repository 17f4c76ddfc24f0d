"""Estimator: scores an architecture and says what the score cost."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable
from dataclasses import dataclass, field
from functools import cached_property
from typing import Any

from frugalnas.core.architecture import Architecture
from frugalnas.core.backend import Backend
from frugalnas.core.cost import Cost
from frugalnas.core.data import Dataset
from frugalnas.core.space import SearchSpace


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
    the seed, and the study/trial it runs for (``None`` outside a study)."""

    space: SearchSpace
    backend: Backend
    seed: int = 0
    dataset_loader: Callable[[], Dataset] | None = None
    study: Any = None
    trial: Any = None

    @cached_property
    def dataset(self) -> Dataset:
        if self.dataset_loader is None:
            raise ValueError("this estimator needs a dataset, but the study has none")
        return self.dataset_loader()

    def report(self, value: float, step: int) -> None:
        """Report an intermediate value to the trial (for optuna pruners); raises
        ``optuna.TrialPruned`` when the pruner says stop."""
        if self.trial is None or not hasattr(self.trial, "report"):
            return
        import optuna

        self.trial.report(value, step)
        if self.trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} with value {value:.4g}")

    def log_study_metrics(self, metrics: dict[str, float], step: int) -> None:
        if self.study is not None:
            self.study.log_metrics(metrics, step)


class Estimator(ABC):
    """Scores architectures. Parameters go in ``__init__``; ``evaluate`` does the work."""

    name: str = "estimator"
    needs_dataset: bool = True

    @abstractmethod
    def evaluate(self, arch: Architecture, context: EvaluationContext) -> EstimateResult:
        """Score ``arch``; higher is better unless the study says otherwise."""
