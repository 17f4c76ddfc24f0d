"""Exact quotas under load: rounds of workers sharing one study, one SIGKILLed mid-trial, on a
machine kept busy by a CPU hog.

Each round starts ``--workers`` (4) ``frugalnas worker`` processes on a fresh study of
``--trials`` (16) trials (heartbeat 1 s, grace 4 s, one retry; an MLflow store of its own),
while ``--hog`` (2) processes spin on the CPU. Once a worker is in the middle of a trial it is
killed with SIGKILL (after a random part of the trial) and not replaced; the others finish the
study. A round is exact when, at the end:

* the study holds exactly ``--trials`` COMPLETE trials, each a different architecture, and an
  architecture was evaluated twice only as the retry of the killed worker's trial;
* no trial is RUNNING or WAITING, no MLflow run is RUNNING, MLflow has one run per finished
  trial in the storage's state under one FINISHED parent run;
* every surviving worker exited 0, and none had a live trial failed as stale.

The rounds run on sqlite (``--sqlite-rounds``, 20) and on PostgreSQL (``--postgres-rounds``,
10; a throwaway server on 127.0.0.1 started with ``initdb``/``pg_ctl``, one database per round),
and the script prints one line per round and ``exact N/N`` per storage; it exits 1 when a
round is not exact.

    python benchmarks/chaos.py [--sqlite-rounds 20] [--postgres-rounds 10] [--hog 2]

The workers' estimator and the checks are those of the operations tests (``tests/ops_support``:
an NB201 table lookup after ``--seconds`` of sleep, logging each trial's start and end).
"""

from __future__ import annotations

import argparse
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
TESTS = REPO / "tests"
sys.path.insert(0, str(TESTS))

from ops_support.chaos import env_with_tests  # noqa: E402
from ops_support.checks import assert_exactly_n_distinct, assert_mlflow_follows_storage  # noqa: E402
from ops_support.faults import read_log  # noqa: E402

STALE_WARNING = "a trial of this worker was failed as stale"
STUDY = "chaos"


def _hog(processes: int) -> list[subprocess.Popen]:
    return [subprocess.Popen([sys.executable, "-c", "while True: pass"])
            for _ in range(processes)]


def _worker(folder: Path, name: str, storage: str, tracking: str, args: argparse.Namespace
            ) -> subprocess.Popen:
    cmd = [sys.executable, "-m", "frugalnas.cli.main", "worker", "-q",
           "-p", "ops_support.faults", "--space", "nb201", "--estimator", "ops-sleepy",
           "-o", f"estimator.seconds={args.seconds}",
           "-o", f"estimator.log='{folder / 'trials.log'}'",
           "--storage", storage, "--study-name", STUDY, "--tracking-uri", tracking,
           "--n-trials", str(args.trials), "--heartbeat", "1", "--grace", "4",
           "--retries", "1"]
    out = open(folder / f"{name}.out", "w")
    proc = subprocess.Popen(cmd, cwd=folder, env=env_with_tests(TESTS), stdout=out,
                            stderr=subprocess.STDOUT)
    out.close()
    return proc


