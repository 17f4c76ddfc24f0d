"""Study: a NAS study on top of an optuna study (its storages, samplers and pruners)."""

from __future__ import annotations

import contextlib
import math
import sys
import threading
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import asdict, replace
from typing import TYPE_CHECKING, Any, Literal, cast

import optuna
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports import strategy as strategy_protocol
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.backend import Backend
from frugalnas.ports.config import ISOLATION_MODES, StudyConfig
from frugalnas.ports.data import DataSource
from frugalnas.host.dotted import dotted_module_refused, dotted_name
from frugalnas.ports.errors import (ConfigConflictError, ConfigError, FrugalnasError,
                                    PluginHookError, PluginNotAllowedError, TrialFailure,
                                    UnknownComponentError, check_choice)
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.keys import CONFIG_ATTR, INTERMEDIATE_ATTR
from frugalnas.host.kinds import BACKENDS, DATASETS
from frugalnas.host.loading import refused_plugins
from frugalnas.host.plugins import PluginHost, get_host
from frugalnas.engine.planning import (StudyPlan, build_components, check_config, make_pruner,
                                       plan_study)
from frugalnas.engine.runner import Candidate, TrialRunner
from frugalnas.engine.runner import storage_failures_stop
from frugalnas.ports.space import SearchSpace
from frugalnas.engine.storage_url import check_storage_url, open_storage, storage_error
from frugalnas.ports.trial_architecture import architecture_of
from frugalnas.ports.trial_constraints import constraint_values, is_feasible, violation
from frugalnas.engine.trial_context import StudyTrialContext

if TYPE_CHECKING:
    import pandas as pd

#: The directions optuna takes by name (StudyConfig checks each against them).
Direction = Literal["minimize", "maximize"]


class TrialRecord:
    """An optuna trial with its :class:`Architecture`.

    ``architecture`` is ``None`` for a trial whose architecture cannot be read yet or ever: a
    RUNNING trial of another worker that has not finished its proposal, a WAITING trial with
    partial parameters, a trial that failed while its strategy proposed. For a COMPLETE or
    PRUNED trial an unreadable architecture is an error naming the trial."""

    def __init__(self, frozen: FrozenTrial, space: SearchSpace):
        self.frozen = frozen
        self.architecture: Architecture | None = self.read_architecture(frozen, space)

    @staticmethod
    def read_architecture(frozen: FrozenTrial, space: SearchSpace) -> Architecture | None:
        """The architecture of ``frozen`` (its recorded string, else complete parameters);
        ``None`` when it cannot be read and the trial is not COMPLETE or PRUNED
        (:func:`frugalnas.ports.trial_architecture.architecture_of`)."""
        return architecture_of(frozen, space)

    def __getattr__(self, name: str) -> Any:
        if name == "frozen":
            raise AttributeError(name)
        return getattr(self.frozen, name)

    def __repr__(self) -> str:
        return f"TrialRecord(number={self.frozen.number}, values={self.frozen.values}, architecture={self.architecture})"


