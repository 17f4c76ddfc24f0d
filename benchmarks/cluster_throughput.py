"""Trials per minute of a study on 1 and on N workers of a local Dask cluster.

Each trial sleeps ``--seconds`` (1 s) and then looks its architecture up in the NAS-Bench-201
table, so the figures measure how well the launcher, the shared sqlite storage and the
workers' exclusive proposals scale, not the machine's cores: two cores suffice. A
``LocalCluster`` on 127.0.0.1 (one thread per worker process, no dashboard) is started once and
its workers are warmed up (one throwaway trial each, so that frugalnas, this plugin and
optuna's RDB storage are imported) before timing; then the same
study runs ``--per-worker`` trials per worker on 1 worker and on ``--workers`` workers, each
through ``frugalnas.launchers.launch`` with a ``DaskLauncher`` and a fresh sqlite storage.
Two rates are printed per size: over the launch's wall time (each worker's start-up on the
study and the wait for the last trial included) and over the trials' own span (first start
to last completion). Goal: N = 8 workers reach >= 7x the trials per minute of one.

    python benchmarks/cluster_throughput.py [--workers 8] [--per-worker 12] [--seconds 1.0]

The module is also the plugin of the sleeping estimator (``bench-sleep``), which the Dask
workers import by name (this folder is put on their ``PYTHONPATH``).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.host.plugins import hookimpl

HERE = Path(__file__).resolve().parent
PLUGIN = "cluster_throughput"


class SleepyLookup(Estimator):
    """NB201 table lookup after ``seconds`` of sleep (a stand-in for a trial that waits on a
    device)."""

    name = "bench-sleep"
    needs_dataset = False

    def __init__(self, seconds: float = 1.0):
        from frugalnas.spaces.nb201.table import NB201TableEstimator

        self.seconds = float(seconds)
        self.table = NB201TableEstimator()

    def evaluate(self, arch: Any, context: TrialContext) -> EstimateResult:
        time.sleep(self.seconds)
        return self.table.evaluate(arch, context)


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"bench-sleep": SleepyLookup}


def _warm() -> str:
    """Run on each Dask worker before timing: one throwaway trial on a throwaway sqlite
    storage, so that the imports a worker's first trial needs (frugalnas, this plugin,
    optuna's RDB storage with SQLAlchemy and alembic) are done, as on a cluster that has
    run a study before. A cold worker pays them once, about a second of CPU."""
    from frugalnas.ports.config import StudyConfig
    from frugalnas.distribution.launcher import WorkerJob

    with tempfile.TemporaryDirectory() as tmp:
        config = StudyConfig.from_mapping({
            "space": "nb201", "strategy": "random", "estimator": "bench-sleep",
            "estimator_options": {"seconds": 0.0}, "plugins": [PLUGIN],
            "disable_plugins": ["mlflow", "progress"]})
        WorkerJob(config, f"sqlite:///{tmp}/warm.db", "warm", 1, heartbeat=1, grace=10).run()
    return str(os.getpid())


def measure(address: str, workers: int, trials: int, seconds: float, folder: Path) -> dict[str, float]:
    from frugalnas.ports.config import StudyConfig
    from frugalnas.launchers import launch
    from frugalnas.launchers.dask_cluster import DaskLauncher

    config = StudyConfig.from_mapping({
        "space": "nb201", "strategy": "random", "estimator": "bench-sleep",
        "estimator_options": {"seconds": seconds}, "plugins": [PLUGIN],
        "disable_plugins": ["mlflow", "progress"], "seed": workers})
    storage = f"sqlite:///{folder / f'w{workers}.db'}"
    start = time.monotonic()
    study = launch(config, storage, trials, DaskLauncher(address, workers=workers),
                   study_name=f"w{workers}", heartbeat=1, grace=10, isolate="none")
    wall = time.monotonic() - start
    done = [t for t in study.optuna_study.get_trials(deepcopy=False) if t.state.name == "COMPLETE"]
    assert len(done) == trials, f"{len(done)} of {trials} trials complete"
    span = (max(t.datetime_complete for t in done)
            - min(t.datetime_start for t in done)).total_seconds()
    return {"workers": workers, "trials": trials, "wall_s": wall, "span_s": span,
            "per_min_wall": 60 * trials / wall, "per_min_span": 60 * trials / span}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workers", type=int, default=8)
    parser.add_argument("--per-worker", type=int, default=12, help="trials per worker")
    parser.add_argument("--seconds", type=float, default=1.0, help="sleep per trial")
    args = parser.parse_args()
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(HERE), os.environ.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    os.environ["FRUGALNAS_PROGRESS"] = "0"
    sys.path.insert(0, str(HERE))
    from distributed import Client, LocalCluster

    with tempfile.TemporaryDirectory() as tmp, \
            LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                         host="127.0.0.1", dashboard_address=None,
                         silence_logs=logging.CRITICAL) as cluster, \
            Client(cluster) as client:
        client.run(_warm)
        rows = [measure(cluster.scheduler_address, n, n * args.per_worker, args.seconds,
                        Path(tmp)) for n in (1, args.workers)]
    for r in rows:
        print(f"{r['workers']:>2} worker(s): {r['trials']:>3} trials in {r['wall_s']:6.1f} s "
              f"wall ({r['per_min_wall']:6.1f} trials/min), trials' span {r['span_s']:6.1f} s "
              f"({r['per_min_span']:6.1f} trials/min)")
    one, many = rows
    print(f"speed-up of {args.workers} workers over 1: "
          f"{many['per_min_wall'] / one['per_min_wall']:.2f}x on wall time, "
          f"{many['per_min_span'] / one['per_min_span']:.2f}x over the trials' span "
          f"(ideal {args.workers}x; goal >= {args.workers - 1}x)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
