"""What a pre-screen costs beyond its proxy evaluations, on the NAS-Bench-201 table.

Two parts, every run a real frugalnas study on the ``nb201-table`` estimator (CIFAR-10,
select on validation accuracy, the constraint ``latency_ms_pixel3 <= --bound``; in-memory
storage, one thread):

* **side by side** (seed ``--seed``): ``--queries`` trials of the plain inner strategy
  (``--inner``, default regularized evolution), then the same study pre-screened
  (``prescreen`` over that strategy, ``--proxy`` on ``--batch-size`` examples of ``--dataset``
  resized to ``--resize``, ``k`` candidates a trial, networks with N=``--net-N``,
  C=``--net-C``). Printed, in wall-clock and in CPU seconds of the process (the CPU figures
  hold on a machine shared with other work): each study's total; the pre-screen's proxy time
  (building and scoring the networks it evaluated), batch time (drawing the proxy batch,
  once) and proposal time (the inner strategy naming ``k`` candidates a trial and predicting
  their feasibility); its evaluations and cache hits; and the overhead, total - plain - proxy
  - batch, as a fraction of the plain study (the goal: at most 1.0), also without the
  proposals' share beyond what the plain study spent choosing (``beyond proposals``).
* **seeds** (``--seeds`` > 0): the pre-screened study for seeds 0..N-1 one after the other,
  with the wall time of all of them and each seed's search result (the test accuracy of the
  best feasible trial by validation accuracy).

    nice -n 10 python benchmarks/prescreen_cost.py --seeds 10
"""

from __future__ import annotations

import argparse
import time

import numpy as np
import optuna
import torch

import frugalnas
from frugalnas.spaces.nb201.table import nb201_data

METRIC = "latency_ms_pixel3"


def study_for(args: argparse.Namespace, seed: int, prescreen: bool) -> frugalnas.Study:
    if prescreen:
        strategy = "prescreen"
        options = {"inner": args.inner, "proxy": args.proxy, "k": args.k,
                   "dataset": args.dataset, "dataset_options": {"resize": args.resize},
                   "batch_size": args.batch_size, "workers": args.workers}
        if args.cache_dir:
            options["cache_dir"] = args.cache_dir
    else:
        strategy, options = args.inner, {}
    # The pre-screen's proxy builds the networks of --net-N/--net-C; the table scores each cell
    # as in the benchmark network (any_network: the same values as on N=5, C=16).
    return frugalnas.create_study(
        strategy=strategy, strategy_options=options, estimator="nb201-table", seed=seed,
        space_options={"N": args.net_N, "C": args.net_C},
        estimator_options={"dataset": "cifar10", "select_on": "valid", "any_network": True},
        constraints={METRIC: args.bound}, disable_plugins=["mlflow", "progress"])


def timed_run(args: argparse.Namespace, seed: int,
              prescreen: bool) -> tuple[frugalnas.Study, float, float]:
    """The study after ``--queries`` trials, with the wall and CPU seconds they took."""
    study = study_for(args, seed, prescreen)
    start, cpu = time.perf_counter(), time.process_time()
    study.optimize(n_trials=args.queries)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    if prescreen:
        study.strategy.close()
    return study, seconds, cpu


def best_test(study: frugalnas.Study) -> tuple[float, float]:
    """(validation, test) accuracy of the study's best feasible trial."""
    data = nb201_data()
    index = study.space.index(study.best_trial.architecture)
    return float(data.valid_accuracy_cifar10[index]), float(data.test_accuracy[index, 0])


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--queries", type=int, default=100)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--seeds", type=int, default=0, help="also run seeds 0..N-1 pre-screened")
    ap.add_argument("--inner", default="regularized-evolution")
    ap.add_argument("--proxy", default="synflow")
    ap.add_argument("--k", type=int, default=10)
    ap.add_argument("--dataset", default="digits")
    ap.add_argument("--resize", type=int, default=16)
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--net-N", type=int, default=1)
    ap.add_argument("--net-C", type=int, default=8)
    ap.add_argument("--bound", type=float, default=10.0)
    ap.add_argument("--workers", type=int, default=0,
                    help="prescreen workers: 0 in the study's process, N persistent processes")
    ap.add_argument("--cache-dir", default=None, help="prescreen's on-disk score cache")
    args = ap.parse_args()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    nb201_data()  # the table is loaded once, before any timing

    timed_run(args, args.seed, False)  # warm-up: imports and first-call costs, not timed
    plain, plain_s, plain_cpu = timed_run(args, args.seed, False)
    screened, total_s, total_cpu = timed_run(args, args.seed, True)
    st = screened.strategy.stats
    print(f"{args.queries} queries, seed {args.seed}, {args.inner}; prescreen: {args.proxy}, "
          f"k={args.k}, {args.batch_size} {args.dataset} at {args.resize}x{args.resize}, "
          f"N={args.net_N} C={args.net_C}, workers={args.workers}; {st.evaluations} networks "
          f"evaluated, {st.cache_hits} candidates from the cache")
    print(f"{'clock':<6}{'plain s':>9}{'prescreen s':>13}{'proxy s':>9}{'batch s':>9}"
          f"{'proposals s':>13}{'overhead s':>12}{'overhead/plain':>16}{'beyond proposals':>18}")
    for clock, plain_t, total_t, proxy_t, batch_t, propose_t in (
            ("wall", plain_s, total_s, st.seconds, st.batch_seconds, st.propose_seconds),
            ("cpu", plain_cpu, total_cpu, st.cpu_seconds, st.cpu_batch_seconds,
             st.cpu_propose_seconds)):
        overhead = total_t - plain_t - proxy_t - batch_t
        beyond = total_t - proxy_t - batch_t - propose_t  # the rest of the pre-screened study
        print(f"{clock:<6}{plain_t:9.2f}{total_t:13.2f}{proxy_t:9.2f}{batch_t:9.2f}"
              f"{propose_t:13.2f}{overhead:12.2f}{overhead / plain_t:16.2f}"
              f"{beyond / plain_t:18.2f}")
    print(f"best feasible (valid, test): plain {best_test(plain)}, prescreen {best_test(screened)}")
    if args.seeds <= 0:
        return
    rows, start, cpu = [], time.perf_counter(), time.process_time()
    for seed in range(args.seeds):
        study, seconds, cpu_s = timed_run(args, seed, True)
        valid, test = best_test(study)
        s = study.strategy.stats
        rows.append(test)
        print(f"seed {seed}: {seconds:6.2f} s wall, {cpu_s:5.2f} s CPU ({s.evaluations} evaluated, {s.cache_hits} cache "
              f"hits, proxy {s.seconds:.2f} s, batch {s.batch_seconds:.2f} s); best feasible "
              f"valid {valid:.2f}, test {test:.2f}", flush=True)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(f"{args.seeds} seeds: {wall:.1f} s wall, {cpu:.1f} s CPU; test accuracy of the best feasible trial "
          f"@{args.queries} {np.mean(rows):.2f} +- {np.std(rows):.2f}")


if __name__ == "__main__":
    main()