class Study:
    """A NAS study. Create it with :func:`create_study` or :func:`load_study`."""

    def __init__(self, optuna_study: optuna.Study, config: StudyConfig, host: PluginHost,
                 space: SearchSpace | None = None, estimator: Estimator | None = None):
        self.optuna_study = optuna_study
        self.config = config
        #: The study's plugin host: every component of the study is created from it.
        self.host = host
        #: The one space object of the study: the strategy that proposes and the estimator
        #: that scores see this same object.
        self.space: SearchSpace = space if space is not None else self.host.create(
            "search_spaces", config.space, **config.space_options)
        self._estimator: Estimator | None = estimator
        self._backend: Backend | None = None
        self._dataset: DataSource | None = None
        self._lock = threading.RLock()  # n_jobs > 1: components are created once
        self.planned_trials: int | None = None
        #: Per-study state of lifecycle plugins, by plugin name (the MLflow plugin keeps its
        #: run ids and write errors under "mlflow").
        self.plugin_state: dict[str, Any] = {}
        #: Lifecycle hooks that raised, one :class:`PluginHookError` per plugin and hook (with
        #: a count). Such a failure never changes a trial's state; ``frugalnas run`` exits 1.
        self.plugin_errors: list[PluginHookError] = []
        #: Runs this study's trials and keeps its plugin session (``Study.optimize``,
        #: ``ask``/``tell`` and the shared-storage workers all go through it).
        self.runner = TrialRunner(self)
        #: Intermediate objective vectors of this process's running trials, by trial number.
        self._intermediate: dict[int, dict[str, list[float]]] = {}
        self._unreported: set[str] = set()

    # -- components (created on first use) ----------------------------------------------
    @property
    def name(self) -> str:
        return self.optuna_study.study_name

    @property
    def directions(self) -> list[str]:
        return [d.name.lower() for d in self.optuna_study.directions]

    @property
    def strategy(self) -> optuna.samplers.BaseSampler:
        """The sampler that proposes architectures (the outermost of a wrapper chain)."""
        return self.optuna_study.sampler

    @property
    def estimator(self) -> Estimator:
        estimator = self._estimator  # created once: every trial reads it without the lock
        if estimator is not None:
            return estimator
        with self._lock:
            if self._estimator is None:
                self._estimator = self.host.create_estimator(self.config.estimator,
                                                             self.config.estimator_options)
            return self._estimator

    @property
    def backend(self) -> Backend:
        backend = self._backend
        if backend is not None:
            return backend
        with self._lock:
            if self._backend is None:
                self._backend = self.host.create(BACKENDS, self.config.backend,
                                                 **self.config.backend_options)
            return self._backend

    def load_dataset(self) -> DataSource:
        with self._lock:
            if self._dataset is None:
                if self.config.dataset is None:
                    raise ConfigError(f"estimator {self.config.estimator!r} needs a dataset; set dataset=")
                data = self.host.create(DATASETS, self.config.dataset, seed=self.config.seed,
                                        **self.config.dataset_options)
                tasks = type(self.space).tasks
                if data.task.name not in tasks:
                    raise ConfigError(f"space {self.config.space!r} builds networks for "
                                      f"{', '.join(tasks)}; dataset {self.config.dataset!r} "
                                      f"holds {data.task.name} data")
                self._dataset = data
            return self._dataset

    def context(self, trial: optuna.Trial | None = None) -> TrialContext:
        """What the estimator receives for ``trial`` (``None``: outside a trial): the port
        :class:`TrialContext`, through an adapter that reports to this study."""
        return StudyTrialContext.of(self, trial)

    # -- running -------------------------------------------------------------------------
    def evaluate(self, arch: Architecture | str, trial: Any = None) -> EstimateResult:
        """Score one architecture with the study's estimator (no trial is recorded)."""
        if isinstance(arch, str):
            arch = self.space.parse(arch)
        self.space.validate(arch)
        backend = self.backend
        try:
            result = self.estimator.evaluate(arch, self.context(trial))
        finally:
            metrics, artifacts = backend.trial_outputs()
        result.metrics.update(metrics)
        result.artifacts.update(artifacts)
        return result

    def objective_values(self, result: EstimateResult) -> list[float]:
        try:
            values = [result.objective(name) for name in self.config.objectives]
        except KeyError as exc:
            raise TrialFailure(f"estimator {self.config.estimator!r} did not produce "
                               f"{exc.args[0]}") from None
        for name, v in zip(self.config.objectives, values):
            if not math.isfinite(v):
                raise TrialFailure(f"objective {name!r} is not finite: {v}")
        return values

    def report_step(self, trial: Any, metrics: dict[str, float], step: int, *,
                    last: bool = False) -> None:
        """An estimator's intermediate metrics after ``step`` (an epoch): ``metrics`` maps
        metric names (``value``, metrics, cost fields so far) to numbers.

        One objective: its value goes to optuna's ``trial.report`` and the study's pruner
        decides, as with optuna. Several objectives: the vector of the objectives' values is
        stored on the trial (user attribute :data:`INTERMEDIATE_ATTR`, ``{step: vector}``) and a
        pruner with ``prune_vector(study, trial_number, step, values)`` (such as ``pareto``)
        decides, except after the ``last`` step (the final result follows: stopping would save
        nothing). Raises ``optuna.TrialPruned`` when the pruner says stop."""
        if trial is None or not hasattr(trial, "report"):
            return
        names = self.config.objectives
        values = [metrics.get(name) for name in names]
        if len(names) == 1:
            value = values[0]
            if value is None:
                return
            trial.report(float(value), step)
            if trial.should_prune():
                raise optuna.TrialPruned(f"pruned at step {step} with value {value:.4g}")
            return
        missing = [n for n, v in zip(names, values) if v is None]
        if missing:
            key = ",".join(missing)
            if key not in self._unreported:
                self._unreported.add(key)
                print(f"frugalnas: warning: estimator {self.config.estimator!r} reports no "
                      f"intermediate value of objective(s) {missing}; its trials are not "
                      "pruned", file=sys.stderr, flush=True)
            return
        vector = [float(v) for v in values if v is not None]  # none is None (above)
        steps = self._intermediate.setdefault(trial.number, {})
        steps[str(step)] = vector
        trial.set_user_attr(INTERMEDIATE_ATTR, dict(steps))
        decide = getattr(self.optuna_study.pruner, "prune_vector", None)
        if not last and callable(decide) and decide(self.optuna_study, trial.number, step, vector):
            text = ", ".join(f"{n}={v:.4g}" for n, v in zip(names, vector))
            raise optuna.TrialPruned(f"pruned at step {step}: ({text}) is dominated")

    def report_stale_trial(self, frozen: FrozenTrial) -> None:
        """Tell the plugins that a trial of a dead worker was failed by the heartbeat check."""
        self.runner.report_stale(frozen)

    def start(self) -> None:
        """Start a session of this study: bind the strategy and tell the plugins
        (``frugalnas_study_started``), once; :meth:`optimize` and :meth:`ask` start one
        themselves, :meth:`finish` ends it."""
        self.runner.start()

    def optimize(self, n_trials: int | None = None, timeout: float | None = None, n_jobs: int = 1,
                 catch: Iterable[type[Exception]] = (Exception,),
                 callbacks: list[Callable[[optuna.Study, FrozenTrial], None]] | None = None,
                 isolate: str = "none") -> None:
        """Run trials until ``n_trials`` or ``timeout`` seconds. A failing candidate becomes a
        FAIL trial (with its reason) and the study goes on; exceptions outside ``catch`` stop it.
        ``isolate`` says where each trial is evaluated: ``"none"`` (this process),
        ``"process"`` (a child process, so that a candidate that aborts, segfaults or is killed
        for memory fails its trial only) or ``"auto"`` (a child process for estimators that
        train; see :mod:`frugalnas.engine.isolation`)."""
        if n_trials is not None and (not isinstance(n_trials, int) or n_trials < 0):
            raise ConfigError(f"invalid n_trials {n_trials!r}; expected an integer >= 0")
        if timeout is not None and timeout <= 0:
            raise ConfigError(f"invalid timeout {timeout!r}; expected seconds > 0")
        if not isinstance(n_jobs, int) or isinstance(n_jobs, bool) or n_jobs == 0 or n_jobs < -1:
            raise ConfigError(f"invalid n_jobs {n_jobs!r}; expected an integer >= 1 (or -1: "
                              "one per CPU)")
        check_choice("isolate", isolate, ISOLATION_MODES)
        self.planned_trials = self.trials_to_run(n_trials)
        runner = self.runner
        runner.isolate(isolate)
        runner.start()
        try:
            if runner.search_is_over():
                return  # a reopened study whose search already ended runs no extra trial
            # optuna deep-copies every finished trial for each callback list, so the stop
            # rule is only passed when a strategy of the chain can end the search.
            stop = runner.stop_rule()
            all_callbacks: list[Callable[[optuna.Study, FrozenTrial], None]] = \
                [stop] if stop.needed else []
            all_callbacks += list(callbacks or [])
            with storage_failures_stop(), runner.interrupts(in_this_thread=n_jobs == 1):
                self.optuna_study.optimize(runner.run, n_trials=n_trials, timeout=timeout,
                                           n_jobs=n_jobs, catch=tuple(catch),
                                           callbacks=all_callbacks or None,
                                           gc_after_trial=False)
        finally:
            self.finish()

    def trials_to_run(self, n_trials: int | None) -> int | None:
        """How many trials ``optimize(n_trials)`` will run at most: ``n_trials``, or fewer
        when the strategy plans fewer for the whole search than are left of it."""
        total = strategy_protocol.planned_trials(self.strategy)
        if total is None:
            return n_trials
        left = max(0, total - len(self.optuna_study.get_trials(deepcopy=False)))
        return left if n_trials is None else min(n_trials, left)

    def finish(self) -> None:
        """Tell the plugins the study (or this worker's part of it) is over."""
        self.runner.finish()

    def ask(self) -> Candidate:
        """A new trial and its architecture, chosen by the study's strategy."""
        return self.runner.ask()

    def tell(self, candidate: Candidate, values: float | Sequence[float] | EstimateResult | None = None,
             state: TrialState | None = None) -> FrozenTrial:
        """Finish a trial from :meth:`ask` with its values (or an :class:`EstimateResult`)."""
        return self.runner.tell(candidate, values, state)

    # -- results -------------------------------------------------------------------------
    @property
    def trials(self) -> list[TrialRecord]:
        return [TrialRecord(t, self.space) for t in self.optuna_study.get_trials(deepcopy=False)]

    def completed_trials(self) -> list[TrialRecord]:
        return [TrialRecord(t, self.space) for t in
                self.optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))]

    def feasible_trials(self) -> list[TrialRecord]:
        """The completed trials that meet every constraint (all of them without constraints)."""
        return [t for t in self.completed_trials() if is_feasible(t.frozen)]

    @property
    def best_trial(self) -> TrialRecord:
        """The best completed trial that meets the study's constraints. A ValueError says
        when no trial completed, or when none of the completed ones is feasible (naming the
        least violating one)."""
        if len(self.directions) > 1:
            raise RuntimeError("a study with several objectives has no single best trial; use "
                               "best_trials (its Pareto front)")
        if not self.config.constraints:
            return TrialRecord(self.optuna_study.best_trial, self.space)
        feasible = self.feasible_trials()
        if not feasible:
            raise ValueError(self._no_feasible_message())
        sign = -1.0 if self.directions[0] == "maximize" else 1.0
        return min(feasible, key=lambda t: (sign * t.values[0], t.number))

    @property
    def best_trials(self) -> list[TrialRecord]:
        """The Pareto front of the completed trials that meet the constraints (trial-number
        order); an empty list when no trial completed or none is feasible."""
        if not self.config.constraints:
            return [TrialRecord(t, self.space) for t in self.optuna_study.best_trials]
        feasible = self.feasible_trials()
        signs = [1.0 if d == "maximize" else -1.0 for d in self.directions]
        vecs = [[s * v for s, v in zip(signs, t.values)] for t in feasible]
        front = [t for t, v in zip(feasible, vecs)
                 if not any(all(a >= b for a, b in zip(w, v)) and w != v for w in vecs)]
        return sorted(front, key=lambda t: t.number)

    @property
    def best_value(self) -> float:
        return float(self.best_trial.values[0])

    def _no_feasible_message(self) -> str:
        done = self.completed_trials()
        bounds = ", ".join(f"{k} <= {v:g}" for k, v in self.config.constraints.items())
        if not done:
            return f"no trial completed yet (constraints: {bounds})"
        worst = min(done, key=lambda t: violation(t.frozen, default=math.inf))
        diffs = constraint_values(worst.frozen)
        near = ", ".join(f"{k} = {self.config.constraints[k] + d:g}" for k, d in diffs.items()
                         if k in self.config.constraints)
        return (f"no feasible trial: none of the {len(done)} completed trial(s) meets the "
                f"constraints {bounds} (closest: trial {worst.number}, {near})")

    @property
    def best_architecture(self) -> Architecture:
        best = self.best_trial
        if best.architecture is None:  # not reached: a COMPLETE trial's is read or raises
            raise ConfigError(f"trial {best.number} has no readable architecture")
        return best.architecture

    def trials_dataframe(self, **kwargs: Any) -> pd.DataFrame:
        """optuna's trials table plus an ``architecture`` column."""
        df = self.optuna_study.trials_dataframe(**kwargs)
        if "user_attrs_architecture" in df.columns:
            df.insert(1, "architecture", df["user_attrs_architecture"])
        return df

    def log_metrics(self, metrics: dict[str, float], step: int) -> None:
        """Report study-level metrics (generation fitness, surrogate quality, ...) to plugins."""
        self.runner.notify("frugalnas_study_metrics", study=self, metrics=metrics, step=step)


