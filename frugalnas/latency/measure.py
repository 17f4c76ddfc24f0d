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

A network takes float images ``(N, C, H, W)`` (an ``input_shape`` of ``(C, H, W)``) or, given
a vocabulary size, int64 tokens ``(N, T)`` drawn uniformly from the vocabulary (an
``input_shape`` of ``(T,)``: the prefill of ``T`` tokens by a language model), exported to ONNX
with an int64 input (:func:`example_input`).

:func:`peak_memory` counts the memory of one forward pass with torch on the CPU
(:class:`MemoryFootprint`): the weights, the input, and the most bytes of tensors the pass
creates that are alive at once, followed operator by operator.
"""

from __future__ import annotations

import contextlib
import io
import logging
import platform
import time
import warnings
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass
from functools import cache
from typing import Any, cast

from frugalnas.ports.errors import ConfigError, check_choice, check_range

RUNTIMES = ("onnxruntime", "torch")
MIB = 1 << 20

#: A network to measure: ``(model, input_shape)`` for images, or ``(model, input_shape,
#: vocab_size)``, whose input is int64 tokens when ``vocab_size`` is not ``None``.
Network = tuple[object, Sequence[int]] | tuple[object, Sequence[int], int | None]


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


def example_input(input_shape: Sequence[int], batch_size: int = 1,
                  vocab_size: int | None = None) -> Any:
    """A batch of ``batch_size`` inputs of ``input_shape`` (without the batch axis): standard
    normal floats, or with ``vocab_size`` int64 tokens uniform over ``0..vocab_size - 1``
    (the same tokens every call: the generator is seeded)."""
    import torch

    shape = (int(batch_size), *map(int, input_shape))
    if vocab_size is None:
        return torch.randn(shape)
    generator = torch.Generator().manual_seed(0)
    return torch.randint(0, int(vocab_size), shape, dtype=torch.int64, generator=generator)


def _unpack(item: Network) -> tuple[Any, tuple[int, ...], int | None]:
    model, shape = item[0], tuple(int(s) for s in item[1])
    vocab = item[2] if len(item) > 2 else None
    return model, shape, (None if vocab is None else int(vocab))


def measure(model: object, input_shape: Sequence[int], setup: LatencySetup,
            vocab_size: int | None = None) -> Measurement:
    """The latency of ``model`` (a ``torch.nn.Module``) on a batch of ``setup.batch_size``
    inputs of ``input_shape`` (without the batch axis; with ``vocab_size``, int64 tokens:
    ``input_shape`` is ``(T,)``); the model's mode is restored."""
    return measure_many([(model, input_shape, vocab_size)], setup)[0]


def measure_many(models: Sequence[Network], setup: LatencySetup) -> list[Measurement]:
    """The latencies of several ``(model, input_shape)`` or ``(model, input_shape,
    vocab_size)`` (:data:`Network`), measured in interleaved rounds: each round times every
    model once (``warmup`` then ``repeats`` calls), and a model's median is the lowest of its
    rounds' medians. The models' modes are restored."""
    import numpy as np
    import torch

    items = [_unpack(item) for item in models]
    for model, _, _ in items:
        if not isinstance(model, torch.nn.Module):
            raise ConfigError(f"measure needs a torch.nn.Module, got {type(model).__name__}")
    modes = [model.training for model, _, _ in items]
    times: list[list[float]] = [[] for _ in models]
    medians: list[list[float]] = [[] for _ in models]
    try:
        calls = []
        for model, input_shape, vocab in items:
            model.eval()
            x = example_input(input_shape, setup.batch_size, vocab)
            calls.append(_onnx_call(model, x, setup.threads) if setup.runtime == "onnxruntime"
                         else _torch_call(model, x, setup.threads))
        for _ in range(setup.rounds):
            for i, call in enumerate(calls):
                timed = _timed(call, setup.warmup, setup.repeats)
                times[i] += timed
                medians[i].append(float(np.median(timed)))
    finally:
        for (model, _, _), training in zip(items, modes):
            model.train(training)
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
    """``model`` exported to ONNX (TorchScript exporter, opset 17; the ``torch.export``-based
    exporter for a network with an operator opset 17 lacks, such as RMSNorm), in memory, for
    the input ``x`` (its dtype is the graph input's: float images or int64 tokens,
    :func:`example_input`)."""
    import torch

    buffer = io.BytesIO()
    target: Any = buffer  # torch's stubs name paths only; the exporter writes files too
    quiet = [logging.getLogger(n) for n in ("torch.onnx", "torch.jit")]
    levels = [q.level for q in quiet]
    try:
        for q in quiet:
            q.setLevel(logging.ERROR)
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            network = cast(torch.nn.Module, model)
            # the TorchScript exporter has no aten::rms_norm at opset 17
            if not any(isinstance(m, torch.nn.RMSNorm) for m in network.modules()):
                torch.onnx.export(network, (x,), target, dynamo=False, opset_version=17,
                                  input_names=["input"], output_names=["output"])
            else:
                program: Any = torch.onnx.export(network, (x,), dynamo=True,
                                                 input_names=["input"],
                                                 output_names=["output"])
                return bytes(program.model_proto.SerializeToString())
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


