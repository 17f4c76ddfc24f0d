"""Inference latency of a network on the machine at hand, measured with
``torch.utils.benchmark`` (which synchronises an accelerator around each timed block).

:func:`measure_latency` times ``model(x)`` in eval mode without gradients for a batch of
random inputs: a few warm-up calls, then ``Timer.blocked_autorange`` (blocks of calls until
``min_run_time`` seconds have passed, at least ``min_blocks`` blocks), and returns the median
and interquartile range of the per-call times over the blocks. Estimators that offer a
``latency`` option record ``latency_ms`` (median) and ``latency_ms_iqr`` (spread).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass

import numpy as np
import torch
from torch.utils import benchmark

from frugalnas.ports.errors import ConfigError, check_range

#: Metric names the estimators' ``latency`` option adds.
LATENCY_METRICS = ("latency_ms", "latency_ms_iqr")


@dataclass(frozen=True)
class LatencyStats:
    """Per-call inference latency of one batch: median, spread and how it was measured."""

    median_ms: float
    iqr_ms: float          # interquartile range of the per-call times over the blocks
    mean_ms: float
    min_ms: float
    blocks: int            # timed blocks (each the mean of ``calls_per_block`` calls)
    calls_per_block: int
    batch_size: int
    device: str
    num_threads: int

    def metrics(self) -> dict[str, float]:
        """``{"latency_ms": median, "latency_ms_iqr": iqr}``."""
        return {"latency_ms": self.median_ms, "latency_ms_iqr": self.iqr_ms}

    def to_dict(self) -> dict[str, float | int | str]:
        return asdict(self)


def _model_device(model: torch.nn.Module) -> torch.device:
    for tensor in (*model.parameters(), *model.buffers()):
        return tensor.device
    return torch.device("cpu")


def measure_latency(model: torch.nn.Module, input_shape: Sequence[int], batch_size: int = 1,
                    device: torch.device | str | None = None, *, warmup: int = 3,
                    min_run_time: float = 0.2, min_blocks: int = 5,
                    num_threads: int | None = None,
                    example: torch.Tensor | None = None) -> LatencyStats:
    """Inference latency of ``model`` on one batch of ``batch_size`` inputs of
    ``input_shape`` (without the batch axis), on ``device`` (default: where the model's
    parameters are; the model is not moved). The inputs are random floats, or copies of
    ``example`` (one input, with its dtype: the tokens of a language model) when given.
    ``num_threads`` defaults to torch's current intra-op setting. The model's training mode
    is restored."""
    check_range("latency batch_size", batch_size, 1)
    check_range("latency warmup", warmup, 0)
    check_range("latency min_run_time", min_run_time, 0)
    check_range("latency min_blocks", min_blocks, 1)
    device = torch.device(device) if device is not None else _model_device(model)
    threads = int(num_threads) if num_threads is not None else torch.get_num_threads()
    shape = (int(batch_size), *map(int, input_shape))
    x = torch.randn(shape, device=device) if example is None \
        else example.reshape(1, *shape[1:]).expand(shape).to(device).contiguous()
    was_training = model.training
    model.eval()

    def forward() -> None:
        with torch.no_grad():
            model(x)

    try:
        for _ in range(int(warmup)):
            forward()
        timer = benchmark.Timer(stmt="forward()", globals={"forward": forward},
                                num_threads=threads)
        measured = timer.blocked_autorange(min_run_time=float(min_run_time))
        per_call = list(measured.times)
        while len(per_call) < min_blocks:
            per_call.extend(timer.timeit(measured.number_per_run).times)
    finally:
        model.train(was_training)
    ms = np.asarray(per_call, dtype=float) * 1e3
    q1, q3 = np.percentile(ms, [25, 75])
    return LatencyStats(median_ms=float(np.median(ms)), iqr_ms=float(q3 - q1),
                        mean_ms=float(ms.mean()), min_ms=float(ms.min()), blocks=len(ms),
                        calls_per_block=int(measured.number_per_run), batch_size=int(batch_size),
                        device=str(device), num_threads=threads)


def check_latency_options(latency: bool, batch_size: int, min_run_time: float) -> None:
    """ConfigError for a bad ``latency`` / ``latency_batch_size`` / ``latency_min_run_time``
    option of an estimator."""
    if not isinstance(latency, bool):
        raise ConfigError(f"invalid latency {latency!r}; expected true or false")
    check_range("latency_batch_size", batch_size, 1)
    if isinstance(batch_size, float) and not float(batch_size).is_integer():
        raise ConfigError(f"invalid latency_batch_size {batch_size!r}; expected an integer")
    check_range("latency_min_run_time", min_run_time, 0)


@dataclass(frozen=True)
class LatencyProbe:
    """The inference latency an estimator measures beside its score (its ``latency``,
    ``latency_batch_size`` and ``latency_min_run_time`` options): batches of ``batch_size``
    at the network's input shape, timed for about ``min_run_time`` seconds."""

    batch_size: int = 1
    min_run_time: float = 0.2

    @classmethod
    def of(cls, latency: bool, batch_size: int, min_run_time: float) -> LatencyProbe | None:
        """The probe an estimator's ``latency`` options ask for (``None`` without latency);
        the options are checked either way."""
        check_latency_options(latency, batch_size, min_run_time)
        return cls(int(batch_size), float(min_run_time)) if latency else None
