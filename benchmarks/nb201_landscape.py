"""The constrained NAS-Bench-201 landscape as local search sees it: local optima of the
one-edit neighbourhood restricted to feasible cells, and where climbs end.

For each constraint set of ``benchmarks/hw_nb201.py`` (validation accuracy, the benchmark's
protocol) it prints the number of feasible cells, the feasible local optima (no feasible
one-edit neighbour is better) and how many of them lie within ``--within`` of the feasible
optimum, and the share of steepest-ascent climbs from ``--starts`` random feasible cells that
end within it; then the same for the bridged neighbourhood of the strategies'
``bridge_infeasible`` (the feasible one-edit neighbours and the feasible cells two edits away
through an infeasible one). With ``--strategy NAME`` it also runs that strategy's constrained studies
(``--seeds`` from ``--first-seed``, 100 queries each) and says, for the runs whose choice is
further than ``--within`` from the optimum, how many ended at a local optimum whose feasible
neighbours they had all evaluated, and at which query, on average, they found it.

    python benchmarks/nb201_landscape.py
    python benchmarks/nb201_landscape.py --strategy local-search --first-seed 100 --seeds 200
"""

from __future__ import annotations

import argparse
from multiprocessing import get_context

import numpy as np

from hw_nb201 import CONSTRAINT_SETS, feasible_cells, run_one


def neighbour_table() -> np.ndarray:
    """Row i: the table indices of cell i's one-edit neighbours (from the space itself)."""
    from frugalnas.spaces.nb201.space import NB201Space

    space = NB201Space()
    rows = [[space.index(n) for n in space.neighbours(space.from_index(i))]
            for i in range(15625)]
    return np.asarray(rows, dtype=np.int64)


def bridged_table(nbrs: np.ndarray, feasible: np.ndarray) -> np.ndarray:
    """Row i: cell i's one-edit neighbours, then the cells two edits away through an
    infeasible neighbour (-1 where a step through a feasible neighbour, or back to i, is
    left out); the feasibility of the cells themselves is left to the caller."""
    two = nbrs[nbrs]  # (cells, 24, 24): neighbours of each neighbour
    keep = ~feasible[nbrs][:, :, None] & (two != np.arange(len(nbrs))[:, None, None])
    return np.concatenate([nbrs, np.where(keep, two, -1).reshape(len(nbrs), -1)], axis=1)


def climb(start: int, score: np.ndarray, nbrs: np.ndarray, feasible: np.ndarray) -> int:
    """Steepest ascent over feasible neighbours from ``start``; the cell it ends at."""
    cell = start
    while True:
        row = nbrs[cell][nbrs[cell] >= 0]
        around = row[feasible[row]]
        if not len(around):
            return cell
        best = around[np.argmax(score[around])]
        if score[best] <= score[cell]:
            return cell
        cell = int(best)


def optima(label: str, score: np.ndarray, nbrs: np.ndarray, feasible: np.ndarray,
           args: argparse.Namespace) -> tuple[np.ndarray, float]:
    """Print the feasible local optima of the neighbourhood ``nbrs`` (-1: no neighbour) and
    where climbs end; the local optima and the feasible optimum's score."""
    optimum = np.where(feasible, score, -np.inf).max()
    valid = nbrs >= 0
    cells = np.where(valid, nbrs, 0)
    best_around = np.max(np.where(valid & feasible[cells], score[cells], -np.inf), axis=1)
    local = feasible & (best_around <= score)
    good = local & (optimum - score <= args.within)
    rng = np.random.default_rng(0)
    starts = rng.choice(np.flatnonzero(feasible), args.starts)
    ends = np.array([climb(int(s), score, nbrs, feasible) for s in starts])
    share = float(np.mean(optimum - score[ends] <= args.within))
    print(f"{label:24s} feasible {feasible.sum():5d}  local optima {local.sum():4d}  within "
          f"{args.within:g}: {good.sum():3d}  climbs ending within {args.within:g}: "
          f"{100 * share:5.1f} %")
    return local, float(optimum)


def landscape(name: str, score: np.ndarray, nbrs: np.ndarray, args: argparse.Namespace
              ) -> tuple[np.ndarray, np.ndarray, float]:
    feasible = feasible_cells(CONSTRAINT_SETS[name])
    local, optimum = optima(name, score, nbrs, feasible, args)
    optima(f"{name} bridged", score, bridged_table(nbrs, feasible), feasible, args)
    return feasible, local, optimum


def job(task: tuple[str, str, int]) -> dict:
    name, strategy, seed = task
    experiment = "constrained" if name == "pixel3" else f"constrained:{name}"
    return run_one((experiment, strategy, seed, 100, "valid"))


def strategy_runs(name: str, score: np.ndarray, nbrs: np.ndarray, feasible: np.ndarray,
                  local: np.ndarray, optimum: float, args: argparse.Namespace) -> None:
    seeds = range(args.first_seed, args.first_seed + args.seeds)
    with get_context("fork").Pool(args.workers) as pool:
        runs = pool.map(job, [(name, args.strategy, s) for s in seeds])
    regrets, stuck, found = [], 0, []
    for r in runs:
        number = r["best"]["100"][0]
        cell = r["cells"][number]
        regrets.append(optimum - score[cell])
        if optimum - score[cell] > args.within:
            around = nbrs[cell][feasible[nbrs[cell]]]
            stuck += int(local[cell] and set(around.tolist()) <= set(r["cells"]))
            found.append(number)
    bad = len(found)
    print(f"  {args.strategy}: mean regret {np.mean(regrets):.3f}; {bad} of {len(runs)} runs "
          f"over {args.within:g}, {stuck} of them at an exhausted local optimum"
          + (f", found at query {np.mean(found) + 1:.0f} on average" if bad else ""))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--within", type=float, default=0.15)
    parser.add_argument("--starts", type=int, default=2000)
    parser.add_argument("--strategy", default=None)
    parser.add_argument("--first-seed", type=int, default=100)
    parser.add_argument("--seeds", type=int, default=200)
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    from frugalnas.spaces.nb201.table import nb201_data

    score = nb201_data().valid_accuracy_cifar10.astype(float)
    nbrs = neighbour_table()
    for name in CONSTRAINT_SETS:
        feasible, local, optimum = landscape(name, score, nbrs, args)
        if args.strategy:
            strategy_runs(name, score, nbrs, feasible, local, optimum, args)


if __name__ == "__main__":
    main()
