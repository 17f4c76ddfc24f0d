import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from frugalnas.testing import fresh_mlflow_uri

REPO = Path(__file__).resolve().parents[1]


def frugalnas_cli(*args, cwd, check=True, env=None):
    full_env = {**os.environ, "FRUGALNAS_PROGRESS": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "frugalnas.core.cli", *args], cwd=cwd,
                          capture_output=True, text=True, env=full_env, timeout=600)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.mark.slow
def test_readme_first_study(tmp_path):
    """The README's first study: one parent run and one nested run per trial, with params,
    metrics and both artifacts, and a progress bar on stderr."""
    fresh_mlflow_uri(tmp_path / "mlflow.db")  # the run file names ./mlflow.db
    proc = frugalnas_cli("run", str(REPO / "examples" / "first_study.toml"), cwd=tmp_path)
    assert "trial(s) completed" in proc.stdout
    assert "8/8" in proc.stderr  # progress bar
    client = MlflowClient(tracking_uri=f"sqlite:///{tmp_path / 'mlflow.db'}")
    exp = client.get_experiment_by_name("first-study")
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"]
    trials = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and len(trials) == 8
    for run in trials:
        assert run.data.tags["mlflow.parentRunId"] == parents[0].info.run_id
        assert "edge_1_0" in run.data.params and "valid_accuracy" in run.data.metrics
        assert {a.path for a in client.list_artifacts(run.info.run_id)} >= {"architecture.json", "cell.png"}
    # re-running the same command continues the stored study
    frugalnas_cli("run", str(REPO / "examples" / "first_study.toml"), "--n-trials", "1", cwd=tmp_path)
    runs = client.search_runs([exp.experiment_id])
    assert sum(1 for r in runs if r.data.tags.get("mlflow.parentRunId")) == 9


def test_plugins_command_lists_builtins(tmp_path):
    out = frugalnas_cli("plugins", cwd=tmp_path).stdout
    for name in ("nb201", "random", "single-device", "mlflow", "train", "nb201-table", "digits"):
        assert name in out
    data = json.loads(frugalnas_cli("plugins", "--json", cwd=tmp_path).stdout)
    names = {p["name"] for p in data["plugins"]}
    assert {"nb201", "mlflow", "progress"} <= names
    blocked = json.loads(frugalnas_cli("plugins", "--json", "-p", "no:random", cwd=tmp_path).stdout)
    assert "random" not in {c["name"] for c in blocked["components"]["strategies"]}


def test_run_with_flags_and_dry_run(tmp_path):
    proc = frugalnas_cli("run", "--estimator", "nb201-table", "--n-trials", "3", "--no-tracking",
                         "-o", "estimator.dataset=cifar10", "--dry-run", cwd=tmp_path)
    plan = json.loads(proc.stdout)
    assert plan["estimator"]["options"] == {"dataset": "cifar10"}
    assert "mlflow" not in plan["plugins"] and plan["run"]["n_trials"] == 3
    proc = frugalnas_cli("run", "--n-trials", "3", "--no-tracking", "-q", cwd=tmp_path)
    assert "3 trial(s) completed" in proc.stdout


@pytest.mark.parametrize("args, fragment", [
    (["run", "--space", "nb-201"], "unknown search space 'nb-201'"),
    (["run", "-o", "estimator.epochz=2", "--estimator", "train"], "unknown option 'epochz'"),
    (["run", "-o", "widget.x=1"], "unknown option group 'widget'"),
    (["run", "-p", "not_a_plugin_module"], "'not_a_plugin_module' failed to import"),
])
def test_cli_errors_exit_2_with_a_message(tmp_path, args, fragment):
    proc = frugalnas_cli(*args, "--no-tracking", cwd=tmp_path, check=False)
    assert proc.returncode == 2
    assert fragment in proc.stderr
