"""Built-in plugin ``virtual-node``: registers the backend of
:mod:`frugalnas.backends.virtual_node.backend` and checks its options before a study starts,
without importing it (nor torch) unless a study uses it
(:mod:`frugalnas.backends.virtual_node.checks`)."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory
from frugalnas.backends.virtual_node.checks import NAME, check_config


@hookimpl
def frugalnas_backends() -> dict[str, Any]:
    return {NAME: LazyFactory(
        "frugalnas.backends.virtual_node.backend:VirtualNodeBackend",
        "Splits each batch into V virtual nodes run over 1..N processes; results independent "
        "of N.")}


@hookimpl
def frugalnas_check_config(config: Any, host: Any) -> None:
    """Before a study with this backend starts: its inner backend, options and world
    (:func:`frugalnas.backends.virtual_node.checks.check_config`)."""
    check_config(config, host)
