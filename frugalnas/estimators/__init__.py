"""Training estimators (built-in plugin ``estimators``): ``train`` trains a candidate from
scratch; ``low-fidelity`` trains it on less data, fewer epochs or smaller inputs."""

from __future__ import annotations

from typing import Any

from frugalnas.core.plugins import hookimpl
from frugalnas.estimators.low_fidelity import LowFidelityEstimator
from frugalnas.estimators.train import TrainEstimator

__all__ = ["LowFidelityEstimator", "TrainEstimator"]


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"train": TrainEstimator, "low-fidelity": LowFidelityEstimator}
