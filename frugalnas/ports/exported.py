"""ExportedNetwork: what the hook ``frugalnas_model_exported`` receives for each network that
``frugalnas export`` (``export_study``) trained and wrote, so that a plugin can log or
register it (the MLflow plugin logs an MLflow model) without the exporter knowing it."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from types import MappingProxyType
from typing import Any


@dataclass(frozen=True)
class ExportedNetwork:
    """One exported network of trial ``trial``: ``architecture`` (its text form), ``model``
    (the trained ``torch.nn.Module``, on the CPU, in evaluation mode), ``example`` (an input
    batch for signatures, a ``torch.Tensor``), ``metrics`` (``test_accuracy``,
    ``export_params``, ``export_flops`` and, when measured, ``export_latency_ms``),
    ``params`` (what the network was trained with: study, trial, space, epochs, dataset),
    ``files`` (files to keep with the logged model: the draft ``report.json``, the ONNX
    file), ``register`` (a model registry name to register it under, ``None``: do not
    register) and ``tracking_uri`` (where to log it instead of the study's own store,
    ``None``: the study's)."""

    trial: int
    architecture: str
    model: Any
    example: Any
    metrics: Mapping[str, float] = field(default_factory=dict)
    params: Mapping[str, Any] = field(default_factory=dict)
    files: tuple[Path, ...] = ()
    register: str | None = None
    tracking_uri: str | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        put(self, "metrics", MappingProxyType({k: float(v) for k, v in self.metrics.items()}))
        put(self, "params", MappingProxyType(dict(self.params)))
        put(self, "files", tuple(Path(p) for p in self.files))
