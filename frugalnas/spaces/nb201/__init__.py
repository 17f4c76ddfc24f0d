"""The NAS-Bench-201 cell space and its tabular estimator (built-in plugin ``nb201``)."""

from __future__ import annotations

from typing import Any

from frugalnas.core.plugins import hookimpl
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.spaces.nb201.table import (
    LATENCY_DEVICES,
    TABLE_DATASETS,
    NB201Data,
    NB201TableEstimator,
    nb201_data,
    nb201_table,
)

__all__ = ["LATENCY_DEVICES", "NB201Data", "NB201Space", "NB201TableEstimator", "TABLE_DATASETS",
           "nb201_data", "nb201_table"]


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"nb201": NB201Space}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"nb201-table": NB201TableEstimator}

