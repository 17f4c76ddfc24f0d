"""The NAS-Bench-201 table and its estimator ``nb201-table`` (built-in plugin ``nb201``).

The table (``frugalnas/data/nb201_accuracy.npz``, built by ``tools/make_nb201_table.py``)
holds for each of the 15,625 cells, indexed by :meth:`NB201Space.index`: test accuracy after
200 epochs on CIFAR-10, CIFAR-100 and ImageNet16-120 (NAS-Bench-201 / NATS-Bench), CIFAR-10
validation accuracy (NAS-Bench-201, as tabulated by NASWOT), inference latency on 27
devices (HELP, partly from HW-NAS-Bench), and the parameters and forward FLOPs of the
benchmark network for each dataset. See docs/nb201.md for the protocol and the credits.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from functools import cached_property, lru_cache
from importlib import resources

import numpy as np

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost
from frugalnas.ports.errors import ConfigError, check_choice
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.space import SearchSpace
from frugalnas.spaces.nb201.space import NB201Space

TABLE_DATASETS = ("cifar10", "cifar100", "imagenet16-120")
#: Datasets with a validation column in the shipped table.
VALID_DATASETS = ("cifar10",)
SELECT_ON = ("valid", "test")
#: The 27 devices/settings of the latency table (``latency_ms_<device>``); GPUs at batch 1,
#: 32 and 256, server CPUs, phones, Raspberry Pi 4, an ASIC (eyeriss) and an FPGA.
LATENCY_DEVICES = (
    "1080ti_1", "1080ti_32", "1080ti_256", "2080ti_1", "2080ti_32", "2080ti_256",
    "titan_rtx_1", "titan_rtx_32", "titan_rtx_256", "titanx_1", "titanx_32", "titanx_256",
    "titanxp_1", "titanxp_32", "titanxp_256",
    "gold_6226", "gold_6240", "silver_4114", "silver_4210r",
    "essential_ph_1", "pixel2", "pixel3", "samsung_a50", "samsung_s7",
    "raspi4", "eyeriss", "fpga",
)
ACCURACY_METRICS = ("valid_accuracy_cifar10",
                    *(f"test_accuracy_{name}" for name in TABLE_DATASETS))
LATENCY_METRICS = tuple(f"latency_ms_{d}" for d in LATENCY_DEVICES)


_TEST_NAMES = tuple(f"test_accuracy_{name}" for name in TABLE_DATASETS)


@lru_cache(maxsize=4)
def _latency_names(devices: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(f"latency_ms_{d}" for d in devices)


@dataclass(frozen=True, eq=False)
class NB201Data:
    """The whole table; every array's first axis is :meth:`NB201Space.index`."""

    test_accuracy: np.ndarray          # float32 (15625, 3), %, columns TABLE_DATASETS
    valid_accuracy_cifar10: np.ndarray  # float32 (15625,), %
    latency_ms: np.ndarray             # float16 (15625, 27), ms, columns latency_devices
    latency_devices: tuple[str, ...]
    params: np.ndarray                 # int32 (15625, 3), columns TABLE_DATASETS
    flops: np.ndarray                  # int64 (15625, 3), forward FLOPs of one sample
    provenance: dict

    def latency(self, device: str) -> np.ndarray:
        """Latency (ms, float32) of every cell on ``device``."""
        check_choice("NB201 latency device", device, self.latency_devices)
        return self.latency_ms[:, self.latency_devices.index(device)].astype(np.float32)

    def metrics(self, index: int) -> dict[str, float]:
        """Every metric of one cell, named as the estimator names them."""
        names, rows = self._metric_rows
        # One conversion per row (tolist), not one per value: the table estimator's trial
        # costs about as much as optuna's own bookkeeping.
        return dict(zip(names, rows[index].tolist()))

    @cached_property
    def _metric_rows(self) -> tuple[tuple[str, ...], np.ndarray]:
        """The metrics' names and one float64 row of them per cell (widening is exact)."""
        names = ("valid_accuracy_cifar10", *_TEST_NAMES, *_latency_names(self.latency_devices))
        rows = np.hstack([self.valid_accuracy_cifar10[:, None].astype(np.float64),
                          self.test_accuracy.astype(np.float64),
                          self.latency_ms.astype(np.float64)])
        rows.setflags(write=False)
        return names, rows


@lru_cache(maxsize=1)
def nb201_data() -> NB201Data:
    """The shipped NAS-Bench-201 table (loaded once)."""
    with resources.files("frugalnas.data").joinpath("nb201_accuracy.npz").open("rb") as fh:
        z = np.load(fh)
        data = NB201Data(
            test_accuracy=z["test_accuracy"], valid_accuracy_cifar10=z["valid_accuracy_cifar10"],
            latency_ms=z["latency_ms"], latency_devices=tuple(str(d) for d in z["latency_devices"]),
            params=z["params"], flops=z["flops"], provenance=json.loads(str(z["provenance"])))
    for array in (data.test_accuracy, data.valid_accuracy_cifar10, data.latency_ms,
                  data.params, data.flops):
        array.setflags(write=False)
    return data