def create_study(*, space: str | object = "nb201", strategy: str | optuna.samplers.BaseSampler = "random",
                 estimator: str = "nb201-table", directions: str | Sequence[str] | None = None,
                 storage: str | optuna.storages.BaseStorage | None = None,
                 study_name: str | None = None, load_if_exists: bool = False,
                 plugins: Sequence[Any] = (), host: PluginHost | None = None,
                 **options: Any) -> Study:
    """Create (or with ``load_if_exists`` reopen) a study.

    ``space`` is a registered space name, a dotted path ``package.module:name`` to a
    define-by-run builder or SearchSpace class, or that function or class itself.
    ``strategy`` is a registered strategy name or any optuna sampler; ``estimator`` a
    registered estimator. ``directions`` is one direction (``"maximize"``, the default, or
    ``"minimize"``) or one per objective (``direction=`` is accepted too). ``plugins`` adds
    plugins (names or objects); ``host`` gives a ready plugin host instead.

    Every other keyword is a :class:`StudyConfig` field: the other components and each
    component's options (``backend``, ``dataset``, ``space_options``, ``strategy_options``,
    ``estimator_options``, ``backend_options``, ``dataset_options``), ``objectives`` (one per
    direction), ``seed``, ``trial_timeout``, ``constraints``, ``plugin_options``,
    ``disable_plugins`` and ``pruner``/``pruner_options``. Unlike plain optuna, no pruner is
    used unless ``pruner`` is given: a registered pruner's name (``"pareto"`` for several
    objectives, ``"median"``, ...; stored with the study) or an optuna pruner object
    (training estimators report per epoch)."""
    dirs = _directions(directions, options.pop("direction", None))
    given_space = None
    if not isinstance(space, str):  # a builder function or SearchSpace class, by its path
        given_space, space = space, dotted_name(space)
    plugins = _names(plugins)
    disable_plugins = _names(options.pop("disable_plugins", ()))
    sampler_obj = strategy if isinstance(strategy, optuna.samplers.BaseSampler) else None
    strategy_name = type(strategy).__name__ if sampler_obj is not None else strategy
    str_plugins = [p for p in plugins if isinstance(p, str)]
    pruner_obj = options.pop("pruner", None)
    if pruner_obj is not None and not isinstance(pruner_obj, optuna.pruners.BasePruner):
        options["pruner"], pruner_obj = pruner_obj, None
    objectives = options.pop("objectives", None)
    cfg = dict(space=space, strategy=strategy_name, estimator=estimator, directions=dirs,
               objectives=list(objectives) if objectives is not None else
               (["value"] if len(dirs) == 1 else None),
               plugins=str_plugins, disable_plugins=list(disable_plugins), **options)
    if cfg["objectives"] is None:
        raise ConfigError(f"{len(dirs)} directions {dirs} need as many objectives, "
                          "e.g. objectives=['value', 'params']")
    config = StudyConfig.from_mapping(cfg)
    # Validate everything before anything is created in the storage.
    check_storage_url(storage)
    host = host if host is not None else get_host(plugins, config.disable_plugins)
    if given_space is not None:
        host.given_spaces[config.space] = given_space
    return open_study(plan_study(config, host, sampler_obj, pruner_obj), storage, study_name,
                      load_if_exists)


