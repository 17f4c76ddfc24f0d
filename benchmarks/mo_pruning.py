"""Multi-objective pruning on a training-based study: a multi-objective pruner against no
pruning.

Each run is a frugalnas study that trains every candidate: NB201 cells with one cell per stage
and 8 channels (``--channels``), the ``train`` estimator for ``--epochs`` epochs on ``digits``
(8x8 handwritten digits, 80/20 train/validation split), two objectives: maximise validation
accuracy, minimise parameters. For each seed the same study runs twice, with the pruner
(``--pruner pareto`` or ``pareto-halving`` and its options, ``--option name=value``) and
without one. The strategy is ``random`` by default: its proposals depend only on the seed and
the trial number, and the ``train`` estimator seeds every training with the study's seed, so
both runs of a seed train the same architectures in the same order to the same numbers and
differ only in what pruning stopped.

Reported per run and as means over seeds: the hypervolume of the completed trials' front
(reference point: 50 % accuracy and the parameter count of the largest cell, so the measure is
the area of (accuracy above 50 %) x (parameters saved); printed as a percentage of the box
50 %..100 % x 0..max params), the epochs actually trained (the steps each trial reported; a
pruned trial trained until the step at which it stopped) and the training seconds (start to
end of each trial).

``--replay`` runs no training: it replays the unpruned runs in the cache through the pruner,
trial by trial and step by step, on an in-memory optuna study that holds what a pruned run
would have stored by then. Because the trainings are deterministic this gives the same
decisions as a real pruned run (a few seconds instead of an hour), which is how pruning rules
are compared on development seeds (``--first-seed``) before a real run confirms the chosen one.

``--reference-trials R`` adds the equal-budget reading: the unpruned study's first R trials
set the hypervolume to reach and the compute (their epochs); studies over the same, longer
sequence of ``--trials`` proposals are then cut at ``--compute-fraction`` of that compute,
unpruned (fewer trials) and pruned (more trials, each stopped when unpromising).

    nice -n 10 python benchmarks/mo_pruning.py --cache mop.jsonl --workers 1 \\
        --pruner pareto-halving -o reduction_factor=2       # 3 seeds x 40 trials x 4 epochs
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path
from typing import Any

import numpy as np

from cached_runs import read_cache, run_cached

DIRECTIONS = ("maximize", "minimize")
PRUNERS = ("pareto", "pareto-halving", "pareto-hv")


def largest_params(channels: int) -> int:
    """Parameters of the largest cell (every edge a 3x3 convolution) on digits."""
    from frugalnas.ports.cost import count_params
    from frugalnas.spaces.nb201.space import NB201Space

    space = NB201Space(N=1, C=channels)
    arch = space.parse("|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|nor_conv_3x3~0|"
                       "nor_conv_3x3~1|nor_conv_3x3~2|")
    return count_params(space.build(arch, 10, (1, 8, 8)))


def run_one(job: tuple[int, bool, argparse.Namespace]) -> dict:
    """One study, pruned or not: every trial's state, final values and intermediate vectors."""
    import optuna
    import torch

    import frugalnas
    from frugalnas.ports.keys import INTERMEDIATE_ATTR

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    seed, pruned, args = job
    extra = {"pruner": args.pruner, "pruner_options": args.options} if pruned else {}
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
                     "architecture": str(t.architecture), "intermediate": steps,
                     "epochs": float(max(map(int, steps))) if steps else 0.0,
                     "seconds": (t.datetime_complete - t.datetime_start).total_seconds()})
    return {"seed": seed, "pruned": pruned, "trials": rows, "wall": wall,
            "settings": settings(args, pruned)}


def settings(args: argparse.Namespace, pruned: bool) -> list:
    """What a run depends on (the pruner and its options only matter to pruned runs)."""
    base = [args.trials, args.epochs, args.channels, args.strategy]
    return base + [args.pruner, sorted(args.options.items())] if pruned else base


