"""Writing a trained network in deployable formats and checking each against the module.

- ``torchscript``: ``torch.jit.trace`` (``model.torchscript.pt``, load with ``torch.jit.load``);
- ``export``: a ``torch.export`` program with a dynamic batch axis (``model.pt2``, load with
  ``torch.export.load(path).module()``);
- ``onnx``: an ONNX file (``model.onnx``, input ``input``, output ``logits``, dynamic batch
  axis), written by torch's ``torch.export``-based exporter (the TorchScript-based one if
  that fails), checked with ``onnx.checker`` and run with onnxruntime;
- ``huggingface``: a language model as a ``transformers`` GPT-2 folder
  (:mod:`frugalnas.export.huggingface`).

The inputs follow the dataset's task: float images ``(N, C, H, W)`` -> logits ``(N, classes)``
for image classification, int64 tokens ``(N, T)`` -> logits ``(N, T, vocabulary)`` for a
language model (``tokens=True`` below: the sequence axis is dynamic too, up to the model's
learned positions).

Each file is loaded back and run on a batch of test examples; its outputs must agree with the
module's within ``atol + rtol * max|logits|``, else :class:`ExportError`.
"""

from __future__ import annotations

import contextlib
import io
import logging
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from frugalnas.ports.errors import ConfigError
from frugalnas.export.options import FORMATS, ExportError

FILES = {"torchscript": "model.torchscript.pt", "export": "model.pt2", "onnx": "model.onnx",
         "huggingface": "huggingface"}
INPUT_NAME, OUTPUT_NAME = "input", "logits"
#: The names of the dynamic axes (ONNX ``dim_param``): batch, then a language model's sequence.
BATCH_AXIS, SEQUENCE_AXIS = "batch", "sequence"
ATOL = RTOL = 1e-4


@dataclass
class FormatResult:
    name: str
    path: Path
    max_abs_diff: float
    seconds: float
    details: dict[str, Any] = field(default_factory=dict)


def check_formats(formats: Any) -> tuple[str, ...]:
    if isinstance(formats, str):
        formats = [formats]
    out = []
    for f in formats or ():
        if f not in FORMATS:
            raise ConfigError(f"unknown export format {f!r}; valid: {', '.join(FORMATS)}")
        if f not in out:
            out.append(f)
    return tuple(out)


@contextlib.contextmanager
def quiet() -> Iterator[None]:
    """Silence the exporters' progress prints, warnings and log lines."""
    loggers = [logging.getLogger(n) for n in ("torch.onnx", "torch.export", "torch._dynamo",
                                              "torch.fx", "onnxscript")]
    levels = [lg.level for lg in loggers]
    for lg in loggers:
        lg.setLevel(logging.ERROR)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stdout(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for lg, level in zip(loggers, levels):
            lg.setLevel(level)


def example_batch(x: torch.Tensor) -> torch.Tensor:
    """Two examples (a batch of 1 would make torch.export treat the batch axis as fixed)."""
    return (x[:2] if len(x) >= 2 else x[:1].repeat(2, *([1] * (x.dim() - 1)))).contiguous()


def _diff(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.float() - b.float()).abs().max()) if a.numel() else 0.0


def verify(name: str, got: torch.Tensor, want: torch.Tensor) -> float:
    """The largest difference of ``got`` from ``want``; an :class:`ExportError` when the
    shapes differ or it exceeds ``ATOL + RTOL * max|want|``."""
    if tuple(got.shape) != tuple(want.shape):
        raise ExportError(f"the {name} file gives outputs of shape {tuple(got.shape)}; the "
                          f"module gives {tuple(want.shape)}")
    diff = _diff(got, want)
    bound = ATOL + RTOL * float(want.abs().max()) if want.numel() else ATOL
    if not diff <= bound:
        raise ExportError(f"the {name} file does not reproduce the trained module: max |diff| "
                          f"{diff:.3g} > {bound:.3g} on a batch of {len(want)} test examples")
    return diff


_verify = verify


