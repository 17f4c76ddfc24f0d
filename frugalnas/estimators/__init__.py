"""Training estimators (built-in plugin ``estimators``): ``train`` trains a candidate from
scratch; ``low-fidelity`` trains it on less data, fewer epochs or smaller inputs."""

from __future__ import annotations

from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory

__getattr__ = lazy_attributes(__name__, {
    "LowFidelityEstimator": "frugalnas.estimators.low_fidelity",
    "TrainEstimator": "frugalnas.estimators.train"})

__all__ = ["LowFidelityEstimator", "TrainEstimator"]


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {
        "train": LazyFactory(
            "frugalnas.estimators.train:TrainEstimator",
            "Trains the candidate from scratch for a budget of epochs; scores the validation "
            "metric of the dataset's task: accuracy (%) for image classes (``valid_accuracy``), "
            "the loss in nats per token for a language model (``valid_loss``; minimise it)."),
        "low-fidelity": LazyFactory(
            "frugalnas.estimators.low_fidelity:LowFidelityEstimator",
            "Short training on reduced data, resolution or width; scores validation "
            "accuracy (%)."),
        "combined": LazyFactory(
            "frugalnas.estimators.combined:CombinedEstimator",
            "Several estimators as one (accuracy from training, latency from a predictor): "
            "the first gives the value, every member's metrics are kept."),
    }
