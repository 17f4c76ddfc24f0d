"""Built-in plugin: the ``dag`` search space, the ``si-evolution`` strategy and the
``inherited`` estimator (SI-EvoNAS: sampled training and node inheritance)."""

from __future__ import annotations

from typing import Any

from ..core.architecture import Architecture
from ..core.estimator import EstimateResult
from ..core.plugins import hookimpl
from ..core.space import SearchSpace
from ..search_spaces.dag import DagSpace
from .sievo_estimator import InheritedEstimator, weight_store_of
from .sievo_sampler import SIEvolutionSampler

__all__ = ["DagSpace", "InheritedEstimator", "SIEvolutionSampler", "retrain", "si_evolution",
           "weight_store_of"]


def si_evolution(space: SearchSpace | None = None, seed: int = 0,
                 **options: Any) -> SIEvolutionSampler:
    """Evolution with sampled training of the population on shared weights and node
    inheritance for offspring (SI-EvoNAS); use with the 'inherited' estimator."""
    return SIEvolutionSampler(space=space, seed=seed, **options)


def retrain(study: Any, arch: Architecture | str | None = None, epochs: float = 10.0,
            **train_options: Any) -> EstimateResult:
    """Train ``arch`` (default: the study's best) from scratch with the ``train`` estimator on
    the study's dataset and backend; returns its result (``value``: validation accuracy)."""
    if arch is None:
        arch = study.best_architecture
    elif isinstance(arch, str):
        arch = study.space.parse(arch)
    estimator = study.host.create("estimators", "train", epochs=epochs, **train_options)
    return estimator.evaluate(arch, study.context())


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"dag": DagSpace}


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"si-evolution": si_evolution}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"inherited": InheritedEstimator}
