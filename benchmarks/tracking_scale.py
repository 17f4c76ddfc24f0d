"""MLflow tracking at scale: a long table study, frugalnas's tracking against optuna's.

Runs, each in its own process, one after the other:
  frugalnas  a frugalnas study (nb201-table estimator, random strategy, in-memory optuna
             storage) with MLflow tracking on;
  optuna     plain optuna (RandomSampler) with optuna-integration's MLflowCallback, the same
             table lookup as objective;
each against a fresh MLflow store: a sqlite file (``--store sqlite``) or an ``mlflow server``
on 127.0.0.1 over HTTP (``--store http``, a server per variant, with a sqlite backend and
proxied artifacts). Wall time is the whole ``optimize`` call, frugalnas's drain of its
writer included.

Checks (the script exits 1 when one fails):
  - every trial has exactly one run, FINISHED, under the study's parent run (FINISHED), and
    a sample of 25 runs has the trial's architecture, value and objective as params/metrics;
  - no write dropped or failed (the plugin's errors are empty, every run created by the
    writer, none left to a reconciliation);
  - the writer's cost per trial (its time writing the runs of trials 0-999, per trial,
    against that of the last 1,000 trials) grows by at most ``--max-growth`` (1.2);
  - frugalnas's wall time is at most ``--max-ratio`` (1.1) times optuna's.

    python benchmarks/tracking_scale.py [--trials 10000] [--store sqlite|http]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
WINDOW = 1000


def lookup_objective() -> Any:
    from frugalnas.spaces.nb201.space import OPS, NB201Space
    from frugalnas.spaces.nb201.table import nb201_table

    space = NB201Space()
    nb201_table()

    def objective(trial: Any) -> float:
        params = {k: trial.suggest_categorical(k, OPS) for k in space.distributions()}
        return float(nb201_table()[space.index(space.from_params(params)), 0])
    return objective


def run_frugalnas(n: int, uri: str) -> dict[str, Any]:
    import frugalnas
    from frugalnas.ports.keys import ARCHITECTURE_ATTR
    from frugalnas.tracking.mlflow import tracker as tracker_module

    # the writer's time per batch of trials, by trial number (timing only: same calls)
    batches: list[tuple[list[int], float]] = []
    write_trials = tracker_module.StudyTracker._write_trials

    def timed(self: Any, batch: list[Any]) -> None:
        start = time.perf_counter()
        write_trials(self, batch)
        batches.append(([r.number for r in batch], time.perf_counter() - start))

    tracker_module.StudyTracker._write_trials = timed  # type: ignore[method-assign]
    study = frugalnas.create_study(estimator="nb201-table", strategy="random", seed=0,
                                   study_name="scale",
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    start = time.perf_counter()
    study.optimize(n_trials=n)
    wall = time.perf_counter() - start
    state = study.plugin_state["mlflow"]

    def per_trial(lo: int, hi: int) -> float:
        seconds = sum(s * sum(lo <= x < hi for x in numbers) / len(numbers)
                      for numbers, s in batches)
        return seconds / max(1, hi - lo)

    trials = {t.number: t for t in study.trials}
    return {"wall": wall, "errors": state["errors"], "reconciled": state["reconciled"],
            "counters": state["counters"], "plugin_errors": [str(e) for e in study.plugin_errors],
            "first": per_trial(0, min(WINDOW, n)), "last": per_trial(max(0, n - WINDOW), n),
            "experiment_id": state["experiment_id"], "parent": state["parent_run_id"],
            "trials": {str(k): [str(t.user_attrs.get(ARCHITECTURE_ATTR, "")), t.value]
                       for k, t in trials.items()}}


def run_optuna(n: int, uri: str) -> dict[str, Any]:
    import optuna
    from optuna_integration.mlflow import MLflowCallback

    objective = lookup_objective()
    study = optuna.create_study(direction="maximize", sampler=optuna.samplers.RandomSampler(0),
                                study_name="scale")
    callback = MLflowCallback(tracking_uri=uri, metric_name="value")
    start = time.perf_counter()
    study.optimize(objective, n_trials=n, callbacks=[callback])
    return {"wall": time.perf_counter() - start}


def check_runs(uri: str, result: dict[str, Any], n: int) -> list[str]:
    """What is wrong with the frugalnas study's runs in the store (empty when all is right)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=uri)
    runs, token = [], None
    while True:
        page = client.search_runs([result["experiment_id"]], max_results=5000,
                                  page_token=token)
        runs += page
        token = page.token
        if not token:
            break
    problems = []
    trial_runs = [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"]
    parents = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"]
    numbers = sorted(int(r.data.tags["frugalnas.trial_number"]) for r in trial_runs)
    if numbers != list(range(n)):
        problems.append(f"{len(trial_runs)} trial runs for {n} trials "
                        f"({len(set(numbers))} distinct numbers)")
    if [p.info.status for p in parents] != ["FINISHED"]:
        problems.append(f"parent runs: {[p.info.status for p in parents]}")
    bad = [r for r in trial_runs if r.info.status != "FINISHED"
           or r.data.tags.get("mlflow.parentRunId") != result["parent"]]
    if bad:
        problems.append(f"{len(bad)} trial runs not FINISHED under the parent run")
    by_number = {int(r.data.tags["frugalnas.trial_number"]): r for r in trial_runs}
    for number in random.Random(1).sample(range(n), min(25, n)):
        run = by_number.get(number)
        arch, value = result["trials"][str(number)]
        if run is None:
            continue
        if run.data.params.get("architecture") != arch:
            problems.append(f"trial {number}: architecture param {run.data.params.get('architecture')!r} != {arch!r}")
        for key in ("value", "objective_value"):
            if abs(run.data.metrics.get(key, float("nan")) - value) > 1e-9:
                problems.append(f"trial {number}: metric {key} {run.data.metrics.get(key)} != {value}")
    return problems


def child(variant: str, n: int, uri: str, out: str) -> None:
    os.environ["FRUGALNAS_PROGRESS"] = "0"
    # MLflow's two "View run" lines per run on a tracking server: off for both variants
    os.environ["MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT"] = "true"
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    result = run_frugalnas(n, uri) if variant == "frugalnas" else run_optuna(n, uri)
    Path(out).write_text(json.dumps(result))


def start_server(tmp: Path, name: str) -> Any:
    sys.path.insert(0, str(ROOT / "tests"))
    from ops_support.servers import MlflowServer, free_port, mlflow_server_command

    port = free_port()
    command = mlflow_server_command(f"sqlite:///{tmp / (name + '-server.db')}",
                                    tmp / f"{name}-artifacts", port)
    return MlflowServer(command, port, tmp / f"{name}-server.log").wait_ready()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trials", type=int, default=10000)
    parser.add_argument("--store", choices=("sqlite", "http"), default="sqlite")
    parser.add_argument("--max-growth", type=float, default=1.2)
    parser.add_argument("--max-ratio", type=float, default=1.1)
    parser.add_argument("--child", nargs=3, metavar=("VARIANT", "URI", "OUT"),
                        help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], args.trials, args.child[1], args.child[2])
        return 0
    from frugalnas.testing import fresh_mlflow_uri

    tmp = Path(tempfile.mkdtemp(prefix="frugalnas-tracking-scale-"))
    results: dict[str, dict[str, Any]] = {}
    uris: dict[str, str] = {}
    for variant in ("frugalnas", "optuna"):
        server = start_server(tmp, variant) if args.store == "http" else None
        try:
            uri = server.uri if server is not None else fresh_mlflow_uri(tmp / f"{variant}.db")
            uris[variant] = uri
            out = tmp / f"{variant}.json"
            proc = subprocess.run([sys.executable, __file__, "--trials", str(args.trials),
                                   "--child", variant, uri, str(out)], cwd=tmp)
            if proc.returncode != 0:
                print(f"{variant}: the study's process exited {proc.returncode}")
                return 1
            results[variant] = json.loads(out.read_text())
            if variant == "frugalnas":
                results[variant]["problems"] = check_runs(uri, results[variant], args.trials)
        finally:
            if server is not None:
                server.stop()
    mine, theirs = results["frugalnas"], results["optuna"]
    growth = mine["last"] / mine["first"]
    ratio = mine["wall"] / theirs["wall"]
    n = args.trials
    print(f"{n} trials, MLflow store {args.store}")
    print(f"  frugalnas + MLflow:            {mine['wall']:8.1f} s wall ({mine['wall'] / n * 1000:.2f} ms a trial, drain included)")
    print(f"  optuna + MLflowCallback:       {theirs['wall']:8.1f} s wall ({theirs['wall'] / n * 1000:.2f} ms a trial)")
    print(f"  ratio frugalnas/optuna:        {ratio:.3f}  (goal <= {args.max_ratio})")
    print(f"  writer ms a trial, trials 0-{min(WINDOW, n) - 1}: {mine['first'] * 1000:.2f}; "
          f"last {min(WINDOW, n)}: {mine['last'] * 1000:.2f}; growth {growth:.3f}  "
          f"(goal <= {args.max_growth})")
    print(f"  writer counters: {mine['counters']}; reconciled {mine['reconciled']}")
    failures = list(mine["problems"])
    if mine["errors"] or mine["plugin_errors"]:
        failures.append(f"tracking errors: {mine['errors'] + mine['plugin_errors']}")
    if any(mine["reconciled"].values()) or mine["counters"]["created"] != n:
        failures.append(f"runs not all written by the writer: {mine['counters']}, "
                        f"{mine['reconciled']}")
    if growth > args.max_growth:
        failures.append(f"per-trial write cost grew {growth:.2f}x")
    if ratio > args.max_ratio:
        failures.append(f"wall time {ratio:.2f}x optuna's")
    for failure in failures:
        print(f"FAIL: {failure}")
    if not failures:
        print("OK: every run present and correct, no write dropped")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
