"""Search strategies on the NAS-Bench-201 table under the benchmark's protocol: each strategy
selects on CIFAR-10 *validation* accuracy and we report the CIFAR-10 *test* accuracy of the
cell it selected.

Each strategy runs ``--queries`` table look-ups (its objective: the cell's validation
accuracy) for each of ``--seeds`` seeds, driven directly through optuna with in-memory
storage. After q queries the strategy's choice is the cell with the best validation accuracy
seen so far (the first one on ties); the table prints the mean +- std over seeds of that
cell's test accuracy after 25, 50 and 100 queries, the mean best validation accuracy, the
first query count at which the mean test accuracy of the choice reaches ``--target``, and the
seconds per run. The oracle row is the cell with the best validation accuracy in the whole
table (what an exhaustive search would select) and its test accuracy.

``--select-on test`` runs the test-selection protocol instead (objective = test accuracy), for
comparison.

Strategies: every frugalnas strategy usable on NB201 (``random``, ``regularized-evolution``,
``local-search``, ``surrogate-evolution``, ``bananas``), ``prescreen`` (synflow over
regularized evolution, k=10, scored on a reduced network: N=1, C=8, 16x16 Gaussian inputs;
the proxy's 10 scores per query are not counted as queries) and optuna's TPE (``tpe``).
``--cache FILE`` keeps finished runs (JSON lines) so an interrupted run resumes.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import numpy as np

from cached_runs import read_cache, run_cached

STRATEGIES = ("random", "regularized-evolution", "local-search", "surrogate-evolution",
              "bananas", "prescreen")
BASELINES = ("tpe",)
#: Options used here (kept light so a run fits on 2 CPU cores).
OPTIONS = {
    "surrogate-evolution": {"quality_every": 0,
                            "surrogate_options": {"n_models": 3, "n_estimators": 100}},
    "bananas": {"quality_every": 0, "surrogate_options": {"epochs": 100}},
    "prescreen": {"inner": "regularized-evolution", "proxy": "synflow", "k": 10,
                  "data": "gaussian", "batch_size": 8, "input_shape": (3, 16, 16)},
}
#: The space each strategy searches: the table is indexed by the cell alone, so N and C only
#: matter where a network is built (the pre-screen's proxy).
SPACE_OPTIONS = {"prescreen": {"N": 1, "C": 8}}


def _sampler(name: str, seed: int):
    import optuna

    import frugalnas
    from frugalnas.spaces.nb201.space import NB201Space

    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return frugalnas.create_component("strategies", name,
                                      space=NB201Space(**SPACE_OPTIONS.get(name, {})),
                                      seed=seed, **OPTIONS.get(name, {}))


def run_one(args: tuple[str, int, int, str]) -> dict:
    """The cells one strategy and seed queried, in order, with their validation and test
    accuracies."""
    import optuna
    import torch

    from frugalnas.spaces.nb201.space import NB201Space
    from frugalnas.spaces.nb201.table import nb201_data

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name, seed, queries, select_on = args
    data = nb201_data()
    valid, test = data.valid_accuracy_cifar10, data.test_accuracy[:, 0]
    objective = valid if select_on == "valid" else test
    space = NB201Space()
    cells: list[int] = []

    def lookup(trial) -> float:
        cells.append(space.index(space.suggest(trial)))
        return float(objective[cells[-1]])

    sampler = _sampler(name, seed)  # plugin host and imports: not counted in s/run
    start = time.perf_counter()
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lookup, n_trials=queries)
    return {"strategy": name, "seed": seed, "queries": queries, "select_on": select_on,
            "cells": cells, "valid": [float(valid[c]) for c in cells],
            "test": [float(test[c]) for c in cells], "seconds": time.perf_counter() - start}


def choice_curves(run: dict) -> tuple[np.ndarray, np.ndarray]:
    """Per query: the best selection score so far and the test accuracy of that cell."""
    score = np.asarray(run["valid"] if run["select_on"] == "valid" else run["test"])
    test = np.asarray(run["test"])
    best = np.zeros(len(score), dtype=int)
    for q in range(1, len(score)):
        best[q] = q if score[q] > score[best[q - 1]] else best[q - 1]
    return score[best], test[best]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=20)
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--strategies", default=",".join(STRATEGIES + BASELINES),
                        help="comma-separated; frugalnas strategy names and 'tpe'")
    parser.add_argument("--select-on", choices=("valid", "test"), default="valid")
    parser.add_argument("--target", type=float, default=94.0,
                        help="test accuracy for the 'to target' column (default 94.0)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--cache", type=Path, help="JSON-lines file of finished runs (resume)")
    args = parser.parse_args()
    names = [s for s in args.strategies.split(",") if s]
    done = read_cache(args.cache)
    have = {(r["strategy"], r["seed"], r["queries"], r["select_on"]) for r in done}
    jobs = [(n, s, args.queries, args.select_on) for n in names for s in range(args.seeds)
            if (n, s, args.queries, args.select_on) not in have]
    done += run_cached(jobs, run_one, workers=args.workers, cache=args.cache,
                       describe=lambda r: f"{r['strategy']} seed {r['seed']}: test of choice "
                                          f"{choice_curves(r)[1][-1]:.2f} in {r['seconds']:.1f}s")

    from frugalnas.spaces.nb201.table import nb201_data

    data = nb201_data()
    valid, test = data.valid_accuracy_cifar10, data.test_accuracy[:, 0]
    oracle = int(np.argmax(valid if args.select_on == "valid" else test))
    marks = [q for q in (25, 50, 100) if q <= args.queries]
    print(f"NB201 CIFAR-10, select on {args.select_on}, report test; {args.seeds} seeds, "
          f"{args.queries} queries")
    print(f"oracle (best {args.select_on} cell of the table, index {oracle}): valid "
          f"{valid[oracle]:.2f}, test {test[oracle]:.2f}; best test in the table "
          f"{test.max():.2f}")
    print(f"{'strategy':24s}{'seeds':>6s}" + "".join(f"{'test @' + str(q):>16s}" for q in marks)
          + f"{args.select_on + ' @' + str(args.queries):>12s}"
          + f"{'to ' + str(args.target):>9s}{'s/run':>8s}")
    for name in names:
        runs = [r for r in done if r["strategy"] == name and r["queries"] == args.queries
                and r["select_on"] == args.select_on and r["seed"] < args.seeds]
        if not runs:
            continue
        curves = [choice_curves(r) for r in runs]
        tests = np.array([c[1] for c in curves])
        scores = np.array([c[0] for c in curves])
        mean = tests.mean(0)
        reach = int(np.argmax(mean >= args.target)) + 1 if np.any(mean >= args.target) else None
        cells = "".join(f"{tests[:, q - 1].mean():9.2f} +-{tests[:, q - 1].std():4.2f}"
                        for q in marks)
        secs = np.mean([r["seconds"] for r in runs])
        print(f"{name:24s}{len(runs):6d}{cells}{scores[:, -1].mean():12.2f}"
              f"{str(reach or '>' + str(args.queries)):>9s}{secs:8.1f}")


if __name__ == "__main__":
    main()