def nb201_table() -> np.ndarray:
    """Test accuracy (%) after 200 epochs, shape (15625, 3): CIFAR-10, CIFAR-100,
    ImageNet16-120, indexed by :meth:`NB201Space.index`. Source: NAS-Bench-201 / NATS-Bench.
    The rest of the table (validation accuracy, latency, size) is in :func:`nb201_data`."""
    return nb201_data().test_accuracy


def _options(values: dict[str, int]) -> str:
    return ", ".join(f"{k}={v}" for k, v in values.items())


class NB201TableEstimator(Estimator):
    """Looks an NB201 cell up in the benchmark table: ``value`` is the accuracy selected on
    (CIFAR-10 validation by default), every accuracy and the 27 device latencies are metrics,
    and the cost carries the benchmark network's params and forward FLOPs. The latencies, params
    and FLOPs are known before any evaluation (:meth:`known_metrics`), so a constrained study's
    strategy can propose only cells that meet the constraints; ``known_hardware=False``
    withholds them until the evaluation. The values are those of the benchmark network
    (N=5, C=16): a space with other N or C is refused unless ``any_network=True``.

    The table holds the values of the benchmark network (:attr:`network`), so a study whose
    NB201 space has other cells per stage or channels is refused before its first trial;
    ``any_network=True`` accepts it and scores each cell as in the benchmark network (for a
    strategy or proxy that builds smaller networks of the space to choose cells, which the
    table then scores)."""

    name = "nb201-table"
    needs_dataset = False
    provides = (*ACCURACY_METRICS, *LATENCY_METRICS)
    measures = ("seconds", "epochs", "params", "flops")
    #: The network the table's values were measured on: cells per stage and stem channels.
    network = {"N": 5, "C": 16}

    def __init__(self, dataset: str = "cifar10", select_on: str = "valid",
                 simulated_epochs: float = 200.0, known_hardware: bool = True,
                 any_network: bool = False):
        check_choice("nb201-table dataset", dataset, TABLE_DATASETS)
        check_choice("nb201-table select_on", select_on, SELECT_ON)
        if select_on == "valid" and dataset not in VALID_DATASETS:
            raise ConfigError(
                f"nb201-table has no validation accuracy for dataset {dataset!r} (only for "
                f"{', '.join(VALID_DATASETS)}); pass select_on='test' to select on its test "
                "accuracy (the search then selects on the test set), or use dataset='cifar10'")
        for option, value in (("known_hardware", known_hardware), ("any_network", any_network)):
            if not isinstance(value, bool):
                raise ConfigError(f"invalid nb201-table {option} {value!r}; valid: True, False")
        self.dataset, self.select_on = dataset, select_on
        self.known_hardware, self.any_network = known_hardware, any_network
        self.simulated_epochs = simulated_epochs
        self.value_metric = f"{select_on}_accuracy_{dataset}"

    def check_space(self, space: SearchSpace) -> None:
        """Refuse a space whose networks are not the table's: another space, or NB201 with
        other cells per stage or channels (unless ``any_network``)."""
        if not isinstance(space, NB201Space):
            raise ConfigError(
                f"estimator 'nb201-table' looks cells up in the NAS-Bench-201 table and cannot "
                f"score architectures of search space {space.name!r}; use space='nb201', or an "
                "estimator that works on any space (train, low-fidelity, a proxy such as "
                "synflow)")
        given = {"N": space.N, "C": space.C}
        if given != self.network and not self.any_network:
            raise ConfigError(
                f"estimator 'nb201-table' holds the values of the benchmark network and cannot "
                f"score space {space.name!r} with {_options(given)}; valid: "
                f"{_options(self.network)} (the space's defaults), an estimator that trains "
                "(train, low-fidelity), or the estimator option any_network=True "
                "(-o estimator.any_network=true) to score each cell as in the benchmark "
                "network (when only a strategy or proxy builds the smaller networks)")

    def known_metrics(self, arch: Architecture, space: SearchSpace) -> dict[str, float]:
        """The table's hardware columns of ``arch``, known before any evaluation: the 27
        device latencies (``latency_ms_<device>``) and the benchmark network's ``params`` and
        ``flops`` for the estimator's dataset (the values :meth:`evaluate` reports). With
        ``known_hardware=False`` nothing (they are known only once evaluated, as a measured
        latency would be)."""
        if not self.known_hardware:
            return {}
        table_space = space if isinstance(space, NB201Space) else NB201Space()
        data = nb201_data()
        index = table_space.index(arch)
        col = TABLE_DATASETS.index(self.dataset)
        known = {f"latency_ms_{d}": float(data.latency_ms[index, i])
                 for i, d in enumerate(data.latency_devices)}
        known["params"] = float(int(data.params[index, col]))
        known["flops"] = float(data.flops[index, col])
        return known

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        start = time.perf_counter()
        space = context.space
        if not isinstance(space, NB201Space):
            space = NB201Space()
        data = nb201_data()
        index = space.index(arch)
        metrics = data.metrics(index)
        col = TABLE_DATASETS.index(self.dataset)
        cost = Cost(seconds=time.perf_counter() - start, epochs=self.simulated_epochs,
                    params=int(data.params[index, col]), flops=float(data.flops[index, col]))
        return EstimateResult(value=metrics[self.value_metric], metrics=metrics, cost=cost)