@dataclass(frozen=True)
class MemoryFootprint:
    """The memory one forward pass of a network holds, in bytes (:func:`peak_memory`).

    ``weights``: the parameters and buffers (each storage once: tied weights count once);
    ``input``: the batch fed in; ``activations``: the most bytes of the tensors the pass
    creates (every operator's outputs, the output included) that are alive at the same time.
    The peak is their sum. A view or an in-place result shares its tensor's storage and adds
    nothing; what a kernel allocates internally and frees before it returns (a convolution's
    unfolded input, an attention kernel's blocks) is not a tensor the pass sees and is not
    counted, nor are the interpreter, the libraries and a runtime's own arena."""

    weights: int
    input: int
    activations: int

    @property
    def peak(self) -> int:
        return self.weights + self.input + self.activations

    def metrics(self) -> dict[str, float]:
        """``peak_memory_mb`` and its parts ``weight_memory_mb`` (parameters and
        buffers) and ``activation_memory_mb`` (the input and the activations), in MiB
        (2**20 bytes)."""
        return {"peak_memory_mb": self.peak / MIB, "weight_memory_mb": self.weights / MIB,
                "activation_memory_mb": (self.input + self.activations) / MIB}


def _storage_key(t: Any) -> tuple[int, int]:
    storage = t.untyped_storage()
    return storage.data_ptr(), storage.nbytes()


def peak_memory(model: object, input_shape: Sequence[int], batch_size: int = 1,
                vocab_size: int | None = None) -> MemoryFootprint:
    """The memory of one forward pass of ``model`` (a ``torch.nn.Module``, eval mode, under
    ``torch.inference_mode``, on the CPU) on a batch of ``batch_size`` inputs of
    ``input_shape`` (tokens with ``vocab_size``, as :func:`example_input`); the model's mode
    is restored. Exact and repeatable for one network and shape: the tensors every operator
    returns are followed (a ``TorchDispatchMode``) until their storage is freed, so the
    figure is the largest sum of live tensors, not a resident-set growth
    (:class:`MemoryFootprint` says what it counts)."""
    import weakref

    import torch
    from torch.utils._python_dispatch import TorchDispatchMode
    from torch.utils._pytree import tree_leaves

    if not isinstance(model, torch.nn.Module):
        raise ConfigError(f"peak_memory needs a torch.nn.Module, got {type(model).__name__}")
    x = example_input(input_shape, batch_size, vocab_size)
    weights = dict(_storage_key(t) for t in (*model.parameters(), *model.buffers()))
    known = {*weights, _storage_key(x)[0]}

    class Live(TorchDispatchMode):  # type: ignore[no-untyped-call]
        """The bytes of the storages operators create, alive now and at most."""

        def __init__(self) -> None:
            super().__init__()  # type: ignore[no-untyped-call]
            self.live: dict[int, int] = {}
            self.now = self.most = 0

        def free(self, key: int) -> None:
            self.now -= self.live.pop(key, 0)

        def __torch_dispatch__(self, func: Any, types: Any, args: Any = (),
                               kwargs: Any = None) -> Any:
            out = func(*args, **(kwargs or {}))
            for t in tree_leaves(out):
                if not isinstance(t, torch.Tensor):
                    continue
                storage = t.untyped_storage()
                key, size = storage.data_ptr(), storage.nbytes()
                if size == 0 or key in known or key in self.live:
                    continue
                self.live[key] = size
                self.now += size
                self.most = max(self.most, self.now)
                weakref.finalize(storage, self.free, key)
            return out

    training = model.training
    model.eval()
    try:
        live = Live()
        with torch.inference_mode(), live:
            out = model(x)
        del out
    finally:
        model.train(training)
    return MemoryFootprint(sum(weights.values()), int(x.untyped_storage().nbytes()), live.most)
