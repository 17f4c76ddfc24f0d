"""Chaos: workers killed with SIGKILL again and again while they share one study, on sqlite
and on PostgreSQL with an MLflow tracking server. The workers are started with the exact
commands of docs/operations.md's recipes (tests/ops_support/recipe.py).

After six kills (two per worker slot; each kill costs a worker's start-up, which is most of
the test's time) the surviving workers finish, and the study must hold exactly N complete
trials, no architecture counted twice, no MLflow run left open, and one run per finished
trial in the storage's state."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from ops_support.chaos import chaos, env_with_tests
from ops_support.checks import assert_exactly_n_distinct, assert_mlflow_follows_storage
from ops_support.recipe import ONE_MACHINE, SEVERAL_MACHINES, frugalnas_worker, read_recipe

TESTS = Path(__file__).resolve().parents[1]
N_TRIALS = 24  # a victim finishes at most one trial: ample for the kill phase to end first
KILLS = 6
WORKERS = 3
SECONDS = 0.4  # per trial: long enough to be killed in the middle of one


def _run_file(tmp_path: Path, strategy: str, **strategy_options) -> Path:
    options = "".join(f"{k} = {v}\n" for k, v in strategy_options.items())
    path = tmp_path / "run.toml"
    path.write_text(
        'space = "nb201"\n'
        f'strategy = "{strategy}"\n'
        'estimator = "ops-sleepy"\n'
        'plugins = ["ops_support.faults"]\n'
        "\n[estimator_options]\n"
        f"seconds = {SECONDS}\n"
        f'log = "{tmp_path / "trials.log"}"\n'
        + (f"\n[strategy_options]\n{options}" if options else ""))
    return path


def _starter(tmp_path: Path, command: list[str]):
    def start(name: str) -> subprocess.Popen:
        out = open(tmp_path / f"{name}.out", "w")
        # The run file names the fault plugin; a run file's plugin loads only when allowed.
        proc = subprocess.Popen([*command, "-p", "ops_support.faults"], cwd=tmp_path,
                                env=env_with_tests(TESTS), stdout=out,
                                stderr=subprocess.STDOUT)
        proc.out_path = tmp_path / f"{name}.out"
        return proc
    return start


def _check(report, storage: str, tracking: str, artifacts: bool = True) -> None:
    assert report.kills >= KILLS
    for proc in report.survivors:
        out = proc.out_path.read_text()
        assert proc.returncode == 0, f"worker {proc.pid} exited {proc.returncode}:\n{out[-3000:]}"
        assert "MLflow logging errors" not in out, out[-3000:]
        assert "Traceback" not in out, out[-3000:]
    assert_exactly_n_distinct(storage, "s1", N_TRIALS, report.evaluated)
    assert_mlflow_follows_storage(storage, tracking, "s1", artifacts=artifacts)


@pytest.mark.slow
def test_chaos_on_sqlite(tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    tracking = fresh_mlflow_uri(tmp_path / "mlflow.db")
    command = frugalnas_worker(read_recipe(ONE_MACHINE), {}, _run_file(tmp_path, "random"), {
        "--storage": storage, "--tracking-uri": tracking, "--n-trials": str(N_TRIALS),
        "--heartbeat": "1", "--grace": "2"})
    report = chaos(_starter(tmp_path, command), tmp_path / "trials.log", workers=WORKERS,
                   kills=KILLS, seed=1, max_delay=2 * SECONDS)
    _check(report, storage, tracking)


@pytest.mark.slow
def test_chaos_on_postgresql(tmp_path, postgres_server, mlflow_server):
    server, recipe_env = mlflow_server
    env = {**recipe_env, "STUDIES": postgres_server.new_database("studies")}
    run_file = _run_file(tmp_path, "regularized-evolution", n_init=6, population_size=8,
                         sample_size=3)
    command = frugalnas_worker(read_recipe(SEVERAL_MACHINES), env, run_file, {
        "--n-trials": str(N_TRIALS), "--heartbeat": "1", "--grace": "2"})
    assert env["STUDIES"] in command and server.uri in command
    report = chaos(_starter(tmp_path, command), tmp_path / "trials.log", workers=WORKERS,
                   kills=KILLS, seed=2, max_delay=2 * SECONDS)
    # (artifacts are listed through the server for the first trials only: one request each)
    _check(report, env["STUDIES"], server.uri)
