"""Built-in plugin ``random``: registers the strategy of :mod:`frugalnas.strategies.random`
without importing it until a study uses it."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"random": LazyFactory(
        "frugalnas.strategies.random:RandomArchSampler",
        "Uniform random architectures, never one already evaluated or running (while the "
        "space has unseen ones); seeded per trial, so workers sharing a storage do not repeat "
        "each other.")}
