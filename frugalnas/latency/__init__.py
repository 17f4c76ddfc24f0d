"""Latency on the machine at hand (plugin "latency"): the ``measured-latency`` estimator
(ONNX Runtime or torch, on images or the tokens of a language model, cached on disk per
architecture, input, setup and machine; with the peak memory of one forward pass) and the
``latency-predictor`` estimator (a calibrated lookup table of fused kernels). Both work on
every model space; docs/latency.md shows how to use them as an objective or a constraint."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {
        "measured-latency": LazyFactory(
            "frugalnas.latency.estimators:MeasuredLatency",
            "Inference latency of the architecture's network measured on this machine (ONNX "
            "Runtime or torch) on images or, with sequence_length, the prefill of T tokens, "
            "cached on disk per architecture, input, setup and machine; and the peak memory "
            "of one forward pass (peak_memory_mb)."),
        "latency-predictor": LazyFactory(
            "frugalnas.latency.estimators:PredictedLatency",
            "Inference latency predicted from a calibrated lookup table of fused kernels "
            '(``table="kernels"``, nn-Meter style) or of single layers (``table="layers"``, '
            "ProxylessNAS style); free once the table holds the network's kernels."),
    }
