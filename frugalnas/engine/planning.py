"""Planning a study before anything is written: every check that can run before the first
trial (component names and options, the dataset's own checks, objectives against the
estimator's metrics, each plugin's settings) and the components built once
(:class:`StudyPlan`), which :func:`~frugalnas.engine.study.open_study` turns into a study."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import optuna

from frugalnas.ports.config import StudyConfig
from frugalnas.ports.errors import ConfigError, FrugalnasError, PluginError, nearest_hint, one_line
from frugalnas.ports.estimator import Estimator
from frugalnas.host.kinds import GROUPS, PRUNERS, STRATEGIES
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.space import SearchSpace

def make_strategy(host: PluginHost, space: SearchSpace,
                  config: StudyConfig) -> optuna.samplers.BaseSampler:
    """The study's strategy, created by name with the study's space, seed and host (and the
    study's ``constraints`` for a factory that declares that parameter)."""
    extra: dict[str, Any] = {}
    if config.constraints and "constraints" in host.registry("strategies").get(
            config.strategy).options():
        extra["constraints"] = dict(config.constraints)
    return host.create(STRATEGIES, config.strategy, space=space, seed=config.seed, **extra,
                       **config.strategy_options)


def make_pruner(host: PluginHost, config: StudyConfig) -> optuna.pruners.BasePruner:
    """The study's pruner, created by name (``config.pruner``) with its options (and the
    study's ``directions`` for a factory that declares that parameter)."""
    if config.pruner is None:
        raise ConfigError("no pruner to make: the study's config has pruner=None")
    extra: dict[str, Any] = {}
    if "directions" in host.registry("pruners").get(config.pruner).options():
        extra["directions"] = list(config.directions)
    return host.create(PRUNERS, config.pruner, **extra, **config.pruner_options)


def check_pruner(pruner: Any, n_objectives: int, name: str) -> None:
    """A study with several objectives needs a pruner that decides on objective vectors
    (``prune_vector``); optuna's own pruners take one intermediate value."""
    if isinstance(pruner, optuna.pruners.NopPruner) or n_objectives == 1:
        return
    if not callable(getattr(pruner, "prune_vector", None)):
        raise ConfigError(f"pruner {name!r} prunes on one objective; this study has "
                          f"{n_objectives}: use a multi-objective pruner such as 'pareto'")


def check_config(host: PluginHost, config: StudyConfig,
                 estimator: Estimator | None = None) -> Estimator:
    """Everything that can be checked before the first trial: every component name and option
    (unknown and missing required ones), the dataset's own checks (its factory's optional
    ``check_options(**dataset_options)``: paths and files), the objectives against the metrics
    the estimator declares, and each plugin's own settings (``frugalnas_check_config``).
    Returns the estimator it created. Every failure is a :class:`ConfigError` or
    :class:`PluginError` with a one-line message."""
    _check_component(host.registry("search_spaces").get(config.space), "search_spaces",
                     config.space_options)
    if config.strategy in host.registry("strategies"):
        _check_component(host.registry("strategies").get(config.strategy), "strategies",
                         config.strategy_options, supplied=("space", "seed"))
    _check_component(host.registry("backends").get(config.backend), "backends",
                     config.backend_options)
    if config.dataset is not None:
        dataset = host.registry("datasets").get(config.dataset)
        _check_component(dataset, "datasets", config.dataset_options, supplied=("seed",))
        check = getattr(dataset.factory, "check_options", None)
        if callable(check):
            _guarded(dataset, "checking its options", check, **config.dataset_options)
    if estimator is None:
        comp = host.estimators().get(config.estimator)
        _check_component(comp, "estimators", config.estimator_options)
        estimator = _guarded(comp, "creating it", host.create_estimator, config.estimator,
                             config.estimator_options)
    declared = list(estimator.objective_names())
    for name in config.objectives:
        if name not in declared:
            raise ConfigError(f"objective {name!r} is not a metric of estimator "
                              f"{config.estimator!r}; it produces: {', '.join(declared)}"
                              f"{nearest_hint(name, declared)}")
    for name in config.constraints:
        if name not in declared:
            raise ConfigError(f"constraint {name!r} is not a metric of estimator "
                              f"{config.estimator!r}; valid constraint names: "
                              f"{', '.join(declared)}{nearest_hint(name, declared)}")
    if config.pruner is not None:
        comp = host.registry("pruners").get(config.pruner)
        _check_component(comp, "pruners", config.pruner_options, supplied=("directions",))
        check_pruner(_guarded(comp, "creating it", make_pruner, host, config),
                     len(config.directions), config.pruner)
    if config.dataset is None and estimator.needs_dataset:
        raise ConfigError(f"estimator {config.estimator!r} needs a dataset; set dataset= "
                          f"(registered: {', '.join(host.registry('datasets').names())})")

    def failed(plugin: str, exc: BaseException) -> None:
        if isinstance(exc, FrugalnasError):
            raise exc
        raise PluginError(f"plugin {plugin!r} failed in frugalnas_check_config: "
                          f"{one_line(exc)}") from exc

    host.call_each("frugalnas_check_config", {"config": config, "host": host}, failed)
    return estimator


def _check_component(comp: Any, kind: str, options: dict[str, Any],
                     supplied: Sequence[str] = ()) -> None:
    """Unknown options and missing required ones of one component, before it is created."""
    comp.check_options(options)
    missing = [name for name, default in comp.options().items()
               if default is inspect.Parameter.empty and name not in options
               and name not in supplied]
    if missing:
        group = GROUPS[kind]
        raise ConfigError(
            f"{comp.kind} {comp.name!r} needs the option {missing[0]!r} (-o "
            f"{group}.{missing[0]}=VALUE, or {group}_options={{{missing[0]!r}: ...}}); its "
            f"options: {', '.join(n for n in comp.options() if n not in supplied)}")


def _guarded(comp: Any, doing: str, func: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    """``func(*args, **kwargs)``; an exception other than frugalnas's own becomes a one-line
    ConfigError naming the component and the plugin it comes from."""
    try:
        return func(*args, **kwargs)
    except FrugalnasError:
        raise
    except Exception as exc:
        raise ConfigError(f"{comp.kind} {comp.name!r} (plugin {comp.plugin!r}) failed when "
                          f"{doing}: {one_line(exc)}") from exc


def build_components(host: PluginHost, config: StudyConfig,
                     sampler: optuna.samplers.BaseSampler | None = None,
                     estimator: Estimator | None = None,
                     ) -> tuple[SearchSpace, optuna.samplers.BaseSampler]:
    """The study's space and strategy, created with the checked options, and the space
    checked against ``estimator`` (:meth:`Estimator.check_space`); an exception from a
    factory becomes a one-line ConfigError naming the component."""
    space = _guarded(host.registry("search_spaces").get(config.space), "creating it",
                     host.create, "search_spaces", config.space, **config.space_options)
    if estimator is not None:
        _guarded(host.estimators().get(config.estimator), "checking the search space",
                 estimator.check_space, space)
    if sampler is None:
        sampler = _guarded(host.registry("strategies").get(config.strategy), "creating it",
                           make_strategy, host, space, config)
    return space, sampler


@dataclass(frozen=True)
class StudyPlan:
    """A study's configuration checked and its components built, before anything is written
    anywhere: what :func:`open_study` turns into a study (``create_study`` and ``frugalnas
    run`` both make it once)."""

    config: StudyConfig
    host: PluginHost
    estimator: Estimator
    space: SearchSpace
    sampler: optuna.samplers.BaseSampler
    pruner: optuna.pruners.BasePruner | None


def plan_study(config: StudyConfig, host: PluginHost,
               sampler: optuna.samplers.BaseSampler | None = None,
               pruner: optuna.pruners.BasePruner | None = None) -> StudyPlan:
    """Check ``config`` (:func:`check_config`) and build its components (a given ``sampler``
    or ``pruner`` object in place of the configured one)."""
    estimator = check_config(host, config)
    space, sampler = build_components(host, config, sampler, estimator)
    if pruner is not None:
        check_pruner(pruner, len(config.directions), type(pruner).__name__)
    elif config.pruner is not None:
        pruner = make_pruner(host, config)
    return StudyPlan(config, host, estimator, space, sampler, pruner)
