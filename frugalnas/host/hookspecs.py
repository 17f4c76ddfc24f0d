"""Every hook a frugalnas plugin can implement.

Registration hooks are called once per host, when it builds a registry; each returns a
mapping from component name to a factory (a class or a function whose docstring's first line
describes the component). A factory that declares a ``host`` parameter receives the study's
:class:`~frugalnas.host.plugins.PluginHost`, so it can create the other components it needs
(a surrogate, a proxy, an inner strategy) from the same plugins as the study. Lifecycle hooks
are called in order while a study runs; configuration and command hooks let a plugin own its
options and its commands. Built-in components are registered through these same hooks.
"""

from __future__ import annotations

import argparse
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import pluggy

if TYPE_CHECKING:
    import optuna

    from frugalnas.ports.architecture import Architecture
    from frugalnas.ports.config import StudyConfig
    from frugalnas.ports.exported import ExportedNetwork
    from frugalnas.distribution.launcher import Launcher
    from frugalnas.host.plugins import PluginHost
    from frugalnas.ports.secrets import OptionRoles
    from frugalnas.engine.study import Study
    from frugalnas.ports.trial_report import TrialReport

hookspec = pluggy.HookspecMarker("frugalnas")

Factory = Callable[..., Any]


# -- registration ------------------------------------------------------------------------
@hookspec
def frugalnas_search_spaces() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(**options)`` returns a
    :class:`frugalnas.ports.space.SearchSpace`."""


@hookspec
def frugalnas_proxies() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(**options)`` returns a
    :class:`frugalnas.proxies.Proxy`, which scores an untrained network. The ``proxies``
    plugin makes every proxy an estimator of the same name as well."""


@hookspec
def frugalnas_estimators() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(**options)`` returns a
    :class:`frugalnas.ports.estimator.Estimator`, which scores an architecture."""


@hookspec(firstresult=True)
def frugalnas_space_factory(obj: object, name: str) -> Factory | None:
    """Return a search-space factory made from ``obj``, a Python object a user named as the
    study's space (a define-by-run builder function given to ``create_study(space=...)`` or
    as a dotted path ``package.module:name`` in a run file), registered as ``name``; or None
    when this plugin does not know such objects. The first non-None answer wins; a
    :class:`~frugalnas.ports.space.SearchSpace` subclass needs no plugin."""


@hookspec
def frugalnas_derived_estimators(host: PluginHost) -> dict[str, Factory]:
    """Return estimators made from other components of ``host``, ``{name: factory}`` (the
    ``proxies`` plugin returns one per registered proxy). Consulted for names that are not
    registered estimators; a name registered by ``frugalnas_estimators`` wins."""


@hookspec
def frugalnas_surrogates() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(**options)`` returns a performance predictor with
    ``fit(X, y)`` and ``predict(X) -> (mean, std)`` (:class:`frugalnas.surrogates.Surrogate`)."""


@hookspec
def frugalnas_strategies() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(space=..., seed=..., **options)`` returns an
    ``optuna.samplers.BaseSampler`` (optionally with the methods of
    :mod:`frugalnas.ports.strategy`)."""


@hookspec
def frugalnas_backends() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(**options)`` returns a
    :class:`frugalnas.ports.backend.Backend`, which runs training steps on hardware."""


@hookspec
def frugalnas_datasets() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(seed=..., **options)`` returns a
    :class:`frugalnas.ports.data.Dataset`."""


@hookspec
def frugalnas_pruners() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(**options)`` (with ``directions=`` when it
    declares that parameter) returns an ``optuna.pruners.BasePruner``. A pruner for several
    objectives also has ``prune_vector(study, trial_number, step, values) -> bool``, which the
    study calls with each intermediate objective vector."""


@hookspec
def frugalnas_launchers() -> dict[str, Factory]:
    """Return ``{name: factory}``; ``factory(**options)`` returns a
    :class:`frugalnas.distribution.launcher.Launcher`, which runs a study's trials on many worker
    processes (local processes, a Dask cluster, a batch system) that share its storage."""


# -- configuration and commands ----------------------------------------------------------
@hookspec
def frugalnas_check_config(config: StudyConfig, host: PluginHost) -> None:
    """Called before a study touches its storage (and by ``--dry-run``). Raise
    :class:`~frugalnas.ports.errors.ConfigError` for a setting this plugin cannot work with;
    a plugin reads its own options from ``config.plugin_options[its name]``."""