def dynamic_shapes(tokens: bool = False, max_sequence: int | None = None) -> tuple[dict[int, Any]]:
    """``torch.export`` dynamic shapes of the one input: the batch axis, and for ``tokens``
    (a language model's ``(N, T)`` ids) the sequence axis, up to ``max_sequence``."""
    axes: dict[int, Any] = {0: torch.export.Dim(BATCH_AXIS, min=1, max=1 << 20)}
    if tokens:
        axes[1] = torch.export.Dim(SEQUENCE_AXIS, min=1, max=max_sequence or 1 << 20)
    return (axes,)


def write_torchscript(model: nn.Module, example: torch.Tensor, batch: torch.Tensor,
                      reference: torch.Tensor, out: Path) -> FormatResult:
    start = time.perf_counter()
    path = out / FILES["torchscript"]
    with quiet(), torch.no_grad():
        traced = torch.jit.trace(model, example, check_trace=False)
        torch.jit.save(traced, str(path))
        loaded = torch.jit.load(str(path), map_location="cpu")
        got = loaded(batch)
    return FormatResult("torchscript", path, verify("TorchScript", got, reference),
                        time.perf_counter() - start)


def export_program(model: nn.Module, example: torch.Tensor, tokens: bool = False,
                   max_sequence: int | None = None) -> Any:
    """A ``torch.export`` program of ``model`` with a dynamic batch axis (and sequence axis,
    for ``tokens``)."""
    with quiet():
        return torch.export.export(model, (example,),
                                   dynamic_shapes=dynamic_shapes(tokens, max_sequence))


def write_export(program: Any, batch: torch.Tensor, reference: torch.Tensor, out: Path,
                 build_seconds: float) -> FormatResult:
    start = time.perf_counter()
    path = out / FILES["export"]
    with quiet(), torch.no_grad():
        torch.export.save(program, str(path))
        got = torch.export.load(str(path)).module()(batch)
    return FormatResult("export", path, verify("torch.export", got, reference),
                        build_seconds + time.perf_counter() - start)


def onnx_session(path: Path, threads: int | None = None) -> Any:
    """An onnxruntime CPU session (``threads``: intra- and inter-op threads; default
    onnxruntime's)."""
    import onnxruntime as ort

    options = ort.SessionOptions()
    options.log_severity_level = 3
    if threads is not None:
        options.intra_op_num_threads = options.inter_op_num_threads = int(threads)
    return ort.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def onnx_input(x: torch.Tensor) -> np.ndarray:
    """What the ONNX file takes: float32 for floating inputs, int64 for token ids."""
    return x.numpy().astype(np.float32 if x.is_floating_point() else np.int64)


def onnx_predict(session: Any, x: torch.Tensor, batch_size: int = 256) -> torch.Tensor:
    name = session.get_inputs()[0].name
    outs = [session.run(None, {name: onnx_input(x[i:i + batch_size])})[0]
            for i in range(0, len(x), batch_size)]
    return torch.from_numpy(np.concatenate(outs)) if outs else torch.empty(0)


