"""The ``dag`` space: cells as DAGs of nodes with optional channel attention, and the weight
store their sub-networks share (built-in plugin ``dag``)."""

from __future__ import annotations

from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory

__getattr__ = lazy_attributes(__name__, {"DagSpace": "frugalnas.spaces.dag.space"})

__all__ = ["DagSpace"]


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"dag": LazyFactory(
        "frugalnas.spaces.dag.space:DagSpace",
        "Evolvable DAG cells (normal + reduction) with optional squeeze-and-excitation per "
        "node.")}
