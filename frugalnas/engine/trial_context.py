"""The adapters behind :class:`~frugalnas.ports.estimator.TrialContext`: the port as a
frugalnas :class:`~frugalnas.engine.study.Study` gives it to its estimator for one trial
(:class:`StudyTrialContext`, built by ``Study.context``), and as a bare optuna trial gives it
(:class:`OptunaTrialContext`: an optuna objective driving an estimator without a Study).

Everything the port tells an estimator about its study is computed here, from the optuna
study: the history (:func:`past_trial`), the key-value store (:class:`OptunaStudyStore`, the
study's user attributes) and where files go beside the storage (:func:`study_artifact_dir`,
:func:`study_artifact_file`). Estimators never see the study, the optuna study or the trial.
"""

from __future__ import annotations

import copy
import os
import tempfile
from collections.abc import Callable, Hashable, Mapping, Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path
from typing import TYPE_CHECKING

import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports import optuna_compat
from frugalnas.ports import strategy as strategy_protocol
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.estimator import JSONValue, PastTrial, StudyStore, TrialContext
from frugalnas.ports.keys import ARCHITECTURE_ATTR, CONFIG_ATTR, METRICS_ATTR, PRESCREEN_ATTR
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.trial_architecture import architecture_from

if TYPE_CHECKING:
    from frugalnas.ports.backend import Backend
    from frugalnas.ports.data import DataSource
    from frugalnas.engine.study import Study

#: Study user attributes that belong to frugalnas itself, not to a store's users.
_RESERVED = (CONFIG_ATTR,)


def past_trial(frozen: FrozenTrial, space: SearchSpace) -> PastTrial:
    """``frozen`` as the port's read-only :class:`PastTrial` (copies of its records)."""
    # The recorded string as it is (no parse per past trial), else that of complete params;
    # none, never an error, for parameters of another space: no architecture to tell.
    text = frozen.user_attrs.get(ARCHITECTURE_ATTR)
    if not text and frozen.params:
        try:
            text = str(architecture_from(None, frozen.params, space))
        except Exception:
            text = None
    values = tuple(float(v) for v in frozen.values) if frozen.values is not None else None
    metrics = frozen.user_attrs.get(METRICS_ATTR) or {}
    prescreen = frozen.system_attrs.get(PRESCREEN_ATTR) or {}
    return PastTrial(number=frozen.number, state=frozen.state, architecture=text or None,
                     values=values, metrics=dict(metrics), prescreen=dict(prescreen))


def study_history(ostudy: optuna.Study, space: SearchSpace,
                  states: Sequence[TrialState] | None = (TrialState.COMPLETE,)) -> list[PastTrial]:
    """The trials of ``ostudy`` in ``states`` (``None``: all), as :class:`PastTrial`."""
    wanted = None if states is None else tuple(states)
    return [past_trial(t, space) for t in ostudy.get_trials(deepcopy=False, states=wanted)]


def study_directions(ostudy: optuna.Study) -> tuple[str, ...]:
    return tuple("maximize" if d == StudyDirection.MAXIMIZE else "minimize"
                 for d in ostudy.directions)


def _sqlite_file(ostudy: optuna.Study) -> Path | None:
    url = optuna_compat.storage_url(ostudy)
    if isinstance(url, str) and url.startswith("sqlite:///") and ":memory:" not in url:
        return Path(url[len("sqlite:///"):])
    return None


def study_artifact_dir(ostudy: optuna.Study, tag: str) -> Path:
    """The folder of ``ostudy``'s files of kind ``tag``: ``<db>-<tag>/`` beside a sqlite
    database file, ``<tmp>/frugalnas-<tag>/`` for a server storage, and
    ``<tmp>/frugalnas-<tag>/<pid>/`` for an in-memory study (nothing to resume: processes
    are kept apart)."""
    db = _sqlite_file(ostudy)
    if db is not None:
        return db.parent / f"{db.stem}-{tag}"
    folder = Path(tempfile.gettempdir()) / f"frugalnas-{tag}"
    if optuna_compat.storage_url(ostudy) is None:
        folder = folder / str(os.getpid())
    return folder


def study_artifact_file(ostudy: optuna.Study, name: str) -> Path | None:
    """``<db file>.<name>`` beside ``ostudy``'s sqlite database; ``None`` for other
    storages."""
    db = _sqlite_file(ostudy)
    return None if db is None else db.with_name(f"{db.name}.{name}")


