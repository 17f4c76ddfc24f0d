"""Build frugalnas/data/nb201_accuracy.npz, the NAS-Bench-201 table of the ``nb201-table``
estimator, from the CSV files of ``../shared/data`` (see its README for sources and licences).

Every array is indexed by :meth:`frugalnas.spaces.nb201.space.NB201Space.index` (the cell's op
indices read as a base-5 number; edge order 1<-0, 2<-0, 2<-1, 3<-0, 3<-1, 3<-2; op order as in
``OPS``). The CSVs are in NAS-Bench-201's own index order, which is a different order: each
row is placed by parsing its cell string, and the tool checks that every file names the same
cell on the same row and that the 15,625 cells are all distinct.

Arrays written:

``test_accuracy``           float32 (15625, 3)  test accuracy (%), 200 epochs: CIFAR-10,
                                                CIFAR-100, ImageNet16-120 (nats_bench.csv)
``valid_accuracy_cifar10``  float32 (15625,)    CIFAR-10 validation accuracy (%), 200 epochs
                                                (nb201_cifar10_valid.csv)
``latency_ms``              float16 (15625, 27) inference latency (ms) per device
                                                (nb201_latency_ms.csv); float16 keeps the
                                                values to 0.05 % (relative)
``latency_devices``         str (27,)           the devices, columns of ``latency_ms``
``params``                  int32 (15625, 3)    parameters of the benchmark network per dataset
``flops``                   int64 (15625, 3)    forward FLOPs of one sample per dataset
``datasets``                str (3,)            cifar10, cifar100, imagenet16-120
``provenance``              str ()              JSON: sources (sha256), network settings

params and FLOPs are those of the network ``NB201Space(N=5, C=16).build`` makes (the
benchmark's macro skeleton) for CIFAR-10 (10 classes, 3x32x32), CIFAR-100 (100 classes,
3x32x32) and ImageNet16-120 (120 classes, 3x16x16); FLOPs are counted by
``frugalnas.ports.cost.count_flops`` on one sample (2 FLOPs per multiply-add, convolutions and
the classifier). Every edge of a cell has the same shape, so a network's size depends only on
the multiset of its six operations: the tool builds one network per multiset (210, not
15,625) and then checks ``--verify`` randomly drawn cells against a network built for the
cell itself.

Usage: python tools/make_nb201_table.py [--data ../shared/data] [--verify 30] [--out PATH]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import random
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch

from frugalnas.ports.cost import count_flops, count_params
from frugalnas.spaces.nb201.space import DECISIONS, OPS, NB201Space

ROOT = Path(__file__).resolve().parents[1]
N_CELLS = len(OPS) ** len(DECISIONS)
#: dataset -> (classes, input shape) of the benchmark's network for it
NETWORKS = {"cifar10": (10, (3, 32, 32)), "cifar100": (100, (3, 32, 32)),
            "imagenet16-120": (120, (3, 16, 16))}
NATS_COLUMNS = ("CIFAR10TestAccuracy200Epochs", "CIFAR100TestAccuracy200Epochs",
                "ImageNetTestAccuracy200Epochs")


def sha256(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def cell_order(space: NB201Space, archs: pd.Series, what: str) -> np.ndarray:
    """``NB201Space.index`` of each row's cell; checks the rows are 15,625 distinct cells."""
    order = np.array([space.index(space.parse(a)) for a in archs])
    if len(order) != N_CELLS or len(np.unique(order)) != N_CELLS:
        raise SystemExit(f"{what}: expected {N_CELLS} distinct cells, got {len(order)} rows, "
                         f"{len(np.unique(order))} distinct")
    return order


def size_of(space: NB201Space, arch, dataset: str) -> tuple[int, int]:
    classes, shape = NETWORKS[dataset]
    torch.manual_seed(0)
    net = space.build(arch, classes, shape)
    return count_params(net), count_flops(net, torch.zeros(1, *shape))