def write_onnx(model: nn.Module, program: Any | None, example: torch.Tensor, batch: torch.Tensor,
               reference: torch.Tensor, out: Path, tokens: bool = False,
               max_sequence: int | None = None) -> FormatResult:
    """``model.onnx`` from the ``torch.export`` ``program`` (from ``model`` when there is
    none; the TorchScript-based exporter when that fails), with the dynamic axes of
    :func:`dynamic_shapes` named ``batch`` (and ``sequence``)."""
    import onnx

    start = time.perf_counter()
    path = out / FILES["onnx"]
    exporter, first_error = "torch.export (dynamo)", None
    axes = [BATCH_AXIS, SEQUENCE_AXIS] if tokens else [BATCH_AXIS]
    try:
        with quiet():
            onnx_program = torch.onnx.export(program if program is not None else model,
                                             (example,), dynamo=True, input_names=[INPUT_NAME],
                                             output_names=[OUTPUT_NAME], verbose=False,
                                             dynamic_shapes=None if program is not None else
                                             dynamic_shapes(tokens, max_sequence))
            onnx_program.save(str(path))
        if program is not None:
            _name_axes(path, axes)
    except Exception as exc:  # onnxscript missing, an operator it cannot translate, ...
        first_error = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        exporter = "TorchScript-based"
        try:
            with quiet():
                named = dict(enumerate(axes))
                torch.onnx.export(model, (example,), str(path), dynamo=False,
                                  input_names=[INPUT_NAME], output_names=[OUTPUT_NAME],
                                  dynamic_axes={INPUT_NAME: named, OUTPUT_NAME: named})
        except Exception as exc2:
            raise ExportError(f"could not write the ONNX file: {first_error}; the TorchScript-"
                              f"based exporter: {type(exc2).__name__}: {exc2}") from exc2
    onnx.checker.check_model(str(path))
    session = onnx_session(path)
    got = onnx_predict(session, batch)
    result = FormatResult("onnx", path, verify("ONNX", got, reference), time.perf_counter() - start,
                          {"exporter": exporter, "opset": _opset(path)})
    if first_error:
        result.details["dynamo_error"] = first_error
    return result


def _name_axes(path: Path, names: list[str]) -> None:
    """Rename the symbolic sizes of the input's first axes (``s52``, ...: what the exporter
    calls the dynamic dimensions of a ``torch.export`` program) to ``names`` throughout the
    graph's inputs, outputs and value infos."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    graph = model.graph
    dims = graph.input[0].type.tensor_type.shape.dim
    rename = {d.dim_param: name for d, name in zip(dims, names) if d.dim_param}
    if not rename:
        return
    for value in (*graph.input, *graph.output, *graph.value_info):
        for d in value.type.tensor_type.shape.dim:
            if d.dim_param in rename:
                d.dim_param = rename[d.dim_param]
    onnx.save(model, str(path))


def _opset(path: Path) -> int | None:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    for entry in model.opset_import:
        if entry.domain in ("", "ai.onnx"):
            return int(entry.version)
    return None


def onnx_latency(session: Any, input_shape: tuple[int, ...], batch_size: int = 1,
                 min_run_time: float = 0.2, warmup: int = 3,
                 example: torch.Tensor | None = None) -> dict[str, float]:
    """Per-call latency (ms) of an onnxruntime session on a random batch (copies of
    ``example``, one input with its dtype, when given: a language model's tokens): median
    and interquartile range over at least 5 timed blocks of calls."""
    name = session.get_inputs()[0].name
    if example is None:
        x = np.random.default_rng(0).standard_normal((batch_size, *input_shape)).astype(np.float32)
    else:
        one = onnx_input(example.reshape(1, *input_shape))
        x = np.ascontiguousarray(np.repeat(one, batch_size, axis=0))
    for _ in range(warmup):
        session.run(None, {name: x})
    calls, start = 0, time.perf_counter()
    while time.perf_counter() - start < min_run_time / 10 or calls < 1:
        session.run(None, {name: x})
        calls += 1
    per_block = max(1, calls)
    times: list[float] = []
    begin = time.perf_counter()
    while len(times) < 5 or time.perf_counter() - begin < min_run_time:
        t0 = time.perf_counter()
        for _ in range(per_block):
            session.run(None, {name: x})
        times.append((time.perf_counter() - t0) / per_block * 1e3)
    ms = np.asarray(times)
    q1, q3 = np.percentile(ms, [25, 75])
    return {"median_ms": float(np.median(ms)), "iqr_ms": float(q3 - q1), "blocks": len(ms),
            "calls_per_block": per_block, "batch_size": batch_size}


def onnx_file_latency(path: Path, input_shape: tuple[int, ...], threads: int = 1,
                      **kwargs: Any) -> dict[str, Any]:
    """:func:`onnx_latency` of the ONNX file at ``path`` with ``threads`` threads."""
    return {**onnx_latency(onnx_session(path, threads), input_shape, **kwargs),
            "num_threads": int(threads), "device": "cpu"}
