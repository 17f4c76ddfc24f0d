"""Built-in plugin: the ``train`` estimator (train from scratch, score the validation metric
of the dataset's task)."""

from __future__ import annotations

import json
import math
import time

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost, count_flops, count_params
from frugalnas.ports.data import Dataset
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.latency import LATENCY_METRICS, LatencyProbe, measure_latency
from frugalnas.engine.training import TrainConfig, seed_everything, split_metric, train
from frugalnas.ports.errors import check_range


class TrainEstimator(Estimator):
    """Trains the candidate from scratch for a budget of epochs; scores the validation metric
    of the dataset's task: accuracy (%) for image classes (``valid_accuracy``), the loss in
    nats per token for a language model (``valid_loss``; minimise it).

    After each full epoch it reports the validation accuracy, the epoch's training loss, the
    parameters, the latency (when measured) and the cost so far to the study
    (``context.report``): optuna's pruners see the objective of a single-objective study,
    the ``pareto`` pruner the objective vector of a multi-objective one.

    ``latency=True`` also measures the network's inference latency on the backend's
    device (before training: it does not depend on the weights) (:func:`frugalnas.ports.latency.measure_latency`, batches of ``latency_batch_size``
    at the dataset's input shape, timed for about ``latency_min_run_time`` seconds) and adds
    the metrics ``latency_ms`` (median) and ``latency_ms_iqr`` (spread).

    ``report_every_steps=k`` reports every ``k`` training steps instead of every epoch (the
    pruner's step is then the number of steps: a language model's epoch may be thousands of
    steps); ``valid_examples=n`` scores the first ``n`` validation examples only (blocks of
    tokens for a language model; default: the whole split).

    ``precision="bf16"`` runs the forward pass under bfloat16 autocast, ``channels_last=True``
    trains in channels-last layout, ``compile=True`` compiles the forward pass with
    ``torch.compile`` (each on a backend that declares it, such as ``single-device``). All
    three are off by default: each changes the losses a little (bf16 the most), and
    ``compile`` pays a compilation per candidate, worth it only for long trainings."""

    name = "train"
    provides: tuple[str, ...] = ("valid_accuracy", "train_loss")
    measures = ("seconds", "flops", "params", "epochs", "peak_memory")

    def __init__(self, epochs: float = 1.0, batch_size: int = 64, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 5e-4, optimizer: str = "sgd",
                 max_steps: int | None = None, report_every_epoch: bool = True,
                 latency: bool = False, latency_batch_size: int = 1,
                 latency_min_run_time: float = 0.2, report_every_steps: int | None = None,
                 valid_examples: int | None = None, precision: str = "fp32",
                 channels_last: bool = False, compile: bool = False):
        self.config = TrainConfig(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                                  weight_decay=weight_decay, optimizer=optimizer, max_steps=max_steps,
                                  precision=precision, channels_last=channels_last,
                                  compile=compile)
        self.report_every_epoch = report_every_epoch
        if report_every_steps is not None:
            check_range("report_every_steps", report_every_steps, 1)
        if valid_examples is not None:
            check_range("valid_examples", valid_examples, 1)
        self.report_every_steps, self.valid_examples = report_every_steps, valid_examples
        self.latency = LatencyProbe.of(latency, latency_batch_size, latency_min_run_time)
        if self.latency:
            self.provides = (*self.provides, *LATENCY_METRICS)

    def prepare_data(self, dataset: Dataset, seed: int) -> Dataset:
        """Hook for subclasses that train on reduced data (low fidelity)."""
        return dataset

    def build(self, arch: Architecture, context: TrialContext, dataset: Dataset):
        return context.space.build(arch, dataset.num_classes, dataset.input_shape)

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        start = time.perf_counter()
        seed_everything(context.seed)
        data = self.prepare_data(context.dataset, context.seed)
        model = self.build(arch, context, data)
        params = count_params(model)
        flops_per_sample = count_flops(model, data.head("train", 1)[0])
        backend = context.backend
        model = backend.prepare(model)
        backend.reset_peak_memory()
        metrics: dict[str, float] = {}
        artifacts: dict[str, str | bytes] = {}
        if self.latency is not None:
            # Inference time does not depend on the weights, so it is measured before
            # training: every per-epoch report (multi-objective pruning) then has it.
            stats = measure_latency(model, data.input_shape, self.latency.batch_size,
                                    backend.device, min_run_time=self.latency.min_run_time,
                                    example=data.head("train", 1)[0])
            metrics.update(stats.metrics())
            artifacts["latency.json"] = json.dumps(stats.to_dict(), indent=1)
        batches_per_epoch = -(-data.num_examples("train") // self.config.batch_size)
        total_steps = max(1, math.ceil(self.config.epochs * batches_per_epoch))
        if self.config.max_steps is not None:
            total_steps = min(total_steps, self.config.max_steps)
        n_valid = data.num_examples("valid")
        n_valid = min(n_valid, self.valid_examples) if self.valid_examples else n_valid
        eval_flops = flops_per_sample * n_valid
        reports = [0]

        def report_at(step: int, steps_done: int, loss: float) -> None:
            """What each objective would be if training stopped now (cost fields so far);
            ``step`` is the pruner's step (an epoch, or a number of training steps)."""
            score = split_metric(model, backend, data, limit=self.valid_examples)
            reports[0] += 1
            samples = steps_done * self.config.batch_size
            context.report(step, {
                "value": score, data.task.metric: score, **data.task.derived_metrics(score),
                "train_loss": loss, **metrics,
                "params": float(params), "epochs": steps_done / batches_per_epoch,
                "flops": 3.0 * flops_per_sample * samples + eval_flops * reports[0],
                "seconds": time.perf_counter() - start}, last=steps_done >= total_steps)

        def on_epoch(epoch: int, loss: float) -> None:
            if self.report_every_epoch and not self.report_every_steps and \
                    context.trial_number is not None:
                report_at(epoch, epoch * batches_per_epoch, loss)

        def on_steps(steps_done: int, loss: float) -> None:
            if context.trial_number is not None:
                report_at(steps_done, steps_done, loss)

        report = train(model, data, backend, self.config, seed=context.seed, on_epoch=on_epoch,
                       every=(self.report_every_steps, on_steps)
                       if self.report_every_steps else None)
        score = split_metric(model, backend, data, limit=self.valid_examples)
        metrics.update({data.task.metric: score, **data.task.derived_metrics(score),
                        "train_loss": sum(report.losses[-10:]) / max(1, len(report.losses[-10:]))})
        samples = report.steps * self.config.batch_size
        flops = 3.0 * flops_per_sample * samples + eval_flops
        cost = Cost(seconds=time.perf_counter() - start, flops=flops, params=params,
                    epochs=report.epochs, peak_memory=backend.peak_memory())
        return EstimateResult(value=score, metrics=metrics, cost=cost, artifacts=artifacts)