def open_study(plan: StudyPlan, storage: str | optuna.storages.BaseStorage | None,
               study_name: str | None, load_if_exists: bool) -> Study:
    """The study of ``plan`` in ``storage``: created, or with ``load_if_exists`` reopened (a
    :class:`ConfigConflictError` when the stored configuration differs)."""
    config, host = plan.config, plan.host
    with _storage_errors(storage):
        ostudy = optuna.create_study(storage=open_storage(storage), sampler=plan.sampler,
                                     pruner=plan.pruner or optuna.pruners.NopPruner(),
                                     study_name=study_name,
                                     directions=cast("list[Direction]", config.directions),
                                     load_if_exists=load_if_exists)
    stored = ostudy.user_attrs.get(CONFIG_ATTR)
    roles = host.option_roles()
    if stored is None:
        ostudy.set_user_attr(CONFIG_ATTR, config.to_json(roles))
    elif (previous := StudyConfig.from_json(stored)).pinned(roles) != config.pinned(roles):
        raise ConfigConflictError(ostudy.study_name, previous.differences(config, roles))
    return Study(ostudy, config, host, plan.space, plan.estimator)


def _directions(directions: str | Sequence[str] | None, direction: Any) -> list[str]:
    """The study's directions from ``directions`` (one or a list) or the ``direction`` alias."""
    if direction is not None and directions is not None:
        raise ConfigError("give either direction= or directions=, not both")
    given = directions if directions is not None else direction or "maximize"
    return [given] if isinstance(given, str) else list(given)