class OptunaStudyStore(StudyStore):
    """A :class:`StudyStore` kept in an optuna study's user attributes (every worker on the
    storage and a reopened study read it). The attributes frugalnas keeps there itself (the
    study's configuration) are neither shown nor writable."""

    def __init__(self, ostudy: optuna.Study):
        self._ostudy = ostudy

    @property
    def identity(self) -> Hashable:
        return (id(optuna_compat.storage_of(self._ostudy)), self._ostudy.study_name)

    def read(self) -> dict[str, JSONValue]:
        return {k: copy.deepcopy(v) for k, v in self._ostudy.user_attrs.items()
                if k not in _RESERVED}

    def write(self, key: str, value: JSONValue) -> None:
        if key in _RESERVED:
            raise ConfigError(f"study store key {key!r} is frugalnas's own; choose another key "
                              "(prefix it with the estimator's name)")
        self._ostudy.set_user_attr(key, value)


@dataclass
class _OptunaBacked(TrialContext):
    """What both adapters answer from an optuna study."""

    def _optuna_study(self) -> optuna.Study:
        raise NotImplementedError

    @property
    def study_name(self) -> str | None:
        return self._optuna_study().study_name

    @property
    def directions(self) -> tuple[str, ...]:
        return study_directions(self._optuna_study())

    def history(self, states: Sequence[TrialState] | None = (TrialState.COMPLETE,)
                ) -> list[PastTrial]:
        return study_history(self._optuna_study(), self.space, states)

    @cached_property
    def store(self) -> StudyStore:
        return OptunaStudyStore(self._optuna_study())

    def artifact_dir(self, tag: str) -> Path | None:
        return study_artifact_dir(self._optuna_study(), tag)

    def artifact_file(self, name: str) -> Path | None:
        return study_artifact_file(self._optuna_study(), name)


@dataclass
class StudyTrialContext(_OptunaBacked):
    """The port as a frugalnas :class:`~frugalnas.engine.study.Study` gives it for one trial
    (``trial`` ``None``: an evaluation outside a trial, ``study.evaluate``). Reports go to
    ``Study.report_step`` (objective value or vector, the study's pruner), study-level
    metrics to ``Study.log_metrics``. Build it with :meth:`of`."""

    _study: Study = field(kw_only=True, repr=False, compare=False)
    _trial: optuna.Trial | None = field(default=None, kw_only=True, repr=False, compare=False)

    @classmethod
    def of(cls, study: Study, trial: optuna.Trial | None = None,
           shared_states: dict[type, object] | None = None) -> StudyTrialContext:
        """The context of ``study`` for ``trial``; ``shared_states`` (default: what the
        study's strategy shares) replaces the strategy's shared objects."""
        if shared_states is None:
            shared_states = strategy_protocol.shared_states(study.strategy)
        return cls(space=study.space, backend=study.backend, seed=study.config.seed,
                   dataset_loader=study.load_dataset, shared_states=dict(shared_states),
                   _study=study, _trial=trial)

    def _optuna_study(self) -> optuna.Study:
        return self._study.optuna_study

    @property
    def trial_number(self) -> int | None:
        return None if self._trial is None else int(self._trial.number)

    def report(self, step: int, metrics: Mapping[str, float], *, last: bool = False) -> None:
        if self._trial is not None:
            self._study.report_step(self._trial, dict(metrics), step, last=last)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._study.log_metrics(dict(metrics), step)


@dataclass
class OptunaTrialContext(_OptunaBacked):
    """The port over a bare ``optuna.Trial`` (an optuna objective that drives an estimator
    without a frugalnas Study): the history, store and files are the trial's study's; with
    one objective ``report`` hands ``metrics["value"]`` to ``trial.report`` and raises
    ``optuna.TrialPruned`` when the study's pruner says stop (with several objectives optuna
    has no intermediate values: nothing is reported); ``log_metrics`` does nothing. Build
    it with :meth:`of`."""

    _trial: optuna.Trial = field(kw_only=True, repr=False, compare=False)

    @classmethod
    def of(cls, trial: optuna.Trial, *, space: SearchSpace, backend: Backend, seed: int = 0,
           dataset_loader: Callable[[], DataSource] | None = None,
           shared_states: dict[type, object] | None = None) -> OptunaTrialContext:
        return cls(space=space, backend=backend, seed=seed, dataset_loader=dataset_loader,
                   shared_states=dict(shared_states or {}), _trial=trial)

    def _optuna_study(self) -> optuna.Study:
        return self._trial.study

    @property
    def trial_number(self) -> int | None:
        return int(self._trial.number)

    def report(self, step: int, metrics: Mapping[str, float], *, last: bool = False) -> None:
        value = metrics.get("value")
        if value is None or len(self._trial.study.directions) > 1:
            return
        self._trial.report(float(value), step)
        if self._trial.should_prune():
            raise optuna.TrialPruned(f"pruned at step {step} with value {value:.4g}")
