"""Built-in plugin: the NAS-Bench-201 space and its tabular estimator."""

from __future__ import annotations

import time
from functools import lru_cache
from importlib import resources
from typing import Any

import numpy as np

from frugalnas.core.architecture import Architecture
from frugalnas.core.cost import Cost
from frugalnas.core.errors import check_choice
from frugalnas.core.estimator import EstimateResult, EvaluationContext, Estimator
from frugalnas.spaces.nb201.space import NB201Space

TABLE_DATASETS = ("cifar10", "cifar100", "imagenet16-120")


@lru_cache(maxsize=1)
def nb201_table() -> np.ndarray:
    """Test accuracy (%) after 200 epochs, shape (15625, 3): CIFAR-10, CIFAR-100,
    ImageNet16-120, indexed by :meth:`NB201Space.index`. Source: NAS-Bench-201 / NATS-Bench."""
    with resources.files("frugalnas.data").joinpath("nb201_accuracy.npz").open("rb") as fh:
        return np.load(fh)["test_accuracy"]


class NB201TableEstimator(Estimator):
    """Looks an NB201 cell up in the benchmark table (test accuracy after 200 epochs)."""

    name = "nb201-table"
    needs_dataset = False
    provides = tuple(f"test_accuracy_{name}" for name in TABLE_DATASETS)
    measures = ("seconds", "epochs")

    def __init__(self, dataset: str = "cifar10", simulated_epochs: float = 200.0):
        check_choice("nb201-table dataset", dataset, TABLE_DATASETS)
        self.dataset = dataset
        self.simulated_epochs = simulated_epochs

    def evaluate(self, arch: Architecture, context: EvaluationContext) -> EstimateResult:
        start = time.perf_counter()
        space = context.space
        if not isinstance(space, NB201Space):
            space = NB201Space()
        row = nb201_table()[space.index(arch)]
        col = TABLE_DATASETS.index(self.dataset)
        metrics = {f"test_accuracy_{name}": float(row[i]) for i, name in enumerate(TABLE_DATASETS)}
        return EstimateResult(value=float(row[col]), metrics=metrics,
                              cost=Cost(seconds=time.perf_counter() - start,
                                        epochs=self.simulated_epochs))
