"""Weight sharing for every space that can express it (built-in plugin ``weight-sharing``).

- :class:`~frugalnas.weight_sharing.supernet.Supernet`: one weight store per space, SPOS
  training, few-shot splits, batch-norm recalibration, checkpoints;
- the ``supernet`` estimator: any strategy scores candidates with inherited weights;
- the ``darts`` strategy: first-order differentiable search on the same store.

A space takes part by declaring a ``WeightSharing`` capability (see docs/weight_sharing.md).
"""

from __future__ import annotations

from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory

__getattr__ = lazy_attributes(__name__, {
    **{name: "frugalnas.weight_sharing.darts" for name in (
        "DartsResult", "DartsSampler", "darts_search")},
    "SupernetEstimator": "frugalnas.weight_sharing.estimator",
    "FewShotSplit": "frugalnas.weight_sharing.supernet",
    "Supernet": "frugalnas.weight_sharing.supernet"})

__all__ = ["DartsResult", "DartsSampler", "FewShotSplit", "Supernet", "SupernetEstimator",
           "darts_search"]


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"darts": LazyFactory(
        "frugalnas.weight_sharing.darts:DartsSampler",
        "Strategy ``darts``: proposes the architecture first-order DARTS reads off its mixing "
        "weights, then draws from softmax(alpha) it has not proposed. The search runs once, on "
        "the study's dataset and backend, when the first candidate is asked for; "
        "``checkpoint`` keeps its result (the mixing weights) so a resumed study does not "
        "search again.")}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"supernet": LazyFactory(
        "frugalnas.weight_sharing.estimator:SupernetEstimator",
        "Validation accuracy (%) of the candidate with weights inherited from a supernet "
        "trained by uniform single-path sampling (SPOS), batch-norm statistics recalibrated "
        "per candidate.")}
