"""The ``dag`` space: cells as DAGs of nodes with optional channel attention, and the weight
store their sub-networks share (built-in plugin ``dag``)."""

from __future__ import annotations

from typing import Any

from frugalnas.core.plugins import hookimpl
from frugalnas.spaces.dag.space import DagSpace

__all__ = ["DagSpace"]


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"dag": DagSpace}