def replay(run: dict, pruner_name: str, options: dict[str, Any]) -> dict:
    """The pruned run that ``run`` (unpruned) would have been under the pruner: each trial in
    order reports its recorded vectors step by step (the last step is not asked, as in a
    study) until the pruner stops it; the trials before it sit in an in-memory study as
    COMPLETE or PRUNED with the vectors they reported."""
    import optuna

    import frugalnas
    from frugalnas.ports.keys import INTERMEDIATE_ATTR

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    pruner = frugalnas.create_component("pruners", pruner_name, directions=list(DIRECTIONS),
                                        **options)
    study = optuna.create_study(directions=list(DIRECTIONS))
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    rows = []
    for t in sorted(run["trials"], key=lambda t: t["number"]):
        steps = {int(k): v for k, v in t["intermediate"].items()}
        last = max(steps)
        stopped = None
        for step in sorted(steps):
            if step < last and pruner.prune_vector(study, t["number"], step, steps[step]):
                stopped = step
                break
        kept = {str(s): v for s, v in steps.items() if stopped is None or s <= stopped}
        study.add_trial(optuna.trial.create_trial(
            state=optuna.trial.TrialState.PRUNED if stopped else optuna.trial.TrialState.COMPLETE,
            values=None if stopped else t["values"], params={"x": 0.5}, distributions=dist,
            user_attrs={INTERMEDIATE_ATTR: kept}))
        rows.append({**t, "state": "PRUNED" if stopped else "COMPLETE",
                     "epochs": float(stopped or last),
                     "seconds": t["seconds"] * (stopped or last) / last})
    return {**run, "pruned": True, "trials": rows, "replayed": True}


def summary_row(run: dict, ref: tuple[float, float], box: float) -> tuple[float, float, float,
                                                                           int, int, int]:
    """HV %, epochs, seconds, completed, pruned and front size of one run."""
    from frugalnas.multiobjective.hypervolume import hypervolume
    from frugalnas.multiobjective.pareto import pareto_fronts

    complete = [t for t in run["trials"] if t["state"] == "COMPLETE"]
    points = [t["values"] for t in complete]
    hv = 100 * hypervolume(points, ref, DIRECTIONS) / box
    front = sum(f == 1 for f in pareto_fronts(points, DIRECTIONS))
    return (hv, sum(t["epochs"] for t in run["trials"]),
            sum(t["seconds"] for t in run["trials"]), len(complete),
            sum(t["state"] == "PRUNED" for t in run["trials"]), front)


def within_budget(run: dict, budget: float) -> dict:
    """``run`` cut where its trials, in order, have spent ``budget`` epochs: the trials whose
    cumulative epochs stay within it (a trial that would cross it is not counted, as a study
    stopped by a compute budget leaves it unfinished)."""
    kept, spent = [], 0.0
    for t in sorted(run["trials"], key=lambda t: t["number"]):
        if spent + t["epochs"] > budget + 1e-9:
            break
        spent += t["epochs"]
        kept.append(t)
    return {**run, "trials": kept}


def equal_budget_report(done: list[dict], seeds: range, reference_trials: int, fraction: float,
                        ref: tuple[float, float], box: float, pruner: str) -> None:
    """The second reading of "the same hypervolume at a fraction of the compute": the
    unpruned study of ``reference_trials`` trials against studies given ``fraction`` of its
    epochs, unpruned (fewer trials) and pruned (more trials, each stopped when unpromising),
    both drawing from the same longer sequence of proposals."""
    print(f"\nequal budget: no pruning over the first {reference_trials} trials against "
          f"{fraction:g} of its epochs, spent without and with pruning")
    print(f"{'seed':>4s}{'HV ref':>8s}{'epochs':>8s}{'budget':>8s}{'HV none':>9s}{'trials':>7s}"
          f"{'HV ' + pruner:>14s}{'trials':>7s}")
    rows = []
    for seed in seeds:
        runs = {r["pruned"]: r for r in done if r["seed"] == seed}
        if len(runs) < 2:
            continue
        base = {**runs[False], "trials": sorted(runs[False]["trials"],
                                                key=lambda t: t["number"])[:reference_trials]}
        hv_ref, epochs_ref, *_ = summary_row(base, ref, box)
        budget = fraction * epochs_ref
        cut = {p: within_budget(runs[p], budget) for p in (False, True)}
        hv = {p: summary_row(cut[p], ref, box)[0] for p in (False, True)}
        rows.append((hv_ref, hv[False], hv[True]))
        print(f"{seed:4d}{hv_ref:8.2f}{epochs_ref:8.0f}{budget:8.0f}{hv[False]:9.2f}"
              f"{len(cut[False]['trials']):7d}{hv[True]:14.2f}{len(cut[True]['trials']):7d}")
    if rows:
        r = np.array(rows)
        print(f"mean: reference HV {r[:, 0].mean():.2f} %; at {fraction:g} of its epochs no "
              f"pruning {r[:, 1].mean():.2f} % ({r[:, 1].mean() - r[:, 0].mean():+.2f}), "
              f"{pruner} {r[:, 2].mean():.2f} % ({r[:, 2].mean() - r[:, 0].mean():+.2f})")


