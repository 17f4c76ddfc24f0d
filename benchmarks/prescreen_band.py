"""How well a pre-screen's proxies rank NB201 cells inside a latency band.

Reads the shipped proxy scores of the NB201 proxy benchmark (``benchmarks/results/proxies_nb201``:
1,000 cells, N=5, C=16, a 32x32 MNIST batch of 64) and keeps the cells that meet the
``latency_ms_<device> <= bound`` constraint. For ``synflow`` and the ``selected`` preset
(its members ranked together) it prints Kendall tau against CIFAR-10 test accuracy and the mean
test accuracy of the cell each keeps from ``k`` random feasible cells (the pre-screen's choice,
``--draws`` draws), next to an oracle's. With ``--rescore N`` the first N feasible cells are
scored again at the pre-screen's size (``--net-N``, ``--net-C``, the shipped batch resized to
``--resolution``), with the seconds per cell.

    python benchmarks/prescreen_band.py --rescore 200 --net-N 1 --net-C 8 --resolution 16
"""

from __future__ import annotations

import argparse
import gzip
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau

from frugalnas.host.plugins import get_host
from frugalnas.proxies.base import score_with
from frugalnas.proxies.ensemble import MEMBER_PRESETS, rank_average
from frugalnas.proxies.shared import SharedPasses
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.spaces.nb201.table import nb201_data

SHIPPED = Path(__file__).resolve().parent / "results" / "proxies_nb201"


def shipped_scores() -> dict[str, dict[str, float]]:
    """cell string -> {proxy name: value} from the shipped score file."""
    scores: dict[str, dict[str, float]] = {}
    with gzip.open(SHIPPED / "proxy_scores.jsonl.gz", "rt") as fh:
        for line in fh:
            row = json.loads(line)
            scores.setdefault(row["arch"], {})[row["name"]] = row["value"]
    return scores


def pick_of_k(score: np.ndarray, acc: np.ndarray, k: int, draws: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    picks = [acc[g[np.argmax(score[g])]] for g in
             (rng.choice(len(acc), size=k, replace=False) for _ in range(draws))]
    return float(np.mean(picks))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="pixel3")
    ap.add_argument("--bound", type=float, default=10.0)
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--draws", type=int, default=3000)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--rescore", type=int, default=0)
    ap.add_argument("--net-N", type=int, default=1)
    ap.add_argument("--net-C", type=int, default=8)
    ap.add_argument("--resolution", type=int, default=16)
    args = ap.parse_args()
    torch.set_num_threads(1)
    table = nb201_data()
    space = NB201Space()
    latency = table.latency(args.device)
    test = table.test_accuracy[:, 0]
    scores = shipped_scores()
    members = list(MEMBER_PRESETS["selected"])
    cells = [c for c in sorted(scores)
             if latency[space.index(space.parse(c))] <= args.bound]
    acc = np.array([test[space.index(space.parse(c))] for c in cells])
    print(f"{len(cells)} of {len(scores)} shipped cells meet latency_ms_{args.device} <= "
          f"{args.bound:g}; pick of {args.k}, {args.draws} draws")
    columns = {"synflow": np.array([scores[c]["synflow"] for c in cells]),
               "selected": rank_average(np.array([[scores[c][m] for m in members] for c in cells]))}
    for name, score in columns.items():
        print(f"{name:<10} tau {kendalltau(score, acc)[0]:.3f}  pick-of-{args.k} "
              f"{pick_of_k(score, acc, args.k, args.draws, args.seed):.2f} %")
    print(f"{'oracle':<10}           pick-of-{args.k} "
          f"{pick_of_k(acc, acc, args.k, args.draws, args.seed):.2f} %")
    if not args.rescore:
        return
    batch = torch.load(SHIPPED / "batch_mnist5k_64_seed0.pt")
    x, y = batch["x"], batch["y"]
    if args.resolution != x.shape[-1]:
        x = torch.nn.functional.interpolate(x, size=(args.resolution, args.resolution),
                                            mode="bilinear", align_corners=False)
    host = get_host()
    proxies = [host.create("proxies", m) for m in members]
    small = NB201Space(N=args.net_N, C=args.net_C)
    chosen, start, rows = cells[:args.rescore], time.perf_counter(), []
    for cell in chosen:
        torch.manual_seed(args.seed)
        model = small.build(small.parse(cell), 10, tuple(x.shape[1:]))
        shared = SharedPasses(model, x, y)
        rows.append([score_with(p, model, x, y, shared) for p in proxies])
    seconds = (time.perf_counter() - start) / len(chosen)
    matrix, sub = np.array(rows), acc[:len(chosen)]
    taus = ", ".join(f"{m} {kendalltau(matrix[:, j], sub)[0]:.3f}" for j, m in enumerate(members))
    print(f"rescored {len(chosen)} cells at N={args.net_N}, C={args.net_C}, "
          f"{args.resolution}x{args.resolution}: {seconds:.3f} s a cell; selected tau "
          f"{kendalltau(rank_average(matrix), sub)[0]:.3f} ({taus})")


if __name__ == "__main__":
    main()
