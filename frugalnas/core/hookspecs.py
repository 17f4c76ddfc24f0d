"""Every hook a frugalnas plugin can implement.

Registration hooks are called once, when the plugin host builds its registries; each returns
a mapping from component name to a factory (a class or a function whose docstring's first
line describes the component). Lifecycle hooks are called in order while a study runs.
Built-in components are registered through these same hooks.
"""

from __future__ import annotations

from typing import Any

import pluggy

hookspec = pluggy.HookspecMarker("frugalnas")


@hookspec
def frugalnas_search_spaces() -> dict[str, Any]:
    """Called once at start-up. Return ``{name: factory}``; a factory takes keyword options
    and returns a :class:`frugalnas.core.space.SearchSpace`."""


@hookspec
def frugalnas_proxies() -> dict[str, Any]:
    """Called once at start-up. Return ``{name: factory}``; a factory returns a
    :class:`frugalnas.proxies.base.Proxy`, which scores an untrained network. Every proxy is
    also usable as an estimator of the same name."""


@hookspec
def frugalnas_estimators() -> dict[str, Any]:
    """Called once at start-up. Return ``{name: factory}``; a factory returns a
    :class:`frugalnas.core.estimator.Estimator`, which scores an architecture."""


@hookspec
def frugalnas_surrogates() -> dict[str, Any]:
    """Called once at start-up. Return ``{name: factory}``; a factory returns a performance
    predictor with ``fit(X, y)`` and ``predict(X) -> (mean, std)``."""


@hookspec
def frugalnas_strategies() -> dict[str, Any]:
    """Called once at start-up. Return ``{name: factory}``; a factory is called as
    ``factory(space=..., seed=..., **options)`` and returns an ``optuna.samplers.BaseSampler``."""


@hookspec
def frugalnas_backends() -> dict[str, Any]:
    """Called once at start-up. Return ``{name: factory}``; a factory returns a
    :class:`frugalnas.core.backend.Backend`, which runs training steps on hardware."""


@hookspec
def frugalnas_datasets() -> dict[str, Any]:
    """Called once at start-up. Return ``{name: factory}``; a factory is called as
    ``factory(seed=..., **options)`` and returns a :class:`frugalnas.core.data.Dataset`."""


@hookspec
def frugalnas_study_started(study: Any) -> None:
    """Called when ``Study.optimize`` (or the first ``ask``) starts, before any trial."""


@hookspec
def frugalnas_trial_started(study: Any, trial: Any, architecture: Any) -> None:
    """Called when a trial has its architecture and before it is evaluated."""


@hookspec
def frugalnas_trial_finished(study: Any, trial: Any, architecture: Any, state: str,
                             values: list[float] | None, result: Any, error: str | None) -> None:
    """Called when a trial ends, with its state (``COMPLETE``, ``PRUNED`` or ``FAIL``), its
    objective values, the :class:`EstimateResult` (``None`` if evaluation failed) and the
    error message of a failed trial."""


@hookspec
def frugalnas_study_metrics(study: Any, metrics: dict[str, float], step: int) -> None:
    """Called by strategies and estimators to report study-level metrics (a generation's
    fitness, surrogate quality, ...) at ``step``."""


@hookspec
def frugalnas_study_finished(study: Any) -> None:
    """Called when ``Study.optimize`` returns (also after an interrupt or error)."""