def _kill_one_mid_trial(workers: list[subprocess.Popen], log: Path, rng: random.Random,
                        seconds: float, timeout: float = 300) -> int:
    """SIGKILL a worker a random part of ``seconds`` after it began a trial; its pid."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        started = [pid for e, _, pid in (read_log(log) if log.exists() else []) if e == "start"]
        if started:
            victim = next(w for w in workers if w.pid == started[0])
            time.sleep(rng.uniform(0.1, 0.9) * seconds)
            victim.send_signal(signal.SIGKILL)
            victim.wait(timeout=30)
            return victim.pid
        for w in workers:
            if w.poll() is not None:
                raise RuntimeError(f"worker {w.pid} exited ({w.returncode}) before any trial")
        time.sleep(0.05)
    raise RuntimeError(f"no worker began a trial in {timeout} s")


def run_round(storage: str, folder: Path, args: argparse.Namespace, seed: int) -> str | None:
    """One round; ``None`` when it was exact, else what was wrong."""
    from frugalnas.testing import fresh_mlflow_uri

    tracking = fresh_mlflow_uri(folder / "mlflow.db")
    workers = [_worker(folder, f"w{i}", storage, tracking, args) for i in range(args.workers)]
    try:
        killed = _kill_one_mid_trial(workers, folder / "trials.log", random.Random(seed),
                                     args.seconds)
        survivors = [w for w in workers if w.pid != killed]
        for w in survivors:
            w.wait(timeout=600)
    finally:
        for w in workers:
            if w.poll() is None:
                w.kill()
                w.wait()
    outputs = {w.pid: (folder / f"w{i}.out").read_text() for i, w in enumerate(workers)}
    for w in survivors:
        if w.returncode != 0:
            return f"worker {w.pid} exited {w.returncode}: {outputs[w.pid][-500:]}"
        if STALE_WARNING in outputs[w.pid]:
            return f"worker {w.pid} had a live trial failed as stale"
    evaluated = {n for e, n, _ in read_log(folder / "trials.log") if e == "start"}
    try:
        assert_exactly_n_distinct(storage, STUDY, args.trials, evaluated)
        assert_mlflow_follows_storage(storage, tracking, STUDY, artifacts=False)
    except AssertionError as exc:
        return f"{type(exc).__name__}: {exc}".splitlines()[0]
    return None


def run_rounds(label: str, rounds: int, new_storage, args: argparse.Namespace) -> int:
    exact = 0
    for r in range(rounds):
        with tempfile.TemporaryDirectory(prefix="chaos-") as tmp:
            begin = time.perf_counter()
            storage = new_storage(Path(tmp))
            wrong = run_round(storage, Path(tmp), args, seed=1000 * r + 7)
            exact += wrong is None
            if wrong is not None and args.keep:
                kept = Path(args.keep) / f"{label}-round{r + 1}"
                shutil.copytree(tmp, kept, dirs_exist_ok=True)
                (kept / "storage.txt").write_text(storage + "\n")
                wrong += f" (outputs kept in {kept})"
            print(f"{label} round {r + 1:2d}/{rounds}: "
                  f"{'exact' if wrong is None else 'NOT exact: ' + wrong} "
                  f"({time.perf_counter() - begin:.0f} s)", flush=True)
    print(f"{label}: exact {exact}/{rounds}", flush=True)
    return rounds - exact


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sqlite-rounds", type=int, default=20)
    parser.add_argument("--postgres-rounds", type=int, default=10)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--trials", type=int, default=16)
    parser.add_argument("--seconds", type=float, default=0.5, help="length of a trial")
    parser.add_argument("--hog", type=int, default=2, help="CPU-spinning processes")
    parser.add_argument("--keep", default=None,
                        help="a folder where the outputs of a round that is not exact are kept")
    args = parser.parse_args(argv)
    print(f"chaos: {args.workers} workers, {args.trials} trials, heartbeat 1 s, grace 4 s, "
          f"retries 1, one SIGKILL per round, {args.hog} CPU hog(s)", flush=True)
    hogs = _hog(args.hog)
    not_exact = 0
    try:
        if args.sqlite_rounds:
            not_exact += run_rounds("sqlite", args.sqlite_rounds,
                                    lambda tmp: f"sqlite:///{tmp / 'study.db'}", args)
        if args.postgres_rounds:
            from ops_support.servers import PostgresServer, postgres_missing

            missing = postgres_missing()
            if missing:
                print(f"postgresql: not run ({missing})", flush=True)
                return 1
            server = PostgresServer().start()
            try:
                not_exact += run_rounds("postgresql", args.postgres_rounds,
                                        lambda tmp: server.new_database("chaos"), args)
            finally:
                server.stop()
    finally:
        for h in hogs:
            h.kill()
            h.wait()
    return 1 if not_exact else 0


if __name__ == "__main__":
    sys.exit(main())
