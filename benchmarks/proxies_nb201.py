"""Zero-cost proxies on NAS-Bench-201: rank correlation with test accuracy, and cost.

For a seeded sample of NB201 cells, builds each benchmark-size network (N=5, C=16, 32x32
input), scores it with every registered proxy on one fixed batch, and prints Spearman and
Kendall tau against the NB201 test accuracies (CIFAR-10, CIFAR-100, ImageNet16-120), plus
each proxy's time per cell as a ratio to one plain forward+backward of the same network
(cross-entropy, batch 64), measured side by side. Rows for the rank ensemble (equal
weights) and the learned ensemble (weights fitted on a labelled 10% of the cells, scored on
the rest) follow.

Results go to a JSON-lines cache, so a long run can be split in chunks:

    python benchmarks/proxies_nb201.py --n 200 --cache /tmp/proxies.jsonl
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import kendalltau, spearmanr

from frugalnas.core.plugins import get_host
from frugalnas.spaces.nb201.table import TABLE_DATASETS, nb201_table
from frugalnas.proxies.ensemble import fit_weights, rank_average
from frugalnas.spaces.nb201.space import NB201Space

ENSEMBLE = ("synflow", "naswot", "jacob_cov", "params")


def fixed_batch(data: str, batch_size: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of 32x32, 3-channel, 10-class images: offline digits/mnist5k, or noise."""
    if data == "gaussian":
        g = torch.Generator().manual_seed(seed)
        return torch.randn(batch_size, 3, 32, 32, generator=g), torch.randint(0, 10, (batch_size,), generator=g)
    ds = get_host().create("datasets", data, seed=seed, resize=32)
    x, y = ds.fixed_batch(batch_size, seed=seed)
    return x.expand(-1, 3, -1, -1).contiguous(), y


