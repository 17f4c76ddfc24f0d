"""Latency as an estimator: measured on this machine, or predicted from a layer table."""

from __future__ import annotations

import os
from collections.abc import Mapping
from pathlib import Path

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost, count_params
from frugalnas.ports.errors import ConfigError, check_choice, check_range
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.space import SearchSpace
from frugalnas.latency.cache import LatencyCache
from frugalnas.latency.measure import LatencySetup
from frugalnas.latency.predictor import (KernelTablePredictor, LatencyMeter,
                                         LayerTablePredictor)

METRICS = ("latency_ms", "latency_ms_iqr", "latency_ms_min")


def default_cache() -> Path:
    """``$FRUGALNAS_CACHE_DIR/latency.sqlite`` (default ``~/.cache/frugalnas``)."""
    base = os.environ.get("FRUGALNAS_CACHE_DIR") or Path.home() / ".cache" / "frugalnas"
    return Path(base) / "latency.sqlite"


def _shape(input_shape: list[int] | tuple[int, ...]) -> tuple[int, int, int]:
    if (not isinstance(input_shape, (list, tuple)) or len(input_shape) != 3
            or not all(isinstance(s, int) and s > 0 for s in input_shape)):
        raise ConfigError(f"invalid input_shape {input_shape!r}; expected [channels, height, "
                          "width] of positive integers, e.g. [1, 28, 28]")
    return (int(input_shape[0]), int(input_shape[1]), int(input_shape[2]))


def _meter(setup: LatencySetup, cache: str | None) -> LatencyMeter:
    """A meter through the cache file ``cache`` (``None``: :func:`default_cache`; ``""``:
    no cache)."""
    path = default_cache() if cache is None else (Path(cache) if cache else None)
    return LatencyMeter(setup, LatencyCache(path) if path else None)


class MeasuredLatency(Estimator):
    """Inference latency of the architecture's network measured on this machine (ONNX
    Runtime or torch), cached on disk per architecture, setup and machine.

    Batch size, threads, warm-up calls, repetitions and rounds are options.

    ``value`` and ``latency_ms`` are the median per-call milliseconds (with ``rounds`` above
    1, the fastest round's); ``latency_ms_iqr`` the spread, ``latency_ms_min`` the fastest
    call. ``cache=""`` measures every time."""

    name = "measured-latency"
    needs_dataset = False
    provides = METRICS
    measures = ("seconds", "params")

    def __init__(self, input_shape: list[int] = (3, 32, 32), num_classes: int = 10,  # type: ignore[assignment]
                 runtime: str = "onnxruntime", batch_size: int = 1, threads: int = 1,
                 warmup: int = 10, repeats: int = 50, cache: str | None = None,
                 rounds: int = 1):
        self.input_shape = _shape(input_shape)
        check_range("num_classes", num_classes, 1)
        self.num_classes = int(num_classes)
        self.setup = LatencySetup(runtime, batch_size, threads, warmup, repeats, rounds)
        self.meter = _meter(self.setup, cache)

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        import time

        start = time.perf_counter()
        result, hit = self.meter.network(context.space, arch, self.num_classes,
                                         self.input_shape)
        params = count_params(context.space.build(arch, self.num_classes, self.input_shape))
        return EstimateResult(result.median_ms, {**result.metrics(), "latency_cached": float(hit)},
                              Cost(seconds=time.perf_counter() - start, params=params))


TABLES = ("kernels", "layers")


class PredictedLatency(Estimator):
    """Inference latency predicted from a calibrated lookup table of fused kernels
    (``table="kernels"``, nn-Meter style) or of single layers (``table="layers"``,
    ProxylessNAS style); free once the table holds the network's kernels.

    The table is calibrated on ``calibration`` networks measured whole, in ``rounds``
    interleaved rounds with the table; a constrained study screens candidates with the
    prediction before evaluating them. Measurements go through the same on-disk cache as
    ``measured-latency``."""

    name = "latency-predictor"
    needs_dataset = False
    provides = ("latency_ms",)
    measures = ("seconds",)

    def __init__(self, input_shape: list[int] = (3, 32, 32), num_classes: int = 10,  # type: ignore[assignment]
                 runtime: str = "onnxruntime", batch_size: int = 1, threads: int = 1,
                 warmup: int = 10, repeats: int = 50, calibration: int = 20,
                 cache: str | None = None, seed: int = 0, table: str = "kernels",
                 rounds: int = 5):
        self.input_shape = _shape(input_shape)
        check_range("num_classes", num_classes, 1)
        check_range("calibration", calibration, 2)
        check_choice("table", table, TABLES)
        self.num_classes, self.calibration, self.seed = int(num_classes), int(calibration), seed
        self.table = table
        self.setup = LatencySetup(runtime, batch_size, threads, warmup, repeats, rounds)
        self.meter = _meter(self.setup, cache)
        self._predictors: dict[int, KernelTablePredictor | LayerTablePredictor] = {}

    def predictor(self, space: SearchSpace) -> KernelTablePredictor | LayerTablePredictor:
        found = self._predictors.get(id(space))
        if found is None:
            kind = KernelTablePredictor if self.table == "kernels" else LayerTablePredictor
            found = kind(space, self.meter, self.num_classes, self.input_shape,
                         self.calibration, self.seed)
            self._predictors[id(space)] = found
        return found

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        import time

        start = time.perf_counter()
        value = self.predictor(context.space).predict(arch)
        return EstimateResult(value, {"latency_ms": value},
                              Cost(seconds=time.perf_counter() - start))

    def known_metrics(self, arch: Architecture, space: SearchSpace) -> Mapping[str, float]:
        return {"latency_ms": self.predictor(space).predict(arch)}
