"""Built-in plugin: the ``train`` estimator (train from scratch, score validation accuracy)."""

from __future__ import annotations

import json
import time
from typing import Any

from frugalnas.core.architecture import Architecture
from frugalnas.core.cost import Cost, count_flops, count_params
from frugalnas.core.data import Dataset
from frugalnas.core.estimator import EstimateResult, EvaluationContext, Estimator
from frugalnas.core.latency import LATENCY_METRICS, check_latency_options, measure_latency
from frugalnas.core.training import TrainConfig, accuracy, seed_everything, train


class TrainEstimator(Estimator):
    """Trains the candidate from scratch for a budget of epochs; scores validation accuracy (%).

    ``latency=True`` also measures the trained network's inference latency on the backend's
    device (:func:`frugalnas.core.latency.measure_latency`, batches of ``latency_batch_size``
    at the dataset's input shape, timed for about ``latency_min_run_time`` seconds) and adds
    the metrics ``latency_ms`` (median) and ``latency_ms_iqr`` (spread)."""

    name = "train"
    provides: tuple[str, ...] = ("valid_accuracy", "train_loss")
    measures = ("seconds", "flops", "params", "epochs", "peak_memory")

    def __init__(self, epochs: float = 1.0, batch_size: int = 64, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 5e-4, optimizer: str = "sgd",
                 max_steps: int | None = None, report_every_epoch: bool = True,
                 latency: bool = False, latency_batch_size: int = 1,
                 latency_min_run_time: float = 0.2):
        self.config = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                                  weight_decay=weight_decay, optimizer=optimizer, max_steps=max_steps)
        self.report_every_epoch = report_every_epoch
        check_latency_options(latency, latency_batch_size, latency_min_run_time)
        self.latency, self.latency_batch_size = bool(latency), int(latency_batch_size)
        self.latency_min_run_time = float(latency_min_run_time)
        if self.latency:
            self.provides = (*self.provides, *LATENCY_METRICS)

    def prepare_data(self, dataset: Dataset, seed: int) -> Dataset:
        """Hook for subclasses that train on reduced data (low fidelity)."""
        return dataset

    def build(self, arch: Architecture, context: EvaluationContext, dataset: Dataset):
        return context.space.build(arch, dataset.num_classes, dataset.input_shape)

    def evaluate(self, arch: Architecture, context: EvaluationContext) -> EstimateResult:
        start = time.perf_counter()
        seed_everything(context.seed)
        data = self.prepare_data(context.dataset, context.seed)
        model = self.build(arch, context, data)
        params = count_params(model)
        flops_per_sample = count_flops(model, data.train_x[:1])
        backend = context.backend
        model = backend.prepare(model)
        backend.reset_peak_memory()

        def on_epoch(epoch: int, loss: float) -> None:
            if self.report_every_epoch and context.trial is not None:
                context.report(accuracy(model, backend, data.valid_x, data.valid_y), epoch)

        report = train(model, data, backend, self.config, seed=context.seed, on_epoch=on_epoch)
        acc = accuracy(model, backend, data.valid_x, data.valid_y)
        metrics = {"valid_accuracy": acc,
                   "train_loss": sum(report.losses[-10:]) / max(1, len(report.losses[-10:]))}
        artifacts: dict[str, str | bytes] = {}
        if self.latency:
            stats = measure_latency(model, data.input_shape, self.latency_batch_size,
                                    backend.device, min_run_time=self.latency_min_run_time)
            metrics.update(stats.metrics())
            artifacts["latency.json"] = json.dumps(stats.to_dict(), indent=1)
        samples = report.steps * self.config.batch_size
        flops = 3.0 * flops_per_sample * samples + flops_per_sample * len(data.valid_x)
        cost = Cost(seconds=time.perf_counter() - start, flops=flops, params=params,
                    epochs=report.epochs, peak_memory=backend.peak_memory())
        return EstimateResult(value=acc, metrics=metrics, cost=cost, artifacts=artifacts)