def plain_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Seconds of one forward+backward (the cost unit)."""
    start = time.perf_counter()
    F.cross_entropy(model(x), y).backward()
    elapsed = time.perf_counter() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def score_cell(index: int, names: list[str], x: torch.Tensor, y: torch.Tensor,
               seed: int, timing: bool = True, N: int = 5, C: int = 16, repeat: int = 1) -> dict:
    host, space = get_host(), NB201Space(N=N, C=C)
    arch = space.from_index(index)
    torch.manual_seed(seed)
    model = space.build(arch, 10, (3, 32, 32))
    row = {"index": index, "base_s": float("nan"), "values": {}, "seconds": {}, "base": {}}
    if timing:
        plain_step(model, x, y)  # warm-up, not timed
    for name in names:
        proxy = host.create("proxies", name)
        times, bases = [], []
        for _ in range(repeat):
            # the reference pass right before the proxy: both see the same machine load
            if timing:
                bases.append(plain_step(model, x, y))
            start = time.perf_counter()
            row["values"][name] = proxy.score(model, x, y)
            times.append(time.perf_counter() - start)
        row["seconds"][name] = min(times)  # the fastest of `repeat` runs: less noise
        if timing:
            row["base"][name] = min(bases)
    if timing:
        row["base_s"] = float(np.median(list(row["base"].values())))
    return row


def load_cache(path: Path | None) -> dict[int, dict]:
    if path is None or not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {r["index"]: r for r in rows}


def correlations(score: np.ndarray, acc: np.ndarray) -> list[float]:
    out = []
    for j in range(acc.shape[1]):
        out.append(spearmanr(score, acc[:, j]).statistic)
        out.append(kendalltau(score, acc[:, j]).statistic)
    return out


def _median_ratio(seconds: np.ndarray, base: np.ndarray) -> str:
    """Median over cells of proxy time / forward+backward time ("-" when not timed)."""
    ok = np.isfinite(base)
    return f"{np.median(seconds[ok] / base[ok]):6.2f}x" if ok.any() else "     -"


def report(rows: list[dict], names: list[str], label_fraction: float, seed: int) -> None:
    acc = nb201_table()[[r["index"] for r in rows]]
    base = np.array([r["base_s"] for r in rows])
    head = "".join(f" {d[:8]:>8} rho {'':>3} tau" for d in TABLE_DATASETS)
    print(f"n = {len(rows)} cells\n{'proxy':<18}{head}   cost/fwd+bwd")
    matrix = np.array([[r["values"][n] for n in names] for r in rows])
    for j, name in enumerate(names):
        ratio = _median_ratio(np.array([r["seconds"][name] for r in rows]),
                              np.array([r.get("base", {}).get(name, r["base_s"]) for r in rows]))
        cells = " ".join(f"{v:8.3f} {w:7.3f}" for v, w in zip(*[iter(correlations(matrix[:, j], acc))] * 2))
        print(f"{name:<18} {cells}   {ratio}")
    members = [n for n in ENSEMBLE if n in names]
    if len(members) < 2:
        return
    cols = [names.index(n) for n in members]
    ens_cost = _median_ratio(sum(np.array([r["seconds"][n] for r in rows]) for n in members), base)
    ens = rank_average(matrix[:, cols])
    cells = " ".join(f"{v:8.3f} {w:7.3f}" for v, w in zip(*[iter(correlations(ens, acc))] * 2))
    print(f"{'rank-ensemble':<18} {cells}   {ens_cost}   ({'+'.join(members)})")
    # learned: weights from a labelled subset (CIFAR-10 accuracy), scored on the others
    rng = np.random.default_rng(seed)
    labelled = rng.random(len(rows)) < label_fraction
    if labelled.sum() >= 5 and (~labelled).sum() >= 5:
        w = fit_weights(matrix[labelled][:, cols], acc[labelled, 0])
        learned = rank_average(matrix[~labelled][:, cols], w)
        cells = " ".join(f"{v:8.3f} {u:7.3f}" for v, u in
                         zip(*[iter(correlations(learned, acc[~labelled]))] * 2))
        print(f"{'learned-ensemble':<18} {cells}   {ens_cost}   "
              f"(weights {np.round(w, 2).tolist()} from {int(labelled.sum())} labelled cells, "
              f"scored on {int((~labelled).sum())})")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="cells to sample (default 1000)")
    ap.add_argument("--all", action="store_true", help="every one of the 15,625 cells")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="mnist5k", choices=("mnist5k", "digits", "gaussian"))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--proxies", default=None, help="comma-separated (default: all registered)")
    ap.add_argument("--cache", type=Path, default=None, help="JSON-lines cache to resume from")
    ap.add_argument("--budget", type=float, default=None,
                    help="stop scoring new cells after this many seconds")
    ap.add_argument("--label-fraction", type=float, default=0.1,
                    help="share of cells whose accuracy the learned ensemble sees")
    ap.add_argument("--no-timing", action="store_true",
                    help="skip the forward+backward reference (saves 3 passes per cell)")
    ap.add_argument("--repeat", type=int, default=1,
                    help="time each proxy this many times and keep the fastest")
    ap.add_argument("--N", type=int, default=5, help="cells per stage (benchmark: 5)")
    ap.add_argument("--C", type=int, default=16, help="stem channels (benchmark: 16)")
    ap.add_argument("--threads", type=int, default=None)
    args = ap.parse_args()
    if args.threads:
        torch.set_num_threads(args.threads)
    names = args.proxies.split(",") if args.proxies else get_host().registry("proxies").names()
    indices = list(range(15625))
    if not args.all:
        indices = random.Random(args.seed).sample(indices, args.n)  # random order: a budget cut stays a random sample
    x, y = fixed_batch(args.data, args.batch_size, args.seed)
    cache = load_cache(args.cache)
    start = time.perf_counter()
    for i, index in enumerate(indices):
        if index in cache and all(n in cache[index]["values"] for n in names):
            continue
        if args.budget is not None and time.perf_counter() - start > args.budget:
            print(f"budget reached after {i} cells")
            break
        row = score_cell(index, names, x, y, args.seed, timing=not args.no_timing,
                         N=args.N, C=args.C, repeat=args.repeat)
        cache[index] = row
        if args.cache is not None:
            with args.cache.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
    rows = [cache[i] for i in indices if i in cache and all(n in cache[i]["values"] for n in names)]
    print(f"N={args.N} C={args.C} data={args.data} batch={args.batch_size} seed={args.seed} "
          f"threads={torch.get_num_threads()} scoring time {time.perf_counter() - start:.0f}s")
    report(rows, names, args.label_fraction, args.seed)


if __name__ == "__main__":
    main()
