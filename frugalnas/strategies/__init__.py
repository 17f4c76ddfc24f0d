"""Search strategies (built-in plugin ``strategies``): regularized evolution, local search,
surrogate-assisted evolution and BANANAS, each an optuna sampler that rebuilds its state from the study's storage."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import optuna

from frugalnas.core.errors import ConfigError
from frugalnas.core.plugins import hookimpl
from frugalnas.core.space import SearchSpace
from frugalnas.strategies.base import ArchSampler
from frugalnas.strategies.local_search import LocalSearchSampler
from frugalnas.strategies.regularized import RegularizedEvolutionSampler
from frugalnas.strategies.surrogate_search import BananasSampler, SurrogateEvolutionSampler


def _options(cls: type) -> list[str]:
    names: list[str] = []
    for klass in cls.__mro__:
        if "__init__" in vars(klass) and issubclass(klass, ArchSampler):
            for p in inspect.signature(klass.__init__).parameters.values():
                if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and \
                        p.name not in ("self", "space", "seed") and p.name not in names:
                    names.append(p.name)
    return names


def strategy_factory(cls: type[ArchSampler]) -> Callable[..., optuna.samplers.BaseSampler]:
    """A ``factory(space=..., seed=..., **options)`` for ``cls`` that rejects unknown options
    with a :class:`ConfigError` listing the valid ones."""
    valid = _options(cls)

    def factory(space: SearchSpace | None = None, seed: int = 0, **options: Any) -> ArchSampler:
        for key in options:
            if key not in valid:
                raise ConfigError(f"unknown option {key!r} for strategy {cls.__name__}; "
                                  f"valid options: {', '.join(sorted(valid))}")
        return cls(space, seed, **options)

    factory.__doc__ = cls.__doc__
    factory.__name__ = factory.__qualname__ = f"{cls.__name__}_factory"
    factory.valid_options = valid  # type: ignore[attr-defined]
    return factory


STRATEGIES: dict[str, type[ArchSampler]] = {
    "regularized-evolution": RegularizedEvolutionSampler,
    "local-search": LocalSearchSampler,
    "surrogate-evolution": SurrogateEvolutionSampler,
    "bananas": BananasSampler,
}


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {name: strategy_factory(cls) for name, cls in STRATEGIES.items()}


def _unwrap(sampler: Any, depth: int = 4) -> Any:
    # Wrappers (e.g. a proxy pre-screen) keep the strategy under .sampler or .base_sampler.
    for _ in range(depth):
        if isinstance(sampler, ArchSampler):
            return sampler
        sampler = getattr(sampler, "sampler", None) or getattr(sampler, "base_sampler", None)
    return sampler if isinstance(sampler, ArchSampler) else None


@hookimpl
def frugalnas_study_started(study: Any) -> None:
    """Route a strategy's study-level metrics (surrogate quality) to ``study.log_metrics``."""
    sampler = _unwrap(study.optuna_study.sampler)
    if sampler is not None and sampler.report is None:
        sampler.report = study.log_metrics
