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

With ``--isolate`` every variant of every round runs in a fresh process of its own (started
with the same interpreter; the figures exclude start-up, and B and D first run a 20-trial
study in that process), so that one variant's background work
(MLflow's writer thread, garbage left behind) does not load another; ``--variants B,D``
runs only some of them.

``--without PIECE`` is a diagnostic of where B's extra time goes: B runs with one piece of
frugalnas's per-trial work removed (``records``: the metrics and cost user attributes;
``report``: the trial report and the finished hook; ``crash-check``; ``timeout``: the timeout
guard; ``relative-check``: optuna's check of each relative parameter's distribution against the
one the trial asks for, which a sampler that proposes whole architectures pays and optuna's
independent random sampler does not). The study's results are then incomplete: never use it
for anything but this measurement.

    python benchmarks/overhead.py [--trials 200] [--repeats 5] [--isolate] [--variants ABCD]
    python benchmarks/overhead.py --trials 2000 --repeats 3 --isolate --variants B --without records
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
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


WITHOUT = ("records", "report", "crash-check", "timeout", "relative-check")


def remove_piece(piece: str) -> None:
    """Take one piece of per-trial work out of this process (``--without``)."""
    import contextlib

    from optuna.trial import _trial

    from frugalnas.engine import runner

    if piece == "records":
        runner.TrialRunner.record = lambda self, trial, result: None
    elif piece == "report":
        runner.TrialRunner.finished = lambda self, *args, **kwargs: None
    elif piece == "crash-check":
        runner.TrialRunner.refuse_crashed = lambda self, arch: None
    elif piece == "timeout":
        runner.trial_timeout = lambda seconds: contextlib.nullcontext()
    elif piece == "relative-check":
        def is_relative(trial, name, distribution):
            if name not in trial.relative_params:
                return False
            value = distribution.to_internal_repr(trial.relative_params[name])
            return distribution._contains(value)

        _trial.Trial._is_relative_param = is_relative


def run_variant(variant: str, n: int, tmp: Path, r: int) -> tuple[float, float]:
    """One variant's (wall, CPU) seconds per trial in round ``r``, in this process."""
    uri = fresh_mlflow_uri(tmp / f"{variant.lower()}{r}.db") if variant in "AC" else None
    run = run_frugalnas if variant in "AB" else run_optuna
    return run(n, uri, r)


def run_isolated(variant: str, n: int, tmp: Path, r: int,
                 without: str | None = None) -> tuple[float, float]:
    """:func:`run_variant` in a fresh process of its own."""
    out = subprocess.run([sys.executable, __file__, "--one", variant, "--trials", str(n),
                          "--round", str(r), "--tmp", str(tmp)]
                         + (["--without", without] if without and variant in "AB" else []),
                         capture_output=True, text=True, check=True)
    wall, cpu = json.loads(out.stdout.strip().splitlines()[-1])
    return wall, cpu


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=200)
    parser.add_argument("--repeats", type=int, default=5, help="timed rounds after the warm-up")
    parser.add_argument("--isolate", action="store_true",
                        help="run each variant of each round in a fresh process of its own")
    parser.add_argument("--variants", default="ABCD", help="which of A, B, C, D to run")
    parser.add_argument("--without", choices=WITHOUT,
                        help="diagnostic: run A and B without this piece of per-trial work "
                             "(needs --isolate)")
    parser.add_argument("--one", help=argparse.SUPPRESS)  # a child of --isolate: one variant
    parser.add_argument("--round", type=int, default=0, help=argparse.SUPPRESS)
    parser.add_argument("--tmp", help=argparse.SUPPRESS)
    args = parser.parse_args()
    variants = [v for v in "ABCD" if v in args.variants.upper()]
    if args.without and not (args.isolate or args.one):
        parser.error("--without needs --isolate (it changes the process it runs in)")
    if args.one:
        if args.without:
            remove_piece(args.without)
        nb201_table()
        if args.one in "BD":  # first-use costs (imports, caches) before the timed study
            run_variant(args.one, 20, Path(args.tmp), 1000 + args.round)
        print(json.dumps(run_variant(args.one, args.trials, Path(args.tmp), args.round)))
        return
    tmp = Path(tempfile.mkdtemp(prefix="frugalnas-overhead-"))
    results: dict[str, list[tuple[float, float]]] = {k: [] for k in variants}
    nb201_table()
    warmup: dict[str, tuple[float, float]] = {}
    for r in range(args.repeats + 1):
        row = {v: run_isolated(v, args.trials, tmp, r, args.without) if args.isolate
               else run_variant(v, args.trials, tmp, r) for v in variants}
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
          "trial: wall-clock ms, and CPU ms of the process (all its threads; robust to other "
          "jobs on the machine)" + ("; each variant in a process of its own" if args.isolate
                                   else "")
          + (f"; A and B WITHOUT {args.without} (a diagnostic)" if args.without else ""))
    for k in variants:
        print(f"  {k}. {labels[k]:<36} {wall[k] * 1000:8.3f} ms wall, {cpu[k] * 1000:8.3f} ms CPU  "
              f"(wall runs: {', '.join(f'{v[0] * 1000:.2f}' for v in results[k])}; "
              f"warm-up {warmup[k][0] * 1000:.2f})")
    for name, a, b, what in (("A/C", "A", "C", "frugalnas+MLflow vs optuna+MLflowCallback"),
                             ("B/D", "B", "D", "frugalnas vs optuna, no tracking")):
        if a not in wall or b not in wall:
            continue
        print(f"ratio {name} ({what}): wall {wall[a] / wall[b]:.3f}, CPU {cpu[a] / cpu[b]:.3f}  "
              "(goal <= 1.10)")

if __name__ == "__main__":
    main()
