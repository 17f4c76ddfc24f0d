"""Estimator: scores an architecture and says what the score cost; :class:`TrialContext`, the
port through which it sees the study it scores for."""

from __future__ import annotations

import copy
from abc import ABC, abstractmethod
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TypeAlias, TypeVar

from optuna.trial import TrialState

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.backend import Backend
from frugalnas.ports.cost import Cost
from frugalnas.ports.data import DataSource
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.errors import ConfigError

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


#: A value a study's key-value store holds (what JSON can write).
JSONValue: TypeAlias = "None | bool | int | float | str | list[JSONValue] | dict[str, JSONValue]"


@dataclass(frozen=True)
class PastTrial:
    """One trial of the study as an estimator may read it (:meth:`TrialContext.history`): a
    copy, so changing it changes nothing in the study.

    ``architecture`` is the architecture's text form (``str(arch)``, parse it with
    ``context.space.parse``), from the trial's record or rebuilt from its parameters;
    ``None`` when neither is there yet (a trial whose strategy has not finished proposing).
    ``values``: the objective values, in the study's objective order (``None`` unless
    COMPLETE). ``metrics``: the metrics its estimator produced (empty unless COMPLETE).
    ``prescreen``: the proxy values a pre-screening strategy measured when it chose the
    candidate (``proxy_<name>``; empty without a pre-screen)."""

    number: int
    state: TrialState
    architecture: str | None
    values: tuple[float, ...] | None = None
    metrics: Mapping[str, float] = field(default_factory=dict)
    prescreen: Mapping[str, float] = field(default_factory=dict)


class StudyStore(ABC):
    """A study's key-value store: JSON values under string keys, kept in the study's storage,
    so every worker and a reopened study read what one of them wrote (SI-EvoNAS keeps its
    generation plans there). Keys are the estimator's to choose; prefix them with its name.
    Outside a study the store is in memory (:class:`MemoryStore`)."""

    @property
    @abstractmethod
    def identity(self) -> Hashable:
        """Which store this is: equal for two stores of the same study in the same storage
        object (a cache of what the store holds may be keyed by it)."""

    @abstractmethod
    def read(self) -> dict[str, JSONValue]:
        """Every entry (one read of the storage)."""

    @abstractmethod
    def write(self, key: str, value: JSONValue) -> None:
        """Store ``value`` under ``key``, replacing what was there."""

    def get(self, key: str, default: JSONValue = None) -> JSONValue:
        """The value under ``key``, ``default`` when there is none."""
        return self.read().get(key, default)


class MemoryStore(StudyStore):
    """A :class:`StudyStore` in memory: the store of a context outside a study."""

    def __init__(self) -> None:
        self._entries: dict[str, JSONValue] = {}

    @property
    def identity(self) -> Hashable:
        return ("memory", id(self))

    def read(self) -> dict[str, JSONValue]:
        return copy.deepcopy(self._entries)

    def write(self, key: str, value: JSONValue) -> None:
        self._entries[str(key)] = copy.deepcopy(value)


