"""The ``gpt`` macro space (built-in plugin ``gpt``): decoder-only language models with a
searched width, depth, and per-layer heads and MLP ratio, and a supernet of elastic
transformer blocks of its own (docs/transformers.md)."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory
from frugalnas.ports.lazy import lazy_attributes

__getattr__ = lazy_attributes(__name__, {"GPTSpace": "frugalnas.spaces.gpt.space"})

__all__ = ["GPTSpace"]


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"gpt": LazyFactory(
        "frugalnas.spaces.gpt.space:GPTSpace",
        "Decoder-only language models: embedding width, depth, per-layer heads and MLP ratio; "
        "options widths, min_depth, max_depth, heads, mlp_ratios, head_dim, context, "
        "positions, norm. Weight sharing through elastic transformer blocks.")}
