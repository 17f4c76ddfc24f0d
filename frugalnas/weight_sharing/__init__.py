"""Weight sharing for every space that can express it (built-in plugin ``weight-sharing``).

- :class:`~frugalnas.weight_sharing.supernet.Supernet`: one weight store per space, SPOS
  training, few-shot splits, batch-norm recalibration, checkpoints;
- the ``supernet`` estimator: any strategy scores candidates with inherited weights;
- the ``darts`` strategy: first-order differentiable search on the same store.

A space takes part by implementing ``shared_builder`` (see docs/weight_sharing.md).
"""

from __future__ import annotations

from typing import Any

from frugalnas.core.plugins import hookimpl
from frugalnas.weight_sharing.darts import DartsResult, DartsSampler, darts_search
from frugalnas.weight_sharing.estimator import SupernetEstimator
from frugalnas.weight_sharing.supernet import FewShotSplit, Supernet

__all__ = ["DartsResult", "DartsSampler", "FewShotSplit", "Supernet", "SupernetEstimator",
           "darts_search"]


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"darts": DartsSampler}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"supernet": SupernetEstimator}
