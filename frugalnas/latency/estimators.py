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
from frugalnas.latency.measure import LatencySetup, peak_memory
from frugalnas.latency.predictor import (KernelTablePredictor, LatencyMeter,
                                         LayerTablePredictor)

METRICS = ("latency_ms", "latency_ms_iqr", "latency_ms_min")
MEMORY_METRICS = ("peak_memory_mb", "weight_memory_mb", "activation_memory_mb")
#: A language model's latency per generated token with a key/value cache (``decode``).
DECODE_METRICS = ("decode_ms", "decode_ms_iqr")
IMAGE_SHAPE = (3, 32, 32)
#: The vocabulary a token model gets without ``num_classes``: the ``text`` dataset's bytes.
BYTE_VOCABULARY = 256
#: Why the layer table refuses language models, and what to use instead.
TOKENS_REFUSED = ("the layer table knows convolutional layers only; use table='kernels' (its "
                  "attention, MLP, norm and embedding kernels) for language models")


def default_cache() -> Path:
    """``$FRUGALNAS_CACHE_DIR/latency.sqlite`` (default ``~/.cache/frugalnas``)."""
    base = os.environ.get("FRUGALNAS_CACHE_DIR") or Path.home() / ".cache" / "frugalnas"
    return Path(base) / "latency.sqlite"


