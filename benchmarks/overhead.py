"""Per-trial overhead of frugalnas over plain optuna, with a trivial estimator.

Runs, side by side in one process:
  A. frugalnas study, nb201-table estimator, MLflow tracking on (sqlite store)
  B. frugalnas study, nb201-table estimator, tracking off
  C. plain optuna study + optuna-integration's MLflowCallback (sqlite store), same lookup
  D. plain optuna study, same lookup, no tracking
and prints milliseconds per trial (wall clock, and CPU time of the process) and the ratios
A/C and B/D (goal: both <= 1.10).
All use in-memory optuna storage and random sampling; each MLflow store is a fresh sqlite
file, created before timing starts. Rounds interleave the four variants to share noise; the
first round is a warm-up (imports, caches, MLflow's first connection), reported on its own and
left out of the medians.

    python benchmarks/overhead.py [--trials 200] [--repeats 5]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import optuna

import frugalnas
from frugalnas.spaces.nb201.table import nb201_table
from frugalnas.spaces.nb201.space import OPS, NB201Space
from frugalnas.testing import fresh_mlflow_uri

os.environ["FRUGALNAS_PROGRESS"] = "0"
optuna.logging.set_verbosity(optuna.logging.WARNING)
SPACE = NB201Space()


def lookup_objective(trial: optuna.Trial) -> float:
    params = {k: trial.suggest_categorical(k, OPS) for k in SPACE.distributions()}
    return float(nb201_table()[SPACE.index(SPACE.from_params(params)), 0])


def run_frugalnas(n: int, uri: str | None, seed: int) -> tuple[float, float]:
    study = frugalnas.create_study(estimator="nb201-table", strategy="random", seed=seed,
                                   **({"plugin_options": {"mlflow": {"tracking_uri": uri}}}
                                      if uri is not None else {"disable_plugins": ["mlflow"]}),
                                   study_name=f"bench-{seed}-{uri is not None}")
    start, cpu = time.perf_counter(), time.process_time()
    study.optimize(n_trials=n)  # includes draining the MLflow writer at the end
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    errors = study.plugin_state.get("mlflow", {}).get("errors")
    assert not errors, errors
    if uri is not None:  # each trial's run written once, by its own write, not re-created
        reconciled = study.plugin_state["mlflow"]["reconciled"]
        assert not any(reconciled.values()), reconciled
        assert study.plugin_errors == [], study.plugin_errors  # no write lost or failed
        # one search of MLflow (when the writer connected), whatever the number of trials
        counters = study.plugin_state["mlflow"]["counters"]
        assert counters["searches"] == 1 and counters["created"] == n, counters
    return elapsed / n, cpu / n


def run_optuna(n: int, uri: str | None, seed: int) -> tuple[float, float]:
    callbacks = []
    if uri is not None:
        from optuna_integration.mlflow import MLflowCallback

        callbacks.append(MLflowCallback(tracking_uri=uri, metric_name="value"))
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(seed),
                                study_name=f"plain-{seed}-{uri is not None}")
    start, cpu = time.perf_counter(), time.process_time()
    study.optimize(lookup_objective, n_trials=n, callbacks=callbacks)
    return (time.perf_counter() - start) / n, (time.process_time() - cpu) / n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds after the warm-up")
    args = parser.parse_args()
    tmp = Path(tempfile.mkdtemp(prefix="frugalnas-overhead-"))
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in "ABCD"}
    nb201_table()
    warmup: dict[str, tuple[float, float]] = {}
    for r in range(args.repeats + 1):
        uri_a = fresh_mlflow_uri(tmp / f"a{r}.db")
        uri_c = fresh_mlflow_uri(tmp / f"c{r}.db")
        row = {"A": run_frugalnas(args.trials, uri_a, r), "B": run_frugalnas(args.trials, None, r),
               "C": run_optuna(args.trials, uri_c, r), "D": run_optuna(args.trials, None, r)}
        if r == 0:
            warmup = row
            continue
        for k, v in row.items():
            results[k].append(v)
    wall = {k: statistics.median(v[0] for v in runs) for k, runs in results.items()}
    cpu = {k: statistics.median(v[1] for v in runs) for k, runs in results.items()}
    labels = {"A": "frugalnas + MLflow (sqlite)", "B": "frugalnas, tracking off",
              "C": "optuna + MLflowCallback (sqlite)", "D": "optuna, no tracking"}
    print(f"{args.trials} trials x {args.repeats} rounds after a warm-up round, medians per "
          "trial: wall-clock ms, and CPU ms of this process (all its threads; robust to other "
          "jobs on the machine)")
    for k in "ABCD":
        print(f"  {k}. {labels[k]:<36} {wall[k] * 1000:8.2f} ms wall, {cpu[k] * 1000:8.2f} ms CPU  "
              f"(wall runs: {', '.join(f'{v[0] * 1000:.2f}' for v in results[k])}; "
              f"warm-up {warmup[k][0] * 1000:.2f})")
    for name, a, b, what in (("A/C", "A", "C", "frugalnas+MLflow vs optuna+MLflowCallback"),
                             ("B/D", "B", "D", "frugalnas vs optuna, no tracking")):
        print(f"ratio {name} ({what}): wall {wall[a] / wall[b]:.3f}, CPU {cpu[a] / cpu[b]:.3f}  "
              "(goal <= 1.10)")

if __name__ == "__main__":
    main()