@dataclass
class TrialContext:
    """The port between an estimator and the study it scores for: everything an estimator
    receives from the study, and nothing else (no study, optuna study or trial object).

    Built by the study for each evaluation (``Study.context``); built directly,
    ``TrialContext(space=..., backend=..., seed=..., dataset_loader=...)``, it serves an
    estimator outside any study: no trial number, an empty history, an in-memory store,
    ``report`` and ``log_metrics`` do nothing.

    - ``space``, ``backend``, ``seed``; ``dataset`` (loaded by ``dataset_loader`` on first
      use; ``dataset_loader`` is ``None`` when there is no dataset);
    - ``shared(Type)``: the object of that type the study's strategy shares;
    - ``trial_number`` (``None`` outside a trial), ``study_name`` (``None`` outside a study),
      ``directions`` (``"maximize"``/``"minimize"`` per objective);
    - ``report(step, metrics)``: intermediate results, for the study's pruner;
      ``log_metrics(metrics, step)``: study-level metrics, for the study's plugins;
    - ``history(states)``: the study's trials, read-only (:class:`PastTrial`);
    - ``store``: the study's key-value store (:class:`StudyStore`);
    - ``artifact_dir(tag)`` / ``artifact_file(name)``: where to keep files (checkpoints) that
      a reopened study or another worker finds again."""

    space: SearchSpace
    backend: Backend
    seed: int = 0
    dataset_loader: Callable[[], DataSource] | None = None
    shared_states: dict[type, object] = field(default_factory=dict)

    @cached_property
    def dataset(self) -> DataSource:
        if self.dataset_loader is None:
            raise ValueError("this estimator needs a dataset, but the study has none")
        return self.dataset_loader()

    def shared(self, kind: type[T]) -> T:
        """The object of type ``kind`` the study's strategy shares with estimators; a
        ConfigError names the type when the strategy shares none."""
        for state in self.shared_states.values():
            if isinstance(state, kind):
                return state
        raise ConfigError(f"this estimator needs a strategy that shares a {kind.__name__} "
                          "(see the estimator's documentation for the strategy to pair it with)")

    # -- the study, as far as an estimator sees it (outside a study: nothing) -------------
    @property
    def trial_number(self) -> int | None:
        """The number of the trial this evaluation is for; ``None`` outside a trial
        (``study.evaluate``, an evaluation outside a study)."""
        return None

    @property
    def study_name(self) -> str | None:
        """The study's name (stable across reopenings and workers); ``None`` outside a
        study."""
        return None

    @property
    def directions(self) -> tuple[str, ...]:
        """``"maximize"`` or ``"minimize"`` for each objective of the study (outside a study:
        one objective, maximised)."""
        return ("maximize",)

    def report(self, step: int, metrics: Mapping[str, float], *, last: bool = False) -> None:
        """Report what the estimator knows after ``step`` (an epoch): ``value``, its metrics
        and the cost so far, by name (``last``: no step follows). The study makes the
        objective value (optuna's pruners) or the objective vector (multi-objective pruners
        such as ``pareto``) of it and raises ``optuna.TrialPruned`` when its pruner says stop.
        Nothing happens outside a trial."""

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        """Report study-level metrics (a supernet's training loss, a generation's figures) to
        the study's plugins (MLflow); nothing happens outside a study."""

    def history(self, states: Sequence[TrialState] | None = (TrialState.COMPLETE,)
                ) -> list[PastTrial]:
        """The study's trials in those ``states`` (``None``: every trial, this one included),
        in trial-number order; empty outside a study."""
        return []

    @cached_property
    def store(self) -> StudyStore:
        """The study's key-value store; outside a study, one in memory for this context."""
        return MemoryStore()

    def artifact_dir(self, tag: str) -> Path | None:
        """A folder for this study's files of one kind (``tag``, such as ``"sievo"``), the
        same for every process and every reopening where the storage allows it:
        ``<db>-<tag>/`` beside a sqlite database file ``<db>.db``; for a server storage
        ``<tmp>/frugalnas-<tag>/``; for an in-memory study ``<tmp>/frugalnas-<tag>/<pid>/``.
        ``None`` outside a study. The folder may not exist yet."""
        return None

    def artifact_file(self, name: str) -> Path | None:
        """A file beside the study's sqlite database (``<db file>.<name>``), found again by a
        reopened study and by other workers; ``None`` for other storages and outside a
        study."""
        return None



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
        """Raise :class:`~frugalnas.ports.errors.ConfigError` when this estimator cannot score
        architectures of ``space``. Studies call it before the first trial; the default
        accepts every space."""

    def known_metrics(self, arch: Architecture, space: SearchSpace) -> Mapping[str, float]:
        """The metrics of ``arch`` this estimator can give *without* evaluating it (a latency
        or size table, a cheap predictor), by the names an evaluation reports them under (a
        metric or a ``Cost`` field such as ``params``). Each value must equal what
        :meth:`evaluate` reports for the same architecture. A constrained study hands these to
        its strategy (``StrategyServices.known_constraints``), which can then propose only
        architectures that meet the constraints. The default knows nothing."""
        return {}

    @abstractmethod
    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        """Score ``arch``; higher is better unless the study says otherwise. ``context`` is
        all the estimator receives from the study (:class:`TrialContext`)."""
