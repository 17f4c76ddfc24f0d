"""SI-EvoNAS (built-in plugin ``sievo``): the ``si-evolution`` strategy (sampled training of the
population on shared weights) and the ``inherited`` estimator (node inheritance), both on a
:class:`~frugalnas.weight_sharing.supernet.Supernet`; ``inherited`` also serves any other
strategy on any space with weight sharing (see docs/weight_sharing.md)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory

if TYPE_CHECKING:
    from frugalnas.ports.architecture import Architecture
    from frugalnas.ports.estimator import EstimateResult

#: The name of the ``inherited`` estimator (``frugalnas.sievo.estimator.InheritedEstimator``).
INHERITED = "inherited"

# Registering imports none of the modules below (nor torch); the names are imported when
# first used.
__getattr__ = lazy_attributes(__name__, {
    **{name: "frugalnas.sievo.estimator" for name in (
        "InheritedEstimator", "shared_plans", "supernet_of", "weight_store_of")},
    "FinalChoice": "frugalnas.sievo.final",
    "final_choice": "frugalnas.sievo.final",
    **{name: "frugalnas.sievo.plan" for name in (
        "GenerationPlan", "GenerationPlans", "SampledTraining")},
    "SIEvolutionSampler": "frugalnas.sievo.sampler",
    "si_evolution": "frugalnas.sievo.sampler"})

__all__ = ["FinalChoice", "GenerationPlan", "GenerationPlans", "InheritedEstimator",
           "SIEvolutionSampler", "SampledTraining", "final_choice", "retrain", "shared_plans",
           "si_evolution", "supernet_of", "weight_store_of"]


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
    return {"si-evolution": LazyFactory(
        "frugalnas.sievo.sampler:si_evolution",
        "Evolution with sampled training of the population on shared weights and node "
        "inheritance for offspring (SI-EvoNAS); use with the 'inherited' estimator.")}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {INHERITED: LazyFactory(
        "frugalnas.sievo.estimator:InheritedEstimator",
        "Scores a candidate on validation data with weights inherited from the study's shared "
        "store (a :class:`~frugalnas.weight_sharing.supernet.Supernet` with one module per "
        "operation and position), on any space with weight sharing (``dag``, NB201).")}


@hookimpl
def frugalnas_check_config(config: Any, host: Any) -> None:
    """Before the first trial: the ``inherited`` estimator's space supports weight sharing."""
    if config.estimator != INHERITED:
        return
    from frugalnas.sievo.session import check_weight_sharing

    try:
        space = host.create("search_spaces", config.space, **config.space_options)
    except Exception:  # the study reports a space it cannot create itself
        return
    check_weight_sharing(space)
