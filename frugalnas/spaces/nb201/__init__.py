"""The NAS-Bench-201 cell space and its tabular estimator (built-in plugin ``nb201``)."""

from __future__ import annotations

from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory

# Registering the space and the estimator imports neither module (nor torch); they and the
# names below are imported when first used.
__getattr__ = lazy_attributes(__name__, {
    "NB201Space": "frugalnas.spaces.nb201.space",
    **{name: "frugalnas.spaces.nb201.table" for name in (
        "LATENCY_DEVICES", "TABLE_DATASETS", "NB201Data", "NB201TableEstimator", "nb201_data",
        "nb201_table")}})

__all__ = ["LATENCY_DEVICES", "NB201Data", "NB201Space", "NB201TableEstimator", "TABLE_DATASETS",
           "nb201_data", "nb201_table"]


@hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"nb201": LazyFactory(
        "frugalnas.spaces.nb201.space:NB201Space",
        "NAS-Bench-201: 6 edges x 5 operations (15,625 cells); options N (cells per stage) and "
        "C (stem channels).")}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"nb201-table": LazyFactory(
        "frugalnas.spaces.nb201.table:NB201TableEstimator",
        "Looks an NB201 cell up in the benchmark table: ``value`` is the accuracy selected on "
        "(CIFAR-10 validation by default), every accuracy and the 27 device latencies are "
        "metrics, and the cost carries the benchmark network's params and forward FLOPs. The "
        "latencies, params and FLOPs are known before any evaluation (:meth:`known_metrics`), "
        "so a constrained study's strategy can propose only cells that meet the constraints; "
        "``known_hardware=False`` withholds them until the evaluation. The values are those of "
        "the benchmark network (N=5, C=16): a space with other N or C is refused unless "
        "``any_network=True``.")}

