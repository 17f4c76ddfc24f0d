"""Built-in plugin ``single-device``: registers the backend of
:mod:`frugalnas.backends.single_device` without importing it (nor torch) until a study uses
it."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory


@hookimpl
def frugalnas_backends() -> dict[str, Any]:
    return {"single-device": LazyFactory(
        "frugalnas.backends.single_device:SingleDeviceBackend",
        "Trains on one device: the whole batch in one forward/backward pass.")}
