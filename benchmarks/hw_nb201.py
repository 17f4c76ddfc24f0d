"""Hardware-aware search on the NAS-Bench-201 table: CIFAR-10 accuracy against inference
latency on a Pixel 3 phone (``latency_ms_pixel3``, HW-NAS-Bench / HELP data).

Two experiments, each ``--queries`` table look-ups per run for ``--seeds`` seeds, every run a
real frugalnas study (``nb201-table`` estimator, in-memory storage):

* **mo** -- two objectives: maximise CIFAR-10 validation accuracy (the benchmark's selection
  metric), minimise Pixel 3 latency. For each strategy that handles two objectives the table
  prints the hypervolume of the front found after 100 and 200 queries (``MO_MARKS`` up to
  ``--queries``) as a ratio to the hypervolume of the whole table's front (mean +- std over
  seeds), on (validation accuracy, latency) -- what the search saw -- and, at the last mark,
  on (test accuracy, latency) of the same cells against the table's test front. Reference
  point: (80 % accuracy, 40 ms): every cell is faster than 40 ms (the slowest takes 36.8 ms),
  and the floor of 80 % keeps the cheap cells (10 % accuracy at 0.01 ms) from dominating the
  measure. Strategies: ``nsga2``, ``nsga3`` and ``tpe`` (optuna's multi-objective samplers),
  ``random``, frugalnas's ``regularized-evolution``, ``local-search`` and
  ``surrogate-evolution``, which rank trials by non-dominated rank and crowding distance
  (NSGA-II's order) when a study has several objectives, and ``mo-evolution`` (regularized
  evolution with an elitist archive); ``mo-evolution:screened`` screens 3 children by
  expected hypervolume improvement with the benchmark's reference point, and
  ``surrogate-evolution:ref`` screens its children by expected hypervolume improvement with
  that reference point, the latency known before evaluation and accuracy from the surrogate
  (``:ref-blind``: the latency withheld too, so the surrogate predicts both).
* **constrained** -- one objective (validation accuracy; ``--select-on test``: test accuracy)
  with the constraint ``latency_ms_pixel3 <= 10``; ``constrained:<set>`` runs another
  constraint set of ``CONSTRAINT_SETS`` (``pixel3+params``: also ``params <= 500000``;
  ``raspi4``: ``latency_ms_raspi4 <= 25``, 45.9 % of the cells feasible against 46.1 % for
  pixel3 <= 10). Per strategy: the mean regret of the study's ``best_trial`` (the best
  *feasible* trial) after 25, 50, 100 queries -- the feasible optimum of the selection metric
  minus the selected cell's value --, its mean test accuracy at the last mark, the fraction of
  feasible trials, and how often the best trial was infeasible (must be 0). The
  ``nb201-table`` estimator knows the latency and size columns before evaluating
  (``known_metrics``), so frugalnas's strategies propose only feasible cells. ``prescreen``
  runs with its defaults (synflow over ``random``, ``k=10``, benchmark-size networks, N=5 and
  C=16, on a batch of 64 of the study's default dataset, 8x8 digits) and chooses among the
  candidates its inner strategy calls feasible.

``--cache FILE`` keeps finished runs (JSON lines), so an interrupted run resumes. A strategy
named ``<strategy>:deb`` runs without the constraint model
(``constraint_model=False, violation_penalty=inf``: no screening of candidates, every infeasible
trial ranked below every feasible one).

    nice -n 10 python benchmarks/hw_nb201.py --cache hw.jsonl --workers 1
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from cached_runs import read_cache, run_cached

DEVICE = "pixel3"
METRIC = f"latency_ms_{DEVICE}"
BOUND = 10.0
#: The constraint sets of the constrained experiments: ``constrained`` runs ``pixel3``,
#: ``constrained:<name>`` the others.
CONSTRAINT_SETS = {"pixel3": {METRIC: BOUND},
                   "pixel3+params": {METRIC: BOUND, "params": 500_000.0},
                   "raspi4": {"latency_ms_raspi4": 25.0}}
REFERENCE = (80.0, 40.0)
DIRECTIONS = ("maximize", "minimize")
MO_STRATEGIES = ("nsga2", "nsga3", "tpe", "random", "regularized-evolution", "local-search",
                 "surrogate-evolution", "mo-evolution", "mo-evolution:screened",
                 "surrogate-evolution:ref", "surrogate-evolution:ref-blind", "bananas",
                 "bananas:ref")
#: Query counts of the two-objective table.
MO_MARKS = (100, 200)
CONSTRAINED_STRATEGIES = ("random", "regularized-evolution", "local-search",
                          "surrogate-evolution", "bananas", "tpe", "prescreen")
#: Options used here (light surrogates, as in benchmarks/search_nb201.py).
OPTIONS = {
    "surrogate-evolution": {"quality_every": 0,
                            "surrogate_options": {"n_models": 3, "n_estimators": 100}},
    "bananas": {"quality_every": 0, "surrogate_options": {"epochs": 100}},
    "nsga2": {"population_size": 20},
    "nsga3": {"population_size": 20},
}
MARKS = (25, 50, 100)
#: ``<strategy>:<variant>`` runs the strategy with these extra options. ``deb``: constraint
#: handling without the constraint model (no screening of candidates, every infeasible trial
#: ranked below every feasible one), to compare with and without it on the same code.
#: ``rea`` (``prescreen`` only): the pre-screen of benchmarks/search_nb201.py, synflow over
#: regularized evolution on reduced networks (N=1, C=8; 16x16 Gaussian inputs, batch 8).
#: ``rea-selected`` (``prescreen`` only): the ``selected`` proxy preset (meco, swap, synflow,
#: ntk_cond, ranked together) over regularized evolution, on the same reduced networks and a
#: batch of 64 mnist5k digits resized to 16x16 (these proxies read the data).
VARIANTS = {"deb": {"constraint_model": False, "violation_penalty": float("inf")},
            "screened": {"n_candidates": 3, "reference_point": list(REFERENCE)},
            "rea": {"inner": "regularized-evolution", "data": "gaussian", "batch_size": 8,
                    "input_shape": (3, 16, 16)},
            "rea-selected": {"inner": "regularized-evolution", "proxy": "selected",
                             "dataset": "mnist5k", "dataset_options": {"resize": 16},
                             "batch_size": 64},
            "ref": {"reference_point": list(REFERENCE)},
            "ref-blind": {"reference_point": list(REFERENCE)},
            "blind": {}}
#: Estimator options of a variant. ``blind`` and ``ref-blind``: the table withholds its
#: latencies and sizes until a cell is evaluated (``known_hardware=False``), so the strategies learn feasibility
#: (the constraint model) instead of knowing it.
ESTIMATOR_VARIANTS = {"blind": {"known_hardware": False},
                      "ref-blind": {"known_hardware": False}}
#: Space options per benchmark name: the table is indexed by the cell alone, so N and C only
#: matter where a network is built (the pre-screen's proxy). The table refuses a network other
#: than the benchmark's unless told ``any_network=True`` (each cell scored as in the benchmark
#: network, the same values as without the option), which these names pass.
SPACE_OPTIONS = {"prescreen:rea": {"N": 1, "C": 8}, "prescreen:rea-selected": {"N": 1, "C": 8}}


def strategy_options(name: str) -> tuple[str, dict]:
    """The strategy and its options for a benchmark name ``<strategy>[:<variant>]``."""
    base, _, variant = name.partition(":")
    if variant and variant not in VARIANTS:
        raise SystemExit(f"unknown variant {variant!r} in {name!r}; valid: {', '.join(VARIANTS)}")
    return base, {**OPTIONS.get(base, {}), **VARIANTS.get(variant, {})}


def run_one(job: tuple[str, str, int, int, str]) -> dict:
    """One study: the cells it evaluated (in order) with their numbers, and its best trial(s)
    after each mark."""
    import optuna
    import torch

    import frugalnas
    from frugalnas.spaces.nb201.space import NB201Space

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    experiment, name, seed, queries, select_on = job
    space = NB201Space()
    strategy, options = strategy_options(name)
    space_options = SPACE_OPTIONS.get(name, {})
    common = dict(strategy=strategy, estimator="nb201-table", seed=seed,
                  space_options=space_options,
                  strategy_options=options, disable_plugins=["mlflow", "progress"],
                  estimator_options={"dataset": "cifar10", "select_on": select_on,
                                     **ESTIMATOR_VARIANTS.get(name.partition(":")[2], {}),
                                     **({"any_network": True} if space_options else {})})
    if experiment == "mo":
        study = frugalnas.create_study(objectives=["value", METRIC], directions=list(DIRECTIONS),
                                       **common)
    else:
        study = frugalnas.create_study(constraints=constraint_set(experiment), **common)
    start = time.perf_counter()
    best: dict[int, list[int]] = {}
    done = 0
    marks = sorted({m for m in MARKS + (MO_MARKS if experiment == "mo" else ()) if m <= queries}
                   | {queries})
    for mark in marks:
        study.optimize(n_trials=mark - done)
        done = mark
        if experiment == "mo":
            best[mark] = [t.number for t in study.best_trials]
        else:
            try:
                best[mark] = [study.best_trial.number]
            except ValueError:  # no feasible trial yet
                best[mark] = []
    seconds = time.perf_counter() - start
    trials = sorted(study.trials, key=lambda t: t.number)
    return {"experiment": experiment, "strategy": name, "seed": seed, "queries": queries,
            "select_on": select_on, "seconds": seconds,
            "cells": [space.index(space.parse(str(t.architecture))) for t in trials],
            "feasible": [bool(t.user_attrs.get("feasible", True)) for t in trials],
            "best": {str(k): v for k, v in best.items()}}


def constraint_set(experiment: str) -> dict[str, float]:
    """The constraints of ``constrained`` / ``constrained:<set>``."""
    name = experiment.partition(":")[2] or "pixel3"
    if name not in CONSTRAINT_SETS:
        raise SystemExit(f"unknown constraint set {name!r} in {experiment!r}; valid: "
                         f"{', '.join(CONSTRAINT_SETS)}")
    return CONSTRAINT_SETS[name]


def feasible_cells(constraints: dict[str, float]) -> np.ndarray:
    """Which cells of the table meet ``constraints`` (CIFAR-10 network sizes)."""
    from frugalnas.spaces.nb201.table import nb201_data

    data = nb201_data()
    ok = np.ones(len(data.valid_accuracy_cifar10), dtype=bool)
    for name, bound in constraints.items():
        column = data.params[:, 0] if name == "params" else \
            data.latency(name.removeprefix("latency_ms_"))
        ok &= column <= bound
    return ok


def constrained_tables(done: list[dict], args: argparse.Namespace) -> None:
    """Per constraint set and selection protocol: regret of the best feasible trial."""
    from frugalnas.spaces.nb201.table import nb201_data

    data = nb201_data()
    valid, test = data.valid_accuracy_cifar10, data.test_accuracy[:, 0]
    marks = [m for m in MARKS if m <= args.queries]
    for experiment in [e for e in args.experiments if e.startswith("constrained")]:
        constraints = constraint_set(experiment)
        feasible = feasible_cells(constraints)
        for select_on in args.select_on:
            score = valid if select_on == "valid" else test
            oracle = int(np.flatnonzero(feasible)[np.argmax(score[feasible])])
            bounds = " and ".join(f"{k} <= {v:g}" for k, v in constraints.items())
            print(f"\n## {bounds}: best feasible trial, select on {select_on}; "
                  f"{args.seeds} seeds from {args.first_seed}")
            print(f"feasible cells: {feasible.sum()} of {len(feasible)} "
                  f"({100 * feasible.mean():.1f} %); feasible optimum by {select_on}: cell "
                  f"{oracle}, valid {valid[oracle]:.3f}, test {test[oracle]:.2f}; best feasible "
                  f"test {test[feasible].max():.2f}")
            print(f"{'strategy':28s}{'seeds':>6s}" + "".join(f"{'regret @' + str(q):>16s}"
                                                           for q in marks)
                  + f"{'test @' + str(marks[-1]):>16s}{'feasible':>10s}{'infeas.best':>12s}"
                  + f"{'s/run':>7s}")
            for name in args.constrained_strategies:
                runs = [r for r in done if r["experiment"] == experiment
                        and r["strategy"] == name
                        and args.first_seed <= r["seed"] < args.first_seed + args.seeds
                        and r["queries"] == args.queries and r["select_on"] == select_on]
                if not runs:
                    continue
                cols, bad = "", 0
                for q in marks:
                    regrets, tests = [], []
                    for r in runs:
                        best = r["best"].get(str(q)) or []
                        if best:
                            cell = r["cells"][best[0]]
                            bad += int(not feasible[cell])
                            regrets.append(score[oracle] - score[cell])
                            tests.append(test[cell])
                    cols += f"{np.mean(regrets):9.3f} +-{np.std(regrets):5.3f}"
                frac = np.mean([np.mean(r["feasible"]) for r in runs])
                secs = np.mean([r["seconds"] for r in runs])
                print(f"{name:28s}{len(runs):6d}{cols}{np.mean(tests):9.2f} +-"
                      f"{np.std(tests):5.2f}{100 * frac:9.0f}%{bad:12d}{secs:7.1f}")


def table_front_hv(score: np.ndarray, latency: np.ndarray) -> float:
    from frugalnas.multiobjective.hypervolume import hypervolume

    pts = np.stack([score, latency], 1)
    order = np.lexsort((latency, -score))  # best accuracy first, then lower latency
    front, best_lat = [], np.inf
    for i in order:
        if latency[i] < best_lat:
            front.append(pts[i])
            best_lat = latency[i]
    return hypervolume(front, REFERENCE, DIRECTIONS)


def summarise(done: list[dict], args: argparse.Namespace) -> None:
    from frugalnas.multiobjective.hypervolume import hypervolume
    from frugalnas.spaces.nb201.table import nb201_data

    data = nb201_data()
    valid, test = data.valid_accuracy_cifar10, data.test_accuracy[:, 0]
    latency = data.latency(DEVICE)
    if "mo" in args.experiments:
        print(f"\n## accuracy vs {METRIC}: hypervolume, reference point {REFERENCE} "
              f"(accuracy %, ms); {args.seeds} seeds, {args.queries} queries")
        ceiling = table_front_hv(valid, latency)
        print(f"table front (ceiling): valid {ceiling:.1f}, "
              f"test {table_front_hv(test, latency):.1f}")
        test_ceiling = table_front_hv(test, latency)
        mo_marks = sorted({m for m in MO_MARKS if m <= args.queries} | {args.queries})
        print(f"{'strategy':24s}{'seeds':>6s}" + "".join(f"{'HV ratio @' + str(q):>17s}"
                                                       for q in mo_marks)
              + f"{'test ratio @' + str(args.queries):>18s}{'front':>7s}{'s/run':>7s}")
        for name in args.mo_strategies:
            runs = [r for r in done if r["experiment"] == "mo" and r["strategy"] == name
                    and args.first_seed <= r["seed"] < args.first_seed + args.seeds
                    and r["queries"] == args.queries]
            if not runs:
                continue
            ratio: dict[int, list[float]] = {q: [] for q in mo_marks}
            test_ratio, sizes = [], []
            for r in runs:
                for q in mo_marks:
                    cells = r["cells"][:q]
                    ratio[q].append(hypervolume([(valid[c], latency[c]) for c in cells],
                                                REFERENCE, DIRECTIONS) / ceiling)
                cells = r["cells"][:args.queries]
                test_ratio.append(hypervolume([(test[c], latency[c]) for c in cells],
                                              REFERENCE, DIRECTIONS) / test_ceiling)
                sizes.append(len(r["best"][str(args.queries)]))
            cols = "".join(f"{np.mean(ratio[q]):9.4f} +-{np.std(ratio[q]):.4f}"
                           for q in mo_marks)
            secs = np.mean([r["seconds"] for r in runs])
            print(f"{name:24s}{len(runs):6d}{cols}{np.mean(test_ratio):10.4f} +-"
                  f"{np.std(test_ratio):.4f}{np.mean(sizes):7.1f}{secs:7.1f}")
    if any(e.startswith("constrained") for e in args.experiments):
        constrained_tables(done, args)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--first-seed", type=int, default=0,
                        help="seeds first-seed .. first-seed+seeds-1")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--experiments", default="mo,constrained")
    parser.add_argument("--mo-strategies", default=",".join(MO_STRATEGIES))
    parser.add_argument("--constrained-strategies", default=",".join(CONSTRAINED_STRATEGIES))
    parser.add_argument("--select-on", default="valid,test",
                        help="constrained experiment: valid (the benchmark's protocol), test, "
                             "or both")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache", type=Path, help="JSON-lines file of finished runs (resume)")
    parser.add_argument("--summary-only", action="store_true",
                        help="print the tables from the cache, run nothing")
    args = parser.parse_args()
    for key in ("experiments", "mo_strategies", "constrained_strategies", "select_on"):
        setattr(args, key, [s for s in getattr(args, key).split(",") if s])
    latest = {}  # a run repeated in the cache counts once (its last record)
    for r in read_cache(args.cache):
        latest[(r["experiment"], r["strategy"], r["seed"], r["queries"], r["select_on"])] = r
    done = list(latest.values())
    jobs = []
    if "mo" in args.experiments:
        jobs += [("mo", n, s, args.queries, "valid") for n in args.mo_strategies
                 for s in range(args.first_seed, args.first_seed + args.seeds)]
    for experiment in [e for e in args.experiments if e.startswith("constrained")]:
        constraint_set(experiment)
        jobs += [(experiment, n, s, args.queries, sel) for sel in args.select_on
                 for n in args.constrained_strategies
                 for s in range(args.first_seed, args.first_seed + args.seeds)]
    jobs = [j for j in jobs if j not in latest and not args.summary_only]
    done += run_cached(jobs, run_one, workers=args.workers, cache=args.cache,
                       describe=lambda r: f"{r['experiment']} {r['strategy']} seed {r['seed']} "
                                          f"({r['select_on']}): {r['seconds']:.1f}s")
    summarise(done, args)


if __name__ == "__main__":
    main()
