"""The ``vit`` macro space (built-in plugin ``vit``): vision transformers with a searched patch
size, embedding width, depth, and per-layer heads and MLP ratio, and a supernet of elastic
transformer blocks of its own (docs/transformers.md)."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory
from frugalnas.ports.lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {"ViTSpace": "frugalnas.spaces.vit.space"})

__all__ = ["ViTSpace"]


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"vit": LazyFactory(
        "frugalnas.spaces.vit.space:ViTSpace",
        "Vision transformers: patch size, embedding width, depth, per-layer heads and MLP "
        "ratio; options patch_sizes, widths, min_depth, max_depth, heads, mlp_ratios, "
        "head_dim, norm. Weight sharing through elastic transformer blocks.")}
