"""``report.json`` of an exported network: what was trained, on which data, how each file
was checked, on which machine and with which library versions."""

from __future__ import annotations

import hashlib
import math
import os
import platform
from dataclasses import fields
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.keys import COST_ATTR, METRICS_ATTR
from frugalnas.ports.task import IMAGE_CLASSIFICATION
from frugalnas.ports.version import __version__

if TYPE_CHECKING:
    from frugalnas.export.exporter import _Plan, _Trained, _Written

#: The version of the report's layout.
REPORT_VERSION = 1


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def versions() -> dict[str, str | None]:
    """Versions of Python and of the libraries an exported model depends on."""
    from importlib import metadata

    out: dict[str, str | None] = {"python": platform.python_version(),
                                  "frugalnas": __version__, "torch": torch.__version__}
    for dist in ("onnx", "onnxruntime", "onnxscript", "mlflow", "optuna", "numpy",
                 "transformers", "tokenizers", "safetensors"):
        try:
            out[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            out[dist] = None
    return out


def machine() -> dict[str, Any]:
    return {"platform": platform.platform(), "machine": platform.machine(),
            "processor": platform.processor() or None, "cpu_count": os.cpu_count(),
            "torch_threads": torch.get_num_threads()}


def file_record(path: Path, out: Path) -> dict[str, Any]:
    """Size and SHA-256 of a written file; of a folder (the Hugging Face one), its total size
    and each file's."""
    if not path.is_dir():
        return {"file": str(path.relative_to(out)), "bytes": path.stat().st_size,
                "sha256": _sha256(path)}
    inner = {str(p.relative_to(path)): {"bytes": p.stat().st_size, "sha256": _sha256(p)}
             for p in sorted(path.rglob("*")) if p.is_file()}
    return {"file": str(path.relative_to(out)) + "/",
            "bytes": sum(v["bytes"] for v in inner.values()), "sha256": None, "files": inner}


def is_image_classification(data: Any) -> bool:
    return bool(data.task.name == IMAGE_CLASSIFICATION.name)


def metric_name(data: Any) -> str:
    """The report's name of the task's test metric: the validation metric's, for the test
    split (``test_accuracy``, ``test_loss``)."""
    metric = str(data.task.metric)
    return "test_" + metric[len("valid_"):] if metric.startswith("valid_") else f"test_{metric}"


def export_report(study: Any, frozen: Any, rank: int, arch: Architecture, plan: _Plan,
                  trained: _Trained, written: _Written, latency: dict[str, Any] | None,
                  score: float, test_examples: int, test_items: int) -> dict[str, Any]:
    """The content of ``report.json`` for one exported trial (its ``files`` and total
    seconds are added once every file is written)."""
    config = study.config
    metric = metric_name(plan.data)
    if is_image_classification(plan.data):
        test = {"test_accuracy": score, "test_examples": test_examples,
                "onnx_test_accuracy": written.onnx_score}
    else:
        test = {metric: score, "test_examples": test_examples, f"onnx_{metric}": written.onnx_score}
        if metric == "test_loss":
            test["test_perplexity"] = math.exp(min(score, 700.0))
            test["test_tokens"] = test_items
    return {
        "frugalnas_export": REPORT_VERSION,
        "study": study.name, "trial": frozen.number, "rank": rank, "selection": plan.selection,
        "architecture": {"text": str(arch), "space": study.space.name,
                         "space_options": dict(config.space_options),
                         "decisions": dict(arch.decisions)},
        "task": plan.data.task.name, "test_metric": metric, **test,
        "params": trained.params, "flops": trained.flops,
        "latency": latency,
        "search": {"objectives": dict(zip(config.objectives, map(float, frozen.values))),
                   "directions": list(study.directions),
                   "metrics": dict(frozen.user_attrs.get(METRICS_ATTR) or {}),
                   "cost": dict(frozen.user_attrs.get(COST_ATTR) or {}),
                   "strategy": config.strategy, "estimator": config.estimator,
                   "estimator_options": dict(config.estimator_options)},
        "dataset": _dataset_report(plan, config.seed, test_examples),
        "training": _training_report(plan, trained, config.backend),
        "checks": written.checks,
        "seconds": {"train": trained.seconds,
                    **{f"write_{k}": v for k, v in written.seconds.items()}},
        "versions": versions(),
        "machine": machine(),
        "mlflow": None,
    }


def _dataset_report(plan: _Plan, seed: int, test_examples: int) -> dict[str, Any]:
    data = plan.data
    if is_image_classification(data):
        preprocessing: dict[str, Any] = {
            "standardise": "(x - mean) / std per channel, before any resize",
            "mean": data.mean, "std": data.std}
    else:
        tokenizer = getattr(data, "tokenizer", None)
        file = getattr(data, "tokenizer_file", None)
        preprocessing = {"tokens": {"bytes": "UTF-8 bytes (ids 0-255)",
                                    "bpe": "byte-level BPE ids (tokenizer.json)"}.get(
                                        str(tokenizer), "the dataset's token ids"),
                         "tokenizer": tokenizer, "vocab_size": data.num_classes,
                         "tokenizer_file": str(file) if file is not None else None,
                         "context": int(data.input_shape[0])}
    return {"name": plan.data_name, "options": plan.data_options, "seed": seed,
            "task": data.task.name,
            "input_shape": list(data.input_shape), "num_classes": data.num_classes,
            "train_examples": data.num_examples("train"),
            "valid_examples": data.num_examples("valid"),
            "test_examples": test_examples, "trained_on": "train+valid",
            "preprocessing": preprocessing}


def _training_report(plan: _Plan, trained: _Trained, backend_name: str) -> dict[str, Any]:
    cfg, losses = plan.cfg, trained.losses
    return {**{f.name: getattr(cfg, f.name) for f in fields(cfg)}, "seed": plan.seed,
            "steps": trained.steps, "epochs_done": trained.epochs,
            "seconds": trained.seconds, "train_loop_seconds": trained.loop_seconds,
            "flops": 3.0 * trained.flops * trained.steps * cfg.batch_size,
            "peak_memory": trained.peak_memory,
            "final_loss": sum(losses[-10:]) / len(losses[-10:]) if losses else None,
            "backend": {**plan.backend.describe(), "name": backend_name,
                        "options": plan.backend_options},
            "backend_metrics": {k: float(v) for k, v in trained.backend_metrics.items()}}
