"""SI-EvoNAS (built-in plugin ``sievo``): the ``si-evolution`` strategy (sampled training of the
population on shared weights) and the ``inherited`` estimator (node inheritance)."""

from __future__ import annotations

from typing import Any

from frugalnas.core.architecture import Architecture
from frugalnas.core.estimator import EstimateResult
from frugalnas.core.plugins import hookimpl
from frugalnas.core.space import SearchSpace
from frugalnas.sievo.estimator import InheritedEstimator, weight_store_of
from frugalnas.sievo.sampler import SIEvolutionSampler

__all__ = ["InheritedEstimator", "SIEvolutionSampler", "retrain", "si_evolution",
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
def frugalnas_strategies() -> dict[str, Any]:
    return {"si-evolution": si_evolution}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"inherited": InheritedEstimator}
