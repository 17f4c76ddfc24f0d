"""Search strategies on the NAS-Bench-201 table (CIFAR-10 test accuracy as the objective).

Each strategy runs ``--queries`` table look-ups for each of ``--seeds`` seeds, driven directly
through optuna with in-memory storage; optuna's TPE and random sampling run side by side.
Prints the mean +- std of the best accuracy found after 25, 50 and 100 queries, the first
query count at which the mean best reaches 94.0 %, and the seconds per run.

Note: the shipped table holds only test accuracy, so the objective is CIFAR-10 *test*
accuracy; the NB201 paper searches on validation accuracy and reports test accuracy.
"""

from __future__ import annotations

import argparse
import sys
import time
from multiprocessing import Pool

import numpy as np

BASELINES = ("random", "tpe")
STRATEGIES = ("regularized-evolution", "local-search", "surrogate-evolution", "bananas")
#: Options used here (kept light so a run fits in minutes on 2 CPU cores).
OPTIONS = {
    "surrogate-evolution": {"quality_every": 0,
                            "surrogate_options": {"n_models": 3, "n_estimators": 100}},
    "bananas": {"quality_every": 0, "surrogate_options": {"epochs": 100}},
}
TARGET = 94.0


def _sampler(name: str, seed: int):
    import optuna

    import frugalnas
    from frugalnas.spaces.nb201.space import NB201Space

    if name == "random":
        return optuna.samplers.RandomSampler(seed=seed)
    if name == "tpe":
        return optuna.samplers.TPESampler(seed=seed)
    return frugalnas.create_component("strategies", name, space=NB201Space(), seed=seed,
                                      **OPTIONS.get(name, {}))


def run_one(args: tuple[str, int, int]) -> tuple[str, int, list[float], float]:
    """Best-so-far curve of one strategy and seed."""
    import optuna
    import torch

    from frugalnas.spaces.nb201.table import nb201_table
    from frugalnas.spaces.nb201.space import NB201Space

    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    name, seed, queries = args
    space, table = NB201Space(), nb201_table()[:, 0]
    start = time.perf_counter()
    study = optuna.create_study(direction="maximize", sampler=_sampler(name, seed))
    study.optimize(lambda t: float(table[space.index(space.suggest(t))]), n_trials=queries)
    values = [t.value for t in study.trials]
    return name, seed, list(np.maximum.accumulate(values)), time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=5, help="seeds per strategy (paper: 20)")
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--strategies", default=",".join(STRATEGIES + BASELINES),
                        help="comma-separated; frugalnas strategy names, 'random', 'tpe'")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    names = [s for s in args.strategies.split(",") if s]
    jobs = [(n, s, args.queries) for n in names for s in range(args.seeds)]
    results = []
    with Pool(args.workers) as pool:
        for res in pool.imap_unordered(run_one, jobs, chunksize=1):
            results.append(res)
            print(f"  {res[0]} seed {res[1]}: best {res[2][-1]:.2f} in {res[3]:.1f}s",
                  file=sys.stderr, flush=True)
    marks = [q for q in (25, 50, 100) if q <= args.queries]
    print(f"NB201 CIFAR-10 test accuracy (optimum 94.37), {args.seeds} seeds, "
          f"{args.queries} queries")
    print(f"{'strategy':24s}" + "".join(f"{'@' + str(q):>16s}" for q in marks)
          + f"{'to 94.0':>10s}{'s/run':>8s}")
    for name in names:
        curves = np.array([r[2] for r in results if r[0] == name])
        secs = np.mean([r[3] for r in results if r[0] == name])
        mean = curves.mean(0)
        reach = int(np.argmax(mean >= TARGET)) + 1 if np.any(mean >= TARGET) else None
        cells = "".join(f"{curves[:, q - 1].mean():10.2f} +-{curves[:, q - 1].std():4.2f}"
                        for q in marks)
        print(f"{name:24s}{cells}{str(reach or '>' + str(args.queries)):>10s}{secs:8.1f}")


if __name__ == "__main__":
    main()
