"""Multi-objective pruning on a training-based study: the ``pareto`` pruner against no pruning.

Each run is a frugalnas study that trains every candidate: NB201 cells with one cell per stage
and 8 channels (``--channels``), the ``train`` estimator for ``--epochs`` epochs on ``digits``
(8x8 handwritten digits, 80/20 train/validation split), two objectives: maximise validation
accuracy, minimise parameters. For each seed the same study runs twice, with
``pruner="pareto"`` (n_startup_trials=5, keep_fronts=2, no warm-up steps: a trial may stop
after its first epoch; ``--keep-fronts 1`` is the strict rule) and without a pruner. The strategy is ``random`` by default: its proposals depend only on
the seed and the trial number, so both runs of a seed see the same architectures in the same
order and differ only in what pruning stopped.

Reported per run and as means over seeds: the hypervolume of the completed trials' front
(reference point: 50 % accuracy and the parameter count of the largest cell, so the measure is
the area of (accuracy above 50 %) x (parameters saved); printed as a percentage of the box
50 %..100 % x 0..max params), the epochs actually trained (the steps each trial reported; a
pruned trial trained until the step at which it stopped) and the training seconds (start to
end of each trial).

    nice -n 5 python benchmarks/mo_pruning.py --cache mop.jsonl   # 3 seeds x 40 trials x 4 epochs
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from multiprocessing import Pool
from pathlib import Path

import numpy as np

DIRECTIONS = ("maximize", "minimize")


def largest_params(channels: int) -> int:
    """Parameters of the largest cell (every edge a 3x3 convolution) on digits."""
    from frugalnas.core.cost import count_params
    from frugalnas.spaces.nb201.space import NB201Space

    space = NB201Space(N=1, C=channels)
    arch = space.parse("|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|nor_conv_3x3~0|"
                       "nor_conv_3x3~1|nor_conv_3x3~2|")
    return count_params(space.build(arch, 10, (1, 8, 8)))


def run_one(job: tuple[int, bool, argparse.Namespace]) -> dict:
    import optuna
    import torch

    import frugalnas
    from frugalnas.core.keys import INTERMEDIATE_ATTR

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seed, pruned, args = job
    extra = ({"pruner": "pareto", "pruner_options": {"n_startup_trials": args.startup,
                                                     "keep_fronts": args.keep_fronts}}
             if pruned else {})
    study = frugalnas.create_study(
        space_options={"N": 1, "C": args.channels}, strategy=args.strategy, estimator="train",
        estimator_options={"epochs": args.epochs, "batch_size": 128}, dataset="digits",
        objectives=["value", "params"], directions=list(DIRECTIONS), seed=seed,
        disable_plugins=["mlflow", "progress"], **extra)
    start = time.perf_counter()
    study.optimize(args.trials)
    wall = time.perf_counter() - start
    rows = []
    for t in study.trials:
        steps = t.user_attrs.get(INTERMEDIATE_ATTR) or {}
        rows.append({"number": t.number, "state": t.state.name, "values": t.values,
                     "architecture": str(t.architecture),
                     "epochs": float(max(map(int, steps))) if steps else 0.0,
                     "seconds": (t.datetime_complete - t.datetime_start).total_seconds()})
    return {"seed": seed, "pruned": pruned, "trials": rows, "wall": wall,
            "settings": _settings(args, pruned)}


def _settings(args: argparse.Namespace, pruned: bool) -> list:
    """What a run depends on (the pruner's options only matter to pruned runs)."""
    base = [args.trials, args.epochs, args.channels, args.strategy]
    return base + [args.startup, args.keep_fronts] if pruned else base


def main() -> None:
    from frugalnas.multiobjective.hypervolume import hypervolume

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--strategy", default="random")
    parser.add_argument("--startup", type=int, default=5, help="pareto n_startup_trials")
    parser.add_argument("--keep-fronts", type=int, default=2, help="pareto keep_fronts")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache", type=Path, help="JSON-lines file of finished runs (resume)")
    args = parser.parse_args()
    done: list[dict] = []
    if args.cache and args.cache.exists():
        done = [r for r in (json.loads(x) for x in args.cache.read_text().splitlines() if x)
                if r["settings"] == _settings(args, r["pruned"])]
    have = {(r["seed"], r["pruned"]) for r in done}
    jobs = [(s, p, args) for s in range(args.seeds) for p in (True, False) if (s, p) not in have]
    if jobs:
        with Pool(args.workers) as pool:
            for res in pool.imap_unordered(run_one, jobs, chunksize=1):
                done.append(res)
                if args.cache:
                    with args.cache.open("a") as fh:
                        fh.write(json.dumps(res) + "\n")
                print(f"  seed {res['seed']} {'pareto' if res['pruned'] else 'none'}: "
                      f"{res['wall']:.0f}s", file=sys.stderr, flush=True)
    pmax = largest_params(args.channels)
    ref = (50.0, float(pmax))
    box = 50.0 * pmax
    print(f"digits, NB201 N=1 C={args.channels}, train {args.epochs} epochs, {args.trials} "
          f"trials, strategy {args.strategy}; pareto n_startup_trials={args.startup}, "
          f"keep_fronts={args.keep_fronts}; objectives (valid accuracy max, params min); "
          f"HV reference point (50 %, {pmax} params), in % of the box 50..100 % x 0..{pmax}")
    print(f"{'seed':>4s} {'pruner':8s}{'complete':>9s}{'pruned':>7s}{'front':>6s}{'HV %':>8s}"
          f"{'epochs':>8s}{'seconds':>9s}")
    summary: dict[bool, list[tuple[float, float, float]]] = {True: [], False: []}
    for seed in range(args.seeds):
        for pruned in (False, True):
            run = next((r for r in done if r["seed"] == seed and r["pruned"] == pruned), None)
            if run is None:
                continue
            complete = [t for t in run["trials"] if t["state"] == "COMPLETE"]
            points = [t["values"] for t in complete]
            hv = 100 * hypervolume(points, ref, DIRECTIONS) / box
            front = [p for p in points if not any(q[0] >= p[0] and q[1] <= p[1] and q != p
                                                   for q in points)]
            epochs = sum(t["epochs"] for t in run["trials"])
            seconds = sum(t["seconds"] for t in run["trials"])
            n_pruned = sum(t["state"] == "PRUNED" for t in run["trials"])
            summary[pruned].append((hv, epochs, seconds))
            print(f"{seed:4d} {'pareto' if pruned else 'none':8s}{len(complete):9d}"
                  f"{n_pruned:7d}{len(front):6d}{hv:8.2f}{epochs:8.0f}{seconds:9.0f}")
    if summary[True] and summary[False]:
        p, u = np.array(summary[True]), np.array(summary[False])
        print(f"mean: no pruning HV {u[:, 0].mean():.2f} %, {u[:, 1].mean():.0f} epochs, "
              f"{u[:, 2].mean():.0f} s; pareto HV {p[:, 0].mean():.2f} %, "
              f"{p[:, 1].mean():.0f} epochs, {p[:, 2].mean():.0f} s; compute ratio "
              f"{p[:, 1].mean() / u[:, 1].mean():.2f} (epochs), "
              f"{p[:, 2].mean() / u[:, 2].mean():.2f} (seconds); HV difference "
              f"{p[:, 0].mean() - u[:, 0].mean():+.2f} points")


if __name__ == "__main__":
    main()
