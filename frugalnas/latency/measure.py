"""Inference latency of one network on this machine, with ONNX Runtime or torch.

:func:`measure` runs ``warmup`` untimed calls and then ``repeats`` timed ones of one batch,
with a fixed number of threads, and reports the median and the spread (interquartile range)
of the per-call times. With ``rounds`` above 1 it does so several times and reports the
lowest of the rounds' medians: other work on the machine only ever slows a round down, so the
fastest round is the closest to the machine's own speed, and on a shared or virtual machine,
whose speed drifts over seconds, it is far more repeatable than one round.
:func:`measure_many` interleaves the rounds of several networks (round 1 of every network,
then round 2, ...), so that such drift meets them all alike instead of a few of them. ONNX Runtime runs the network exported to ONNX (torch's TorchScript
exporter, so no onnxscript is needed), as a deployed model would run; torch runs it in eval
mode under ``torch.inference_mode``.
"""

from __future__ import annotations

import io
import logging
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cache

from frugalnas.ports.errors import ConfigError, check_choice, check_range

RUNTIMES = ("onnxruntime", "torch")


@dataclass(frozen=True)
class Measurement:
    """Per-call latency of one batch, and how it was measured."""

    median_ms: float
    iqr_ms: float
    min_ms: float
    mean_ms: float
    runtime: str
    batch_size: int
    threads: int
    warmup: int
    repeats: int
    rounds: int = 1

    def metrics(self) -> dict[str, float]:
        return {"latency_ms": self.median_ms, "latency_ms_iqr": self.iqr_ms,
                "latency_ms_min": self.min_ms}

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


@dataclass(frozen=True)
class LatencySetup:
    """How to measure: runtime, batch size, threads, warm-up calls, timed repetitions, and
    rounds (each of ``warmup`` then ``repeats`` calls; the result is the fastest round's
    median)."""

    runtime: str = "onnxruntime"
    batch_size: int = 1
    threads: int = 1
    warmup: int = 10
    repeats: int = 50
    rounds: int = 1

    def __post_init__(self) -> None:
        check_choice("runtime", self.runtime, RUNTIMES)
        check_range("batch_size", self.batch_size, 1)
        check_range("threads", self.threads, 1)
        check_range("warmup", self.warmup, 0)
        check_range("repeats", self.repeats, 3)
        check_range("rounds", self.rounds, 1)

    def identity(self) -> dict[str, str | int]:
        """What a measurement depends on besides the network: this setup, the machine and
        the runtime's version (a cache key part)."""
        parts: dict[str, str | int] = {**asdict(self), "machine": machine_name(),
                                       "version": runtime_version(self.runtime)}
        if self.rounds == 1:
            del parts["rounds"]  # one round: keys as without the option, caches stay valid
        return parts


@cache
def machine_name() -> str:
    """The processor model and architecture (``/proc/cpuinfo``'s model name where there is
    one), so cached latencies of one machine are not read on another."""
    model = ""
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    model = line.split(":", 1)[1].strip()
                    break
    except OSError:
        pass
    return f"{model or platform.processor() or 'cpu'} ({platform.machine()})"


def runtime_version(runtime: str) -> str:
    if runtime == "onnxruntime":
        import onnxruntime

        return f"onnxruntime {onnxruntime.__version__}"
    import torch

    return f"torch {torch.__version__}"


def measure(model: object, input_shape: Sequence[int], setup: LatencySetup) -> Measurement:
    """The latency of ``model`` (a ``torch.nn.Module``) on a batch of ``setup.batch_size``
    inputs of ``input_shape`` (without the batch axis); the model's mode is restored."""
    return measure_many([(model, input_shape)], setup)[0]


def measure_many(models: Sequence[tuple[object, Sequence[int]]],
                 setup: LatencySetup) -> list[Measurement]:
    """The latencies of several ``(model, input_shape)``, measured in interleaved rounds:
    each round times every model once (``warmup`` then ``repeats`` calls), and a model's
    median is the lowest of its rounds' medians. The models' modes are restored."""
    import numpy as np
    import torch

    for model, _ in models:
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"measure needs a torch.nn.Module, got {type(model).__name__}")
    modes = [model.training for model, _ in models]  # type: ignore[attr-defined]
    times: list[list[float]] = [[] for _ in models]
    medians: list[list[float]] = [[] for _ in models]
    try:
        calls = []
        for model, input_shape in models:
            assert isinstance(model, torch.nn.Module)
            model.eval()
            x = torch.randn(setup.batch_size, *map(int, input_shape))
            calls.append(_onnx_call(model, x, setup.threads) if setup.runtime == "onnxruntime"
                         else _torch_call(model, x, setup.threads))
        for _ in range(setup.rounds):
            for i, call in enumerate(calls):
                timed = _timed(call, setup.warmup, setup.repeats)
                times[i] += timed
                medians[i].append(float(np.median(timed)))
    finally:
        for (model, _), training in zip(models, modes):
            model.train(training)  # type: ignore[attr-defined]
    results = []
    for per_call, per_round in zip(times, medians):
        ms = np.asarray(per_call) * 1e3
        q1, q3 = np.percentile(ms, [25, 75])
        results.append(Measurement(min(per_round) * 1e3, float(q3 - q1),
                                   float(ms.min()), float(ms.mean()), setup.runtime,
                                   setup.batch_size, setup.threads, setup.warmup,
                                   setup.repeats, setup.rounds))
    return results


def _timed(call: Callable[[], object], warmup: int, repeats: int) -> list[float]:
    for _ in range(warmup):
        call()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        call()
        times.append(time.perf_counter() - start)
    return times


def _torch_call(model: object, x: object, threads: int) -> Callable[[], object]:
    import torch

    def call() -> object:
        previous = torch.get_num_threads()
        torch.set_num_threads(threads)
        try:
            with torch.inference_mode():
                return model(x)  # type: ignore[operator]
        finally:
            torch.set_num_threads(previous)
    return call


def onnx_bytes(model: object, x: object) -> bytes:
    """``model`` exported to ONNX (TorchScript exporter, opset 17), in memory."""
    import torch

    buffer = io.BytesIO()
    quiet = [logging.getLogger(n) for n in ("torch.onnx", "torch.jit")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:
            q.setLevel(logging.ERROR)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            torch.onnx.export(model, (x,), buffer, dynamo=False, opset_version=17,
                              input_names=["input"], output_names=["output"])
    finally:
        for q, level in zip(quiet, levels):
            q.setLevel(level)
    return buffer.getvalue()


def _onnx_call(model: object, x: object, threads: int) -> Callable[[], object]:
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    options.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    options.log_severity_level = 3
    session = ort.InferenceSession(onnx_bytes(model, x), options,
                                   providers=["CPUExecutionProvider"])
    feed = {"input": x.numpy()}  # type: ignore[attr-defined]
    return lambda: session.run(None, feed)
