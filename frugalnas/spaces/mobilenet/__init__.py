"""The ``mobilenet`` macro space (built-in plugin ``mobilenet``): stages of inverted residuals
with searched depth, kernels, expansion ratios and squeeze-excite, and a supernet of elastic
blocks of its own (docs/spaces.md)."""

from __future__ import annotations

from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory

__getattr__ = lazy_attributes(__name__, {
    "MobileNetSpace": "frugalnas.spaces.mobilenet.space",
    "Stage": "frugalnas.spaces.mobilenet.space",
    "MOBILENET_V2_STAGES": "frugalnas.spaces.mobilenet.space"})

__all__ = ["MOBILENET_V2_STAGES", "MobileNetSpace", "Stage"]


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"mobilenet": LazyFactory(
        "frugalnas.spaces.mobilenet.space:MobileNetSpace",
        "MobileNetV2/V3-like macro space: per stage depth, per block kernel 3/5/7, expansion "
        "3/4/6 and squeeze-excite; options width_mult, resolution or searched resolutions, "
        "stages, kernels, expand_ratios, se, min_depth. Weight sharing through elastic blocks.")}
