"""Scoring speed of the `selected` rank ensemble (meco, swap, synflow, ntk_cond) on NB201 cells:
the reference path against the fast one, on the same cells, interleaved, same scores checked.

Each cell (N=5, C=16, 10 classes, a seeded random sample of the 15,625) is scored the way the
``rank-ensemble`` estimator scores a candidate (:func:`frugalnas.proxies.base.score_network`:
build the network, draw the estimator's default batch of 64 examples, score every member, count
the FLOPs): once with ``share=False`` (each proxy alone, ``count_flops``: the code as it was
before the fast paths) and once with ``share=True`` (one ``SharedPasses``: the fast paths),
alternating which goes first. Both must give the same values, FLOPs and parameter count,
bitwise; the script stops with an error otherwise. The batch is 64 Gaussian images (the
estimator's ``data="gaussian"``), so no dataset is loaded; the cost does not depend on the
pixel values.

    python benchmarks/proxy_speed.py                 # 20 cells, one thread
    python benchmarks/proxy_speed.py --cells 50 --threads 2
"""

from __future__ import annotations

import argparse
import random
import time
from collections.abc import Callable
from typing import Any

import optuna
import torch

import frugalnas
from frugalnas.proxies.base import score_network
from frugalnas.spaces.nb201.space import NB201Space

#: the ensemble estimator's options here: the ``selected`` preset on its default batch size
ESTIMATOR_OPTIONS: dict[str, Any] = {"proxies": "selected", "data": "gaussian"}


def _scorer(seed: int) -> Callable[[Any, bool], tuple[dict[str, float], tuple[float, int]]]:
    """A function scoring one NB201 cell with the ``selected`` ensemble on either path."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)  # no "study created" line
    try:
        study = frugalnas.create_study(space="nb201", space_options={"N": 5, "C": 16},
                                       estimator="rank-ensemble", dataset=None,
                                       estimator_options=ESTIMATOR_OPTIONS,
                                       disable_plugins=["mlflow", "progress"], seed=seed)
    finally:
        optuna.logging.set_verbosity(verbosity)
    est, context = study.estimator, study.context()

    def score(arch: Any, share: bool) -> tuple[dict[str, float], tuple[float, int]]:
        values, cost = score_network(est.members, arch, context, est.batch,
                                     need_dataset=est.needs_dataset, share=share)
        return values, (cost.flops, cost.params)

    return score


def _timed(score: Callable, arch: Any, share: bool) -> tuple[Any, float]:
    start = time.perf_counter()
    result = score(arch, share)
    return result, time.perf_counter() - start


def selected_speed(cells: int = 20, threads: int = 1, seed: int = 0) -> float:
    """Score ``cells`` random NB201 cells with the ``selected`` ensemble on the reference
    and the fast path (``threads`` torch threads, cells drawn with ``seed``), print one line
    per path comparison and the ratio, and return the fast path's cells/s over the
    reference's. Raises ``AssertionError`` when the two paths disagree on any value."""
    previous = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        score = _scorer(seed)
        space = NB201Space(N=5, C=16)
        archs = [space.from_index(i) for i in random.Random(seed).sample(range(15625), cells)]
        for share in (False, True):  # first calls set up torch's counters and kernels
            score(archs[0], share)
        took = {False: 0.0, True: 0.0}
        with torch.random.fork_rng(devices=[]):
            for n, arch in enumerate(archs):
                results = {}
                for share in ((False, True) if n % 2 == 0 else (True, False)):
                    results[share], seconds = _timed(score, arch, share)
                    took[share] += seconds
                assert results[True] == results[False], (
                    f"the fast path disagrees on {arch}: {results[True]} != {results[False]}")
    finally:
        torch.set_num_threads(previous)
    before, after = cells / took[False], cells / took[True]
    plural = "thread" if threads == 1 else "threads"
    print(f"selected: {before:.2f} cells/s before, {after:.2f} cells/s after ({cells} NB201 "
          f"cells, N=5 C=16, {threads} {plural}), same scores", flush=True)
    ratio = after / before
    print(f"selected cells/s: {ratio:.2f} x before", flush=True)
    return ratio


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cells", type=int, default=20, help="random NB201 cells (default 20)")
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    ap.add_argument("--seed", type=int, default=0, help="seed of the cell sample (default 0)")
    args = ap.parse_args()
    selected_speed(args.cells, args.threads, args.seed)


if __name__ == "__main__":
    main()