@hookspec
def frugalnas_option_roles() -> OptionRoles | None:
    """Declare the roles of this plugin's options (``plugin_options[its name]``): return
    ``OptionRoles(secret=[...], run=[...])``. A ``secret`` option (a password, a token) is
    masked in every stored or shown configuration (the study's stored config, MLflow params
    and artifacts, ``--dry-run``, messages): the running process alone sees its value. A
    ``run`` option belongs to one process or machine (an address as this machine reaches
    it): workers of one study may set it differently."""


@hookspec
def frugalnas_run_arguments(parser: argparse.ArgumentParser) -> None:
    """Add command-line flags to ``frugalnas run`` and ``frugalnas worker``."""


@hookspec
def frugalnas_run_settings(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    """Turn the flags added in :func:`frugalnas_run_arguments` into study settings: update
    ``settings`` (``StudyConfig`` fields as a dict, e.g. ``plugin_options`` or
    ``disable_plugins``) in place."""


@hookspec
def frugalnas_launcher(config: StudyConfig, host: PluginHost) -> Launcher | None:
    """Return the launcher (a component of ``host``'s ``launchers`` registry) that runs this
    ``frugalnas run``'s trials on worker processes, as this plugin's own run options ask
    (such as ``--cluster``), or ``None`` (the trials run in the ``run`` process). At most one
    plugin may answer. ``run`` calls the launcher's ``check`` before anything is written."""


@hookspec
def frugalnas_commands(subparsers: argparse._SubParsersAction[argparse.ArgumentParser],
                       host: PluginHost) -> None:
    """Add ``frugalnas`` subcommands: ``parser = subparsers.add_parser(NAME)``, then
    ``parser.set_defaults(func=f)`` where ``f(args) -> int`` is the exit status."""


# -- lifecycle ---------------------------------------------------------------------------
@hookspec
def frugalnas_study_started(study: Study) -> None:
    """Called when ``Study.optimize`` (or the first ``ask``) starts, before any trial."""


@hookspec
def frugalnas_trial_started(study: Study, trial: optuna.Trial, architecture: Architecture) -> None:
    """Called when a trial has its architecture and before it is evaluated."""


@hookspec
def frugalnas_trial_finished(study: Study, report: TrialReport) -> None:
    """Called when a trial ends, with its :class:`~frugalnas.ports.trial_report.TrialReport`
    (frozen): ``number``, ``state`` (optuna's ``TrialState``: ``COMPLETE``, ``PRUNED`` or
    ``FAIL``), ``architecture``, objective ``values``, ``metrics``, ``cost``, ``error``, the
    ``artifacts`` the estimator and backend attached, ``started``/``finished`` and the
    per-step ``intermediate`` objective vectors. The study builds it once per trial; for a
    stale trial of a dead worker it is built from the storage
    (:meth:`TrialReport.from_frozen`, no artifacts)."""


@hookspec
def frugalnas_study_metrics(study: Study, metrics: dict[str, float], step: int) -> None:
    """Called by strategies and estimators to report study-level metrics (a generation's
    fitness, surrogate quality, ...) at ``step``."""


@hookspec
def frugalnas_study_finished(study: Study) -> None:
    """Called when ``Study.optimize`` returns (also after an interrupt or error)."""


@hookspec
def frugalnas_model_exported(study: Study, exported: ExportedNetwork) -> dict[str, Any] | None:
    """Called by ``frugalnas export`` (``export_study``) for each network it trained and wrote
    (:class:`~frugalnas.ports.exported.ExportedNetwork`), before its ``report.json`` is
    final: log it, register it under ``exported.register``. Return a JSON-able record of
    what was done (the MLflow plugin: the model URI, its run, the registered version) or
    ``None``; ``report.json`` keeps it under the plugin's name. The exporter logs models
    (by default) only when some plugin implements this hook."""


@hookspec
def frugalnas_trial_links(study: Study, base_url: str) -> dict[int, str] | None:
    """Return ``{trial number: URL}`` of each trial's record in this plugin's user interface
    at ``base_url`` (the MLflow plugin: each trial's run in the MLflow UI), or ``None``;
    ``frugalnas report --html FILE --mlflow-url URL`` links the leaderboard's rows to them."""


@hookspec
def frugalnas_results_location(study: Study) -> str | None:
    """Return one line saying where this plugin keeps the study's results and how to look at
    them (the MLflow plugin: the tracking URI and ``frugalnas ui``), or ``None``. ``frugalnas
    run`` and ``frugalnas worker`` print every line when they finish."""

