"""Settings of one machine are settings of the run: two ``frugalnas worker`` processes of one
study, each with its own device spelling, thread count, virtual-node address and name of the
tracking server, share the study and complete its quota; a worker that disagrees on what the
study is (its seed) is refused in one line."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest
from mlflow import MlflowClient
from optuna.trial import TrialState

from ops_support.chaos import env_with_tests
from ops_support.faults import read_log

TESTS = Path(__file__).resolve().parents[1]
PLUGIN = "ops_support.faults"


def _worker(tmp_path: Path, name: str, n_trials: int, *machine: str) -> subprocess.Popen:
    """A worker of study "shared": the same study settings, ``machine`` flags of its own."""
    cmd = [sys.executable, "-m", "frugalnas.cli.main", "worker", "-q", "-p", PLUGIN,
           "--space", "nb201", "--estimator", "ops-sleepy", "--backend", "virtual-node",
           "-o", "estimator.seconds=1.0", "-o", f"estimator.log='{tmp_path / 'trials.log'}'",
           "-o", f"estimator.control_dir='{tmp_path / 'control'}'",
           "--storage", f"sqlite:///{tmp_path / 'optuna.db'}", "--study-name", "shared",
           "--n-trials", str(n_trials), *machine]
    out = open(tmp_path / f"{name}.out", "w")
    return subprocess.Popen(cmd, cwd=tmp_path, env=env_with_tests(TESTS), stdout=out, stderr=subprocess.STDOUT)


@pytest.mark.slow
def test_workers_with_their_own_device_threads_address_and_tracking_uri_share_one_study(
        tmp_path, sqlite_mlflow_server):
    (tmp_path / "control").mkdir()
    port = sqlite_mlflow_server.port
    n = 8
    first = _worker(tmp_path, "first", n, "-o", "backend.device=cpu", "-o", "backend.threads=1",
                    "-o", "backend.master_addr='127.0.0.1'",
                    "--tracking-uri", f"http://127.0.0.1:{port}")
    second = _worker(tmp_path, "second", n, "-o", "backend.device=auto", "-o", "backend.threads=2",
                     "-o", "backend.master_addr='localhost'", "-o", "backend.master_port=29511",
                     "--tracking-uri", f"http://localhost:{port}/")
    for proc, name in ((first, "first"), (second, "second")):
        rc = proc.wait(timeout=600)
        out = (tmp_path / f"{name}.out").read_text()
        assert rc == 0, out[-3000:]
        assert f"worker {proc.pid} done: study 'shared' has" in out, out[-3000:]

    trials = optuna.load_study(study_name="shared",
                               storage=f"sqlite:///{tmp_path / 'optuna.db'}").get_trials()
    assert sorted(t.number for t in trials) == list(range(n))
    assert all(t.state == TrialState.COMPLETE for t in trials)
    owners = {pid for event, _, pid in read_log(tmp_path / "trials.log") if event == "start"}
    assert owners == {first.pid, second.pid}, "both workers must have run trials of the study"

    client = MlflowClient(tracking_uri=sqlite_mlflow_server.uri)
    experiment = client.get_experiment_by_name("shared")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    assert sum(r.data.tags.get("frugalnas.role") == "study" for r in runs) == 1
    assert sorted(int(r.data.tags["frugalnas.trial_number"]) for r in runs
                  if r.data.tags.get("frugalnas.role") == "trial") == list(range(n))

    # what defines the study stays pinned: another seed is another study
    other = _worker(tmp_path, "other", n + 2, "--seed", "7",
                    "--tracking-uri", f"http://127.0.0.1:{port}")
    assert other.wait(timeout=300) == 2
    out = (tmp_path / "other.out").read_text()
    assert out.startswith("frugalnas: error: study 'shared' exists with a different "
                          "configuration") and out.count("\n") == 1, out
    assert "seed: 0 -> 7" in out and "backend_options" not in out and "tracking_uri" not in out