def network_sizes(space: NB201Space) -> tuple[np.ndarray, np.ndarray, int]:
    """params and FLOPs of every cell for each dataset, one network per op multiset."""
    params = np.zeros((N_CELLS, len(NETWORKS)), dtype=np.int64)
    flops = np.zeros((N_CELLS, len(NETWORKS)), dtype=np.int64)
    groups: dict[tuple[str, ...], list[int]] = {}
    for idx in range(N_CELLS):
        arch = space.from_index(idx)
        groups.setdefault(tuple(sorted(arch[k] for k in DECISIONS)), []).append(idx)
    for members in groups.values():
        arch = space.from_index(members[0])
        for d, dataset in enumerate(NETWORKS):
            params[members, d], flops[members, d] = size_of(space, arch, dataset)
    return params, flops, len(groups)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, default=ROOT.parent / "shared" / "data",
                        help="folder with nats_bench.csv, nb201_cifar10_valid.csv, "
                             "nb201_latency_ms.csv")
    parser.add_argument("--verify", type=int, default=30,
                        help="random cells whose own network is built and counted (default 30)")
    parser.add_argument("--out", type=Path,
                        default=ROOT / "frugalnas" / "data" / "nb201_accuracy.npz")
    args = parser.parse_args()
    torch.set_num_threads(1)
    start = time.perf_counter()
    space = NB201Space(N=5, C=16)

    nats_path = args.data / "nats_bench.csv"
    valid_path = args.data / "nb201_cifar10_valid.csv"
    latency_path = args.data / "nb201_latency_ms.csv"
    nats, valid, latency = (pd.read_csv(p) for p in (nats_path, valid_path, latency_path))
    if not (valid["arch"] == latency["arch"]).all():
        raise SystemExit("nb201_cifar10_valid.csv and nb201_latency_ms.csv differ in cell order")
    for name, df in (("valid", valid), ("latency", latency)):
        if not (df["index"].to_numpy() == np.arange(len(df))).all():
            raise SystemExit(f"{name} CSV: column 'index' is not 0..{len(df) - 1}")

    test = np.full((N_CELLS, 3), np.nan, dtype=np.float32)
    test[cell_order(space, nats["ArchitectureString"], "nats_bench.csv")] = \
        nats[list(NATS_COLUMNS)].to_numpy(np.float32)
    order = cell_order(space, valid["arch"], "nb201_cifar10_valid.csv")
    same = (order == np.arange(N_CELLS)).mean()
    print(f"benchmark index order vs NB201Space.index: {same:.2%} of rows agree "
          "(rows are placed by their parsed cell string)")
    valid_acc = np.full(N_CELLS, np.nan, dtype=np.float32)
    valid_acc[order] = valid["cifar10_valid_200ep"].to_numpy(np.float32)
    devices = [c for c in latency.columns if c not in ("index", "arch")]
    lat = np.full((N_CELLS, len(devices)), np.nan, dtype=np.float32)
    lat[order] = latency[devices].to_numpy(np.float32)
    for name, arr in (("test accuracy", test), ("validation accuracy", valid_acc),
                      ("latency", lat)):
        if np.isnan(arr).any():
            raise SystemExit(f"{name}: table is incomplete")
    if (lat <= 0).any():
        raise SystemExit("latency: non-positive values")
    lat16 = lat.astype(np.float16)
    rel = float(np.max(np.abs(lat16.astype(np.float32) - lat) / lat))
    # The two sources' CIFAR-10 test columns come from different releases of the benchmark.
    diff = np.abs(test[order, 0] - valid["cifar10_test_200ep"].to_numpy(np.float32))
    print(f"CIFAR-10 test accuracy, nats_bench.csv vs nb201_cifar10_valid.csv: "
          f"{int((diff > 0.01).sum())} cells differ by > 0.01 points, max {diff.max():.3f}")
    print(f"read and placed the CSVs in {time.perf_counter() - start:.1f}s")

    t0 = time.perf_counter()
    params, flops, n_groups = network_sizes(space)
    print(f"params/FLOPs: {n_groups} networks per dataset (one per op multiset) in "
          f"{time.perf_counter() - t0:.1f}s")
    t0 = time.perf_counter()
    for idx in random.Random(0).sample(range(N_CELLS), args.verify):
        for d, dataset in enumerate(NETWORKS):
            got = size_of(space, space.from_index(idx), dataset)
            if got != (params[idx, d], flops[idx, d]):
                raise SystemExit(f"cell {idx} ({dataset}): own network {got} != table "
                                 f"{(params[idx, d], flops[idx, d])}")
    print(f"verified {args.verify} random cells against their own networks in "
          f"{time.perf_counter() - t0:.1f}s")
    if params.max() >= 2**31:
        raise SystemExit("params do not fit int32")

    provenance = {
        "index": "NB201Space.index (base-5 op indices, edges 1<-0 2<-0 2<-1 3<-0 3<-1 3<-2)",
        "sources": {p.name: sha256(p) for p in (nats_path, valid_path, latency_path)},
        "network": {"N": space.N, "C": space.C, "inputs": {k: list(v[1]) for k, v in NETWORKS.items()},
                    "classes": {k: v[0] for k, v in NETWORKS.items()},
                    "flops": "frugalnas.ports.cost.count_flops, one sample, forward"},
        "latency_dtype": f"float16, max relative rounding {rel:.2e}",
    }
    args.out.parent.mkdir(parents=True, exist_ok=True)
    np.savez_compressed(
        args.out, test_accuracy=test, valid_accuracy_cifar10=valid_acc,
        latency_ms=lat16, latency_devices=np.array(devices),
        params=params.astype(np.int32), flops=flops, datasets=np.array(list(NETWORKS)),
        columns=np.array(list(NETWORKS)), provenance=np.array(json.dumps(provenance)))
    print(f"wrote {args.out} ({args.out.stat().st_size:,} bytes) in "
          f"{time.perf_counter() - start:.1f}s")


if __name__ == "__main__":
    main()
