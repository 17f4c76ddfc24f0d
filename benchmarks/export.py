"""Cost of ``frugalnas export`` relative to the training of one trial.

Runs one ``train``-estimator trial (NB201, ``--N``/``--C``, ``--epochs`` on ``--dataset``), with
MLflow tracking into a fresh sqlite store, then evaluates the trial's architecture again
``--repeats`` times (``study.evaluate``: the same training, warm, nothing recorded) and exports
the trial ``--repeats`` times with the same number of epochs (``--export-epochs`` to change
it): retraining from scratch on train + validation, TorchScript, torch.export and ONNX files
checked against the module, latency, report.json and the MLflow model. Prints the seconds of
each part and the ratio

    export seconds / seconds of one trial's training (the estimator's ``cost.seconds``)

for the first export (cold: first torch.export/ONNX/MLflow-model calls in the process) over
the trial itself (also cold), and the median of the other exports over the median of the
re-evaluations (warm). With equal epochs, the ratio minus the training share is the price of
the deployable files; the training share grows with the extra examples (train + validation)
and any extra epochs.

    python benchmarks/export.py [--dataset digits] [--N 1] [--C 8] [--epochs 1] [--repeats 3]
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import optuna
import torch

import frugalnas
from frugalnas.testing import fresh_mlflow_uri

os.environ["FRUGALNAS_PROGRESS"] = "0"
optuna.logging.set_verbosity(optuna.logging.WARNING)

PARTS = ("train", "write_torchscript", "write_export", "write_onnx", "mlflow")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--N", type=int, default=1)
    parser.add_argument("--C", type=int, default=8)
    parser.add_argument("--epochs", type=float, default=1.0)
    parser.add_argument("--export-epochs", type=float, default=None)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--threads", type=int, default=1, help="torch threads (default 1)")
    parser.add_argument("--no-mlflow", action="store_true")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    tmp = Path(tempfile.mkdtemp(prefix="frugalnas-export-bench-"))
    tracking = ({"disable_plugins": ["mlflow", "progress"]} if args.no_mlflow else
                {"plugin_options": {"mlflow": {"tracking_uri": fresh_mlflow_uri(tmp / "mlflow.db")}},
                 "disable_plugins": ["progress"]})
    study = frugalnas.create_study(
        space="nb201", estimator="train", dataset=args.dataset, strategy="random",
        space_options={"N": args.N, "C": args.C}, seed=args.seed,
        estimator_options={"epochs": args.epochs, "batch_size": args.batch_size},
        storage=f"sqlite:///{tmp / 'optuna.db'}", study_name="export-bench", **tracking)
    study.load_dataset()  # loading the data is not part of either cost
    study.optimize(n_trials=1)
    trial = study.best_trial
    trial_seconds = float(trial.user_attrs["cost"]["seconds"])
    epochs = args.export_epochs if args.export_epochs is not None else args.epochs
    warm_trial = []
    for _ in range(max(1, args.repeats)):
        warm_trial.append(study.evaluate(trial.architecture).cost.seconds)
    trial_warm = statistics.median(warm_trial)
    print(f"trial {trial.number}: {trial.architecture}")
    print(f"  {args.dataset}, NB201 N={args.N} C={args.C}, {args.epochs:g} epoch(s), batch "
          f"{args.batch_size}, {args.threads} torch thread(s): training took {trial_seconds:.2f} s "
          f"cold (the trial), {trial_warm:.2f} s warm (median of {len(warm_trial)} "
          f"re-evaluations); valid accuracy {trial.value:.2f}%")
    runs = []
    for r in range(max(1, args.repeats)):
        start = time.perf_counter()
        exported = frugalnas.export_study(study, tmp / f"export-{r}", epochs=epochs,
                                          progress=False)
        total = time.perf_counter() - start
        seconds = dict(exported.report["seconds"])
        seconds["wall"] = total
        runs.append(seconds)
        base = trial_seconds if r == 0 else trial_warm
        print(f"  export {r} ({'cold' if r == 0 else 'warm'}): {total:.2f} s = "
              f"{total / base:.2f}x one trial's training; test accuracy "
              f"{exported.test_accuracy:.2f}%")
    header = f"{'part':<18}{'cold s':>10}{'cold x':>9}{'warm s':>10}{'warm x':>9}"
    print("\n" + header + "\n" + "-" * len(header))
    for part in (*PARTS, "other", "wall"):
        def value(run: dict) -> float:
            if part == "other":
                return run["wall"] - sum(run.get(p, 0.0) for p in PARTS)
            return run.get(part, 0.0)
        cold = value(runs[0])
        warm = statistics.median(value(run) for run in runs[1:]) if len(runs) > 1 else float("nan")
        print(f"{part:<18}{cold:>10.2f}{cold / trial_seconds:>9.2f}{warm:>10.2f}"
              f"{warm / trial_warm:>9.2f}")
    print(f"{'(one trial)':<18}{trial_seconds:>10.2f}{1:>9.2f}{trial_warm:>10.2f}{1:>9.2f}")
    warm_runs = runs[1:] or runs
    ratio = statistics.median(run["wall"] for run in warm_runs) / trial_warm
    print(f"\nexport / one trial's training: {runs[0]['wall'] / trial_seconds:.2f}x cold, "
          f"{ratio:.2f}x warm (median of {len(warm_runs)} export(s))")


if __name__ == "__main__":
    main()
