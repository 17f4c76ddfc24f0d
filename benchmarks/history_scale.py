"""Per-trial cost and memory of long table studies: does a proposal cost the same at trial
10,000 as at trial 1,000?

For each strategy, one frugalnas study on the `nb201-table` estimator (a table lookup, so
only the framework and the strategy are measured), in-memory storage, tracking off, run in a
fresh process of its own. The study runs in ten chunks of a tenth of its trials; the script
prints the mean per-trial time, wall clock and CPU time of the process, of the second chunk
(trials 1,000-2,000 of 10,000) and of the last (9,000-10,000), their ratio (goal <= 1.5; CPU
time is far less disturbed by other jobs on a shared machine), and the growth of the process's
resident memory over the study (goal < 100 MB).

    python benchmarks/history_scale.py [--trials 10000] [--strategies random,regularized-evolution,local-search]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time

STRATEGIES = ("random", "regularized-evolution", "local-search")


def resident_mb() -> float:
    """The resident memory of this process, MB (``VmRSS``)."""
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def measure(strategy: str, trials: int, seed: int) -> dict[str, float]:
    """Run one study in this process and return its figures."""
    os.environ["FRUGALNAS_PROGRESS"] = "0"
    import optuna

    import frugalnas
    from frugalnas.spaces.nb201.table import nb201_table

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    nb201_table()
    study = frugalnas.create_study(estimator="nb201-table", strategy=strategy, seed=seed,
                                   disable_plugins=["mlflow"], study_name=f"scale-{strategy}")
    study.optimize(n_trials=10)  # imports and first-use caches before the baseline
    before = resident_mb()
    chunk = max(1, trials // 10)
    wall: list[float] = []
    cpu: list[float] = []
    done = 10
    while done < trials:  # in chunks of a tenth of the study (the first one 10 trials short)
        n = min(chunk * (len(wall) + 1), trials) - done
        start, start_cpu = time.perf_counter(), time.process_time()
        study.optimize(n_trials=n)
        wall.append(1000 * (time.perf_counter() - start) / n)
        cpu.append(1000 * (time.process_time() - start_cpu) / n)
        done += n
    after = resident_mb()
    return {"early_ms": wall[1], "late_ms": wall[-1], "early_cpu_ms": cpu[1],
            "late_cpu_ms": cpu[-1], "early_window": f"{chunk}-{2 * chunk}",
            "late_window": f"{trials - chunk}-{trials}", "mean_ms": sum(wall) / len(wall),
            "rss_growth_mb": after - before, "rss_end_mb": after,
            "distinct": len({str(t.architecture) for t in study.trials})}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--strategies", default=",".join(STRATEGIES))
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child process: one strategy
    args = parser.parse_args()
    if args.one:
        print(json.dumps(measure(args.one, args.trials, args.seed)))
        return
    print(f"{args.trials} trials per study, nb201-table, in-memory storage, tracking off, each "
          "strategy in a fresh process; mean ms per trial (wall clock)")
    ok = True
    for strategy in args.strategies.split(","):
        out = subprocess.run([sys.executable, __file__, "--one", strategy, "--trials",
                              str(args.trials), "--seed", str(args.seed)],
                             capture_output=True, text=True, check=True)
        r = json.loads(out.stdout.strip().splitlines()[-1])
        ratio, ratio_cpu = r["late_ms"] / r["early_ms"], r["late_cpu_ms"] / r["early_cpu_ms"]
        ok &= min(ratio, ratio_cpu) <= 1.5 and r["rss_growth_mb"] < 100
        print(f"  {strategy:<22} trials {r['early_window']}: {r['early_ms']:6.2f} ms wall "
              f"({r['early_cpu_ms']:.2f} CPU), {r['late_window']}: {r['late_ms']:6.2f} ms wall "
              f"({r['late_cpu_ms']:.2f} CPU); ratio {ratio:4.2f} wall, {ratio_cpu:4.2f} CPU "
              f"(goal <= 1.5); all: {r['mean_ms']:.2f} ms; "
              f"resident memory +{r['rss_growth_mb']:.1f} MB "
              f"(goal < 100; {r['rss_end_mb']:.0f} MB at the end); "
              f"{r['distinct']} distinct architectures")
    print("goals met" if ok else "goals NOT met")


if __name__ == "__main__":
    main()