def _names(value: Any) -> list[Any]:
    """A plugin list argument as a list: one name given as a string is a list of one."""
    return [value] if isinstance(value, str) else list(value)


@contextlib.contextmanager
def _storage_errors(storage: Any) -> Iterator[None]:
    """Turn an error of the storage itself (unreachable server, refused login, unreadable
    file) into a one-line ConfigError naming the URL (password masked)."""
    try:
        yield
    except FrugalnasError:
        raise
    except Exception as exc:
        error = storage_error(storage, exc)
        if error is None:
            raise
        raise error from exc


def load_study(*, study_name: str, storage: str | optuna.storages.BaseStorage,
               strategy: optuna.samplers.BaseSampler | None = None,
               pruner: optuna.pruners.BasePruner | None = None,
               plugins: Sequence[Any] = (), disable_plugins: Sequence[str] = (),
               host: PluginHost | None = None,
               stored_plugins: Literal["refuse", "skip"] = "refuse", **overrides: Any) -> Study:
    """Reopen a study from its storage with the configuration it was created with.
    ``overrides`` replace run-time settings such as ``plugin_options`` or ``backend_options``.

    The plugins the stored configuration names are loaded only where the code-loading policy
    allows it (:func:`frugalnas.host.loading.refused_plugins`): built-in ones, those passed in
    ``plugins``, those listed in ``FRUGALNAS_PLUGINS_ALLOW`` and autoloaded entry points, as
    whoever can write the storage could name any module. Any other is refused with a
    :class:`PluginNotAllowedError` naming it (``stored_plugins="refuse"``), or left unloaded
    (``"skip"``, what ``frugalnas report`` and ``export`` do): a component that only such a
    plugin can register is then that error, naming the component and the plugins. With
    ``host``, the given host is used as it is."""
    check_choice("stored_plugins", stored_plugins, ("refuse", "skip"))
    check_storage_url(storage, must_exist=True)
    plugins, disable_plugins = _names(plugins), _names(disable_plugins)
    storage = open_storage(storage)
    try:
        with _storage_errors(storage):
            ostudy = optuna.load_study(study_name=study_name, storage=storage)
    except KeyError:
        with _storage_errors(storage):
            names = [s.study_name for s in optuna.get_all_study_summaries(storage)]
        raise ConfigError(f"no study named {study_name!r} in the storage; studies there: "
                          f"{', '.join(names) or '(none)'}") from None
    stored = ostudy.user_attrs.get(CONFIG_ATTR)
    if stored is None:
        raise ConfigError(f"study {study_name!r} was not created by frugalnas (no stored config)")
    config = StudyConfig.from_json(stored)
    if overrides:
        config = replace(config, **StudyConfig.from_mapping({**asdict(config), **overrides}).__dict__)
    if disable_plugins:
        config.disable_plugins = sorted(set(config.disable_plugins) | set(disable_plugins))
    refused: list[str] = []
    if host is None:
        refused = refused_plugins([p for p in config.plugins
                                   if p not in config.disable_plugins],
                                  allowed=[p for p in plugins if isinstance(p, str)])
        space_refused = dotted_module_refused(config.space,
                                              [p for p in plugins if isinstance(p, str)])
        if space_refused:  # a stored dotted path is imported only where the policy allows it
            raise PluginNotAllowedError(space_refused, f"study {study_name!r}",
                                        needed=f"search space {config.space!r}")
        if refused and stored_plugins == "refuse":
            raise PluginNotAllowedError(refused, f"study {study_name!r}")
        host = get_host([p for p in config.plugins if p not in refused]
                        + [p for p in plugins if p not in config.plugins],
                        config.disable_plugins)
    try:
        estimator_obj = check_config(host, config)
        if strategy is None and config.strategy not in host.registry("strategies"):
            if refused:
                raise UnknownComponentError("strategy", config.strategy,
                                            host.registry("strategies").names())
            raise ConfigError(f"study {study_name!r} was created with the sampler object "
                              f"{config.strategy!r}; pass strategy= to load_study")
        space_obj, strategy = build_components(host, config, strategy, estimator_obj)
        if pruner is None and config.pruner is not None:
            pruner = make_pruner(host, config)
    except UnknownComponentError as exc:
        if not refused:
            raise
        raise PluginNotAllowedError(refused, f"study {study_name!r}",
                                    needed=f"{exc.kind} {exc.name!r}") from None
    ostudy = optuna.load_study(study_name=study_name, storage=storage, sampler=strategy,
                               pruner=pruner or optuna.pruners.NopPruner())
    return Study(ostudy, config, host, space_obj, estimator_obj)