def _positive(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value > 0


def _input(input_shape: list[int] | tuple[int, ...] | None,
           sequence_length: int | None = None) -> tuple[tuple[int, ...], bool]:
    """The input shape without the batch axis and whether the inputs are tokens: ``[C, H,
    W]`` images (default ``[3, 32, 32]``), or ``[T]`` tokens, also given as
    ``sequence_length=T``."""
    if sequence_length is not None:
        if not _positive(sequence_length):
            raise ConfigError(f"invalid sequence_length {sequence_length!r}; expected a "
                              "positive integer (the tokens of one prefill)")
        if input_shape is not None and list(input_shape) != [sequence_length]:
            raise ConfigError(f"input_shape {list(input_shape)!r} and sequence_length "
                              f"{sequence_length} disagree; give only sequence_length for a "
                              "language model")
        return (int(sequence_length),), True
    if input_shape is None:
        return IMAGE_SHAPE, False
    if (not isinstance(input_shape, (list, tuple)) or len(input_shape) not in (1, 3)
            or not all(_positive(s) for s in input_shape)):
        raise ConfigError(f"invalid input_shape {input_shape!r}; expected [channels, height, "
                          "width] of positive integers, e.g. [1, 28, 28], or [tokens] for a "
                          "language model (or sequence_length)")
    return tuple(int(s) for s in input_shape), len(input_shape) == 1


def _classes(num_classes: int | None, tokens: bool) -> int:
    if num_classes is None:
        return BYTE_VOCABULARY if tokens else 10
    check_range("num_classes", num_classes, 1)
    return int(num_classes)


def _meter(setup: LatencySetup, cache: str | None) -> LatencyMeter:
    """A meter through the cache file ``cache`` (``None``: :func:`default_cache`; ``""``:
    no cache)."""
    path = default_cache() if cache is None else (Path(cache) if cache else None)
    return LatencyMeter(setup, LatencyCache(path) if path else None)


class MeasuredLatency(Estimator):
    """Inference latency of the architecture's network measured on this machine (ONNX
    Runtime or torch) on images or, with sequence_length, the prefill of T tokens, cached on
    disk per architecture, input, setup and machine; and the peak memory of one forward pass
    (peak_memory_mb).

    The input is a batch of ``input_shape`` images, or, with ``sequence_length`` (or an
    ``input_shape`` of one number ``[T]``), the prefill of ``T`` int64 tokens of a language
    model over a vocabulary of ``num_classes`` (default 256, byte tokens). Batch size,
    threads, warm-up calls, repetitions and rounds are options.

    ``value`` and ``latency_ms`` are the median per-call milliseconds (with ``rounds`` above
    1, the fastest round's); ``latency_ms_iqr`` the spread, ``latency_ms_min`` the fastest
    call. ``cache=""`` measures every time. With ``memory`` (default), ``peak_memory_mb`` is
    the memory of one forward pass with torch on the CPU at the same batch and input
    (:class:`~frugalnas.latency.measure.MemoryFootprint`: weights, input and the most
    activation bytes alive at once), with its parts ``weight_memory_mb`` and
    ``activation_memory_mb``. With ``decode`` (a language model of the ``gpt`` space, with
    ``sequence_length`` T), ``decode_ms`` is the median time of generating token T with a
    key/value cache of the T - 1 before it, and ``decode_ms_iqr`` its spread."""

    name = "measured-latency"
    needs_dataset = False
    provides: tuple[str, ...] = METRICS + MEMORY_METRICS
    measures = ("seconds", "params")

    def __init__(self, input_shape: list[int] | None = None, num_classes: int | None = None,
                 runtime: str = "onnxruntime", batch_size: int = 1, threads: int = 1,
                 warmup: int = 10, repeats: int = 50, cache: str | None = None,
                 rounds: int = 1, sequence_length: int | None = None, memory: bool = True,
                 decode: bool = False):
        self.input_shape, self.tokens = _input(input_shape, sequence_length)
        self.num_classes = _classes(num_classes, self.tokens)
        for flag, value in (("memory", memory), ("decode", decode)):
            if not isinstance(value, bool):
                raise ConfigError(f"invalid {flag} {value!r}; expected true or false")
        if decode and not self.tokens:
            raise ConfigError("decode times generated tokens: it needs sequence_length (the "
                              "position of the generated token)")
        self.memory, self.decode = memory, decode
        self.provides = METRICS + (MEMORY_METRICS if memory else ()) + \
            (DECODE_METRICS if decode else ())
        self.setup = LatencySetup(runtime, batch_size, threads, warmup, repeats, rounds)
        self.meter = _meter(self.setup, cache)

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        import time

        start = time.perf_counter()
        result, hit = self.meter.network(context.space, arch, self.num_classes,
                                         self.input_shape, self.tokens)
        model = context.space.build(arch, self.num_classes, self.input_shape)
        metrics = {**result.metrics(), "latency_cached": float(hit)}
        if self.decode:
            step, _ = self.meter.decode(context.space, arch, self.num_classes,
                                        self.input_shape[0])
            metrics.update(decode_ms=step.median_ms, decode_ms_iqr=step.iqr_ms)
        if self.memory:
            metrics.update(peak_memory(model, self.input_shape, self.setup.batch_size,
                                       self.num_classes if self.tokens else None).metrics())
        return EstimateResult(result.median_ms, metrics,
                              Cost(seconds=time.perf_counter() - start,
                                   params=count_params(model)))


TABLES = ("kernels", "layers")


class PredictedLatency(Estimator):
    """Inference latency predicted from a calibrated lookup table of fused kernels
    (``table="kernels"``, nn-Meter style) or of single layers (``table="layers"``,
    ProxylessNAS style); free once the table holds the network's kernels.

    The table is calibrated on ``calibration`` networks measured whole, in ``rounds``
    interleaved rounds with the table; a constrained study screens candidates with the
    prediction before evaluating them. Measurements go through the same on-disk cache as
    ``measured-latency``. With ``sequence_length`` T the networks are language models timed on
    the prefill of T tokens, and the kernel table holds their attention, MLP, norm, embedding
    and output kernels (the layer table is for convolutional networks only)."""

    name = "latency-predictor"
    needs_dataset = False
    provides = ("latency_ms",)
    measures = ("seconds",)

    def __init__(self, input_shape: list[int] | None = None, num_classes: int | None = None,
                 runtime: str = "onnxruntime", batch_size: int = 1, threads: int = 1,
                 warmup: int = 10, repeats: int = 50, calibration: int = 20,
                 cache: str | None = None, seed: int = 0, table: str = "kernels",
                 rounds: int = 5, sequence_length: int | None = None):
        self.input_shape, self.tokens = _input(input_shape, sequence_length)
        self.num_classes = _classes(num_classes, self.tokens)
        check_range("calibration", calibration, 2)
        check_choice("table", table, TABLES)
        if self.tokens and table == "layers":
            raise ConfigError(TOKENS_REFUSED)
        self.calibration, self.seed = int(calibration), seed
        self.table = table
        self.setup = LatencySetup(runtime, batch_size, threads, warmup, repeats, rounds)
        self.meter = _meter(self.setup, cache)
        self._predictors: dict[int, KernelTablePredictor | LayerTablePredictor] = {}

    def check_space(self, space: SearchSpace) -> None:
        """A space whose networks take other inputs than the predictor's (language models
        without ``sequence_length``, image networks with it) is refused before the first
        trial."""
        tasks = type(space).tasks
        if self.tokens and "language-modelling" not in tasks:
            raise ConfigError(f"sequence_length times language models; space {space.name!r} "
                              f"builds networks for {', '.join(tasks)}")
        if not self.tokens and "image-classification" not in tasks:
            raise ConfigError(f"space {space.name!r} builds language models: give the "
                              "latency predictor sequence_length=T (the prefill of T tokens)")

    def predictor(self, space: SearchSpace) -> KernelTablePredictor | LayerTablePredictor:
        found = self._predictors.get(id(space))
        if found is None:
            args = (space, self.meter, self.num_classes, self.input_shape, self.calibration,
                    self.seed)
            found = KernelTablePredictor(*args, tokens=self.tokens) \
                if self.table == "kernels" else LayerTablePredictor(*args)
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