def parse_option(text: str) -> tuple[str, Any]:
    name, sep, value = text.partition("=")
    if not sep:
        raise SystemExit(f"invalid option {text!r}; expected name=value")
    return name, json.loads(value)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--first-seed", type=int, default=0)
    parser.add_argument("--trials", type=int, default=40)
    parser.add_argument("--epochs", type=int, default=4)
    parser.add_argument("--channels", type=int, default=8)
    parser.add_argument("--strategy", default="random")
    parser.add_argument("--pruner", choices=PRUNERS, default="pareto")
    parser.add_argument("-o", "--option", action="append", default=[],
                        help="pruner option name=value (JSON value), repeatable; "
                             "n_startup_trials defaults to 5")
    parser.add_argument("--unpruned-only", action="store_true",
                        help="run only the unpruned studies (material for --replay)")
    parser.add_argument("--replay", action="store_true",
                        help="train nothing: replay the cached unpruned runs through the pruner")
    parser.add_argument("--reference-trials", type=int, default=None, metavar="R",
                        help="also compare at equal budget: the unpruned study's first R "
                             "trials against --compute-fraction of their epochs spent on the "
                             "--trials proposals, without and with pruning (R < --trials)")
    parser.add_argument("--compute-fraction", type=float, default=0.5)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--cache", type=Path, help="JSON-lines file of finished runs (resume)")
    args = parser.parse_args()
    args.options = {"n_startup_trials": 5, **dict(parse_option(o) for o in args.option)}
    if args.reference_trials is not None and not 0 < args.reference_trials <= args.trials:
        parser.error(f"invalid --reference-trials {args.reference_trials}; valid: 1 to "
                     f"--trials ({args.trials})")
    if not 0 < args.compute_fraction <= 1:
        parser.error(f"invalid --compute-fraction {args.compute_fraction}; valid: (0, 1]")
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    done = [r for r in read_cache(args.cache) if r["settings"] == settings(args, r["pruned"])
            and r["seed"] in seeds]
    have = {(r["seed"], r["pruned"]) for r in done}
    kinds = () if args.replay else (False,) if args.unpruned_only else (True, False)
    jobs = [(s, p, args) for s in seeds for p in kinds if (s, p) not in have]
    done += run_cached(jobs, run_one, workers=args.workers, cache=args.cache,
                       describe=lambda r: f"seed {r['seed']} "
                                          f"{args.pruner if r['pruned'] else 'none'}: "
                                          f"{r['wall']:.0f}s")
    if args.replay:
        done = [r for r in done if not r["pruned"]]
        done += [replay(r, args.pruner, args.options) for r in list(done)]
    pmax = largest_params(args.channels)
    ref, box = (50.0, float(pmax)), 50.0 * pmax
    print(f"digits, NB201 N=1 C={args.channels}, train {args.epochs} epochs, {args.trials} "
          f"trials, strategy {args.strategy}; pruner {args.pruner} {args.options}"
          f"{' (replayed)' if args.replay else ''}; objectives (valid accuracy max, params "
          f"min); HV reference point (50 %, {pmax} params), in % of the box 50..100 % x "
          f"0..{pmax}")
    print(f"{'seed':>4s} {'pruner':15s}{'complete':>9s}{'pruned':>7s}{'front':>6s}{'HV %':>8s}"
          f"{'epochs':>8s}{'seconds':>9s}")
    summary: dict[bool, list[tuple]] = {True: [], False: []}
    for seed in seeds:
        for pruned in (False, True):
            run = next((r for r in done if r["seed"] == seed and r["pruned"] == pruned), None)
            if run is None:
                continue
            hv, epochs, seconds, complete, n_pruned, front = summary_row(run, ref, box)
            summary[pruned].append((hv, epochs, seconds))
            print(f"{seed:4d} {args.pruner if pruned else 'none':15s}{complete:9d}"
                  f"{n_pruned:7d}{front:6d}{hv:8.2f}{epochs:8.0f}{seconds:9.0f}")
    if summary[True] and summary[False]:
        p, u = np.array(summary[True]), np.array(summary[False])
        print(f"mean: no pruning HV {u[:, 0].mean():.2f} %, {u[:, 1].mean():.0f} epochs, "
              f"{u[:, 2].mean():.0f} s; {args.pruner} HV {p[:, 0].mean():.2f} %, "
              f"{p[:, 1].mean():.0f} epochs, {p[:, 2].mean():.0f} s; compute ratio "
              f"{p[:, 1].mean() / u[:, 1].mean():.2f} (epochs), "
              f"{p[:, 2].mean() / u[:, 2].mean():.2f} (seconds); HV difference "
              f"{p[:, 0].mean() - u[:, 0].mean():+.2f} points")
    if args.reference_trials:
        equal_budget_report(done, seeds, args.reference_trials, args.compute_fraction, ref, box,
                            args.pruner)


if __name__ == "__main__":
    main()
