"""Train a fixed sample of cells stand-alone (several seeds each) and pack the result into the
ground-truth file frugalnas ships.

The sample is fixed by ``--sample-seed`` (distinct architectures drawn in order, so any prefix
is a random sample); the data split is fixed (dataset seed 0); each (cell, seed) trains from
scratch with the same budget. Results are appended, one JSON line per (cell, seed), to a cache
(default ``benchmarks/results/ground_truth/<name>.jsonl``, committed with the repository), so a
run cut short by ``--budget``, a kill or a time limit resumes where it stopped, from any
machine. When every (cell, seed) is done, ``--pack`` writes
``benchmarks/frugalnas_lab/references/<name>.json`` (accuracies to 3 decimals, the command and seeds).
Spaces: ``nb201`` and ``dag`` cells (``--N``, ``--C``, ``--nodes``, ``--reductions``) and
``mobilenet`` networks (``--width``: the width multiplier; ``--resolutions``: searched input
sides; ``--resize 0`` keeps 28x28 MNIST). ``--dataset`` names any registered dataset and
``--dataset-options`` its options (JSON), checked before the first training.

    python benchmarks/ground_truth.py --name nb201-mnist5k --space nb201 --N 1 --C 8 \\
        --cells 100 --seeds 0,1 --epochs 2 --resize 16 --workers 2 --budget 3000 --pack
    python benchmarks/ground_truth.py --name mobilenet-mnist5k --space mobilenet --width 0.35 \\
        --resize 0 --cells 50 --seeds 0,1 --epochs 2 --workers 1 --budget 3000 --pack
    python benchmarks/ground_truth.py --name mobilenet-cluttered --space mobilenet --width 0.35 \\
        --dataset cluttered-mnist --dataset-options '{"size": 28, "clutter": 6}' --resize 0 \\
        --cells 50 --seeds 0,1,2,3 --epochs 3 --workers 2 --pack
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shlex
import sys
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
RESULTS = REPO / "benchmarks" / "results" / "ground_truth"
SHIPPED = REPO / "benchmarks" / "frugalnas_lab" / "references"


def space_options(args: argparse.Namespace) -> dict[str, Any]:
    if args.space == "nb201":
        return {"N": args.N, "C": args.C}
    if args.space == "mobilenet":
        return {"width_mult": args.width,
                **({"resolutions": [int(r) for r in args.resolutions.split(",")]}
                   if args.resolutions else {})}
    return {"nodes": args.nodes, "channels": args.C, "reductions": args.reductions}


def sample_cells(args: argparse.Namespace) -> list[str]:
    from frugalnas.host.plugins import PluginHost

    space = PluginHost().create("search_spaces", args.space, **space_options(args))
    rng = random.Random(args.sample_seed)
    seen: dict[str, None] = {}
    for _ in range(args.cells * 100):
        seen.setdefault(str(space.sample(rng)), None)
        if len(seen) == args.cells:
            break
    return list(seen)


def read_cache(path: Path) -> dict[tuple[str, int], dict[str, Any]]:
    done: dict[tuple[str, int], dict[str, Any]] = {}
    if path.exists():
        for line in path.read_text().splitlines():
            try:
                row = json.loads(line)
            except json.JSONDecodeError:  # a line cut short by a kill: trained again
                continue
            done[(row["arch"], int(row["seed"]))] = row
    return done


def _work(job: dict[str, Any]) -> dict[str, Any]:
    import torch

    torch.set_num_threads(job["threads"])
    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.host.plugins import PluginHost
    from frugalnas.engine.training import TrainConfig
    from frugalnas_lab.ground_truth import train_stand_alone

    host = PluginHost()
    space = host.create("search_spaces", job["space"], **job["space_options"])
    dataset = host.create("datasets", job["dataset"], seed=0, **job["dataset_options"],
                          **({"resize": job["resize"]} if job["resize"] else {}))
    cfg = TrainConfig(epochs=job["epochs"], batch_size=job["batch_size"], lr=job["lr"])
    out = train_stand_alone(space, space.parse(job["arch"]), dataset, SingleDeviceBackend(),
                            cfg, job["seed"])
    return {"arch": job["arch"], "seed": job["seed"], **out}


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--name", required=True, help="ground-truth name (file names)")
    p.add_argument("--space", choices=("nb201", "dag", "mobilenet"), default="nb201")
    p.add_argument("--N", type=int, default=1)
    p.add_argument("--C", type=int, default=8)
    p.add_argument("--nodes", type=int, default=4)
    p.add_argument("--reductions", type=int, default=1)
    p.add_argument("--width", type=float, default=0.35, help="mobilenet: width multiplier")
    p.add_argument("--resolutions", default=None,
                   help="mobilenet: searched input sides, comma-separated (e.g. 16,20,24,28)")
    p.add_argument("--dataset", default="mnist5k")
    p.add_argument("--dataset-options", type=json.loads, default={},
                   help='the dataset\'s options as JSON, e.g. \'{"size": 32, "clutter": 4}\'')
    p.add_argument("--resize", type=int, default=16, help="image side (0: as stored)")
    p.add_argument("--cells", type=int, default=100)
    p.add_argument("--sample-seed", type=int, default=0)
    p.add_argument("--seeds", default="0,1")
    p.add_argument("--epochs", type=float, default=3.0)
    p.add_argument("--batch-size", type=int, default=64)
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--threads", type=int, default=1, help="torch threads per worker")
    p.add_argument("--budget", type=float, default=None, help="stop submitting after S seconds")
    p.add_argument("--cache", type=Path, default=None)
    p.add_argument("--pack", action="store_true", help="write the shipped JSON when complete")
    args = p.parse_args()

    seeds = [int(s) for s in args.seeds.split(",")]
    cache = args.cache or RESULTS / f"{args.name}.jsonl"
    from frugalnas.ports.errors import FrugalnasError

    try:
        cells = sample_cells(args)
        from frugalnas.host.plugins import PluginHost

        PluginHost().create("datasets", args.dataset, seed=0, **args.dataset_options,
                            **({"resize": args.resize} if args.resize else {}))
    except FrugalnasError as exc:  # a bad space or dataset option: one line, nothing written
        print(f"frugalnas: error: {exc}", file=sys.stderr)
        return 2
    cache.parent.mkdir(parents=True, exist_ok=True)
    done = read_cache(cache)
    todo = [(a, s) for a in cells for s in seeds if (a, s) not in done]
    print(f"{args.name}: {len(cells)} cells x {len(seeds)} seeds; {len(done)} done, "
          f"{len(todo)} to train; cache {cache}", flush=True)
    common = {"space": args.space, "space_options": space_options(args), "dataset": args.dataset,
              "dataset_options": args.dataset_options, "epochs": args.epochs,
              "batch_size": args.batch_size, "lr": args.lr, "threads": args.threads,
              "resize": args.resize}
    start = time.monotonic()
    if todo:
        with ProcessPoolExecutor(args.workers) as pool, open(cache, "a") as out:
            pending = set()
            queue = list(todo)
            while queue or pending:
                while queue and len(pending) < args.workers and (
                        args.budget is None or time.monotonic() - start < args.budget):
                    arch, seed = queue.pop(0)
                    pending.add(pool.submit(_work, {**common, "arch": arch, "seed": seed}))
                if not pending:
                    break
                future = next(as_completed(pending))
                pending.discard(future)
                row = future.result()
                out.write(json.dumps(row) + "\n")
                out.flush()
                os.fsync(out.fileno())
                done[(row["arch"], row["seed"])] = row
                print(f"  [{len(done)}/{len(cells) * len(seeds)}] seed {row['seed']} valid "
                      f"{row['valid']:.2f} test {row.get('test', float('nan')):.2f} "
                      f"({row['seconds']:.1f} s) {row['arch']}", flush=True)
    complete = all((a, s) in done for a in cells for s in seeds)
    print(f"{sum((a, s) in done for a in cells for s in seeds)} of {len(cells) * len(seeds)} "
          f"trained ({time.monotonic() - start:.0f} s this run)")
    rows = [a for a in cells if all((a, s) in done for s in seeds)]
    if len(rows) >= 3 and len(seeds) >= 2:
        from frugalnas_lab.ground_truth import GroundTruth

        gt = GroundTruth(args.name, args.space, space_options(args), args.dataset, args.epochs,
                         seeds, rows, np.array([[done[(a, s)]["valid"] for s in seeds] for a in rows]),
                         np.array([[done[(a, s)].get("test", np.nan) for s in seeds] for a in rows]),
                         dataset_options=args.dataset_options, resize=args.resize or 0)
        print(f"cells with every seed: {len(rows)}; seed-to-seed Kendall tau (the ceiling): "
              f"{gt.tau_ceiling():.3f}; mean valid {gt.mean_valid.mean():.2f} %")
        if args.pack:
            if not complete:
                print("not packed: some (cell, seed) pairs are still missing", file=sys.stderr)
                return 1
            gt.command = "python benchmarks/ground_truth.py " + shlex.join(sys.argv[1:])
            SHIPPED.mkdir(parents=True, exist_ok=True)
            (SHIPPED / f"{args.name}.json").write_text(json.dumps(gt.to_json(), separators=(",", ":")))
            print(f"packed {SHIPPED / (args.name + '.json')}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
