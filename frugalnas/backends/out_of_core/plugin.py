"""Built-in plugin ``out-of-core``: registers the backend of
:mod:`frugalnas.backends.out_of_core.backend` without importing it (nor torch) until a study
uses it."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory


@hookimpl
def frugalnas_backends() -> dict[str, Any]:
    return {"out-of-core": LazyFactory(
        "frugalnas.backends.out_of_core.backend:OutOfCoreBackend",
        "Keeps saved activations under a budget by swapping blocks to host memory or "
        "recomputing them.")}
