import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from frugalnas.testing import fresh_mlflow_uri

REPO = Path(__file__).resolve().parents[2]


def frugalnas_cli(*args, cwd, check=True, env=None, timeout=600):
    full_env = {**os.environ, "FRUGALNAS_PROGRESS": "1", **(env or {})}
    proc = subprocess.run([sys.executable, "-m", "frugalnas.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, env=full_env, timeout=timeout)
    if check and proc.returncode != 0:
        raise AssertionError(f"exit {proc.returncode}\n{proc.stdout}\n{proc.stderr}")
    return proc


@pytest.mark.slow
def test_readme_first_study(tmp_path):
    """The README's first study: one parent run and one nested run per trial, with params,
    metrics and both artifacts, and a progress bar on stderr."""
    fresh_mlflow_uri(tmp_path / "mlflow.db")  # the run file names ./mlflow.db
    # under a minute on a quiet machine; the limit leaves room for a loaded one
    proc = frugalnas_cli("run", str(REPO / "examples" / "first_study.toml"), cwd=tmp_path,
                         timeout=1500)
    assert "trial(s) completed" in proc.stdout
    # it says where the results are and how to look at them
    assert "results: optuna study 'first-study' in sqlite:///frugalnas.db" in proc.stdout
    assert "frugalnas ui --study-name first-study" in proc.stdout
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
    # then the README's Python snippet continues the same study (one trial instead of 8)
    snippet = readme_python_snippet().replace("study.optimize(n_trials=8)",
                                              "study.optimize(n_trials=1)")
    proc = subprocess.run([sys.executable, "-c", snippet], cwd=tmp_path, capture_output=True,
                          text=True, timeout=900, env={**os.environ, "FRUGALNAS_PROGRESS": "0"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.startswith("nb201:"), proc.stdout
    runs = client.search_runs([exp.experiment_id])
    assert sum(1 for r in runs if r.data.tags.get("mlflow.parentRunId")) == 10
    assert sorted(p.name for p in tmp_path.iterdir() if not p.name.endswith(".lock")) == [
        "default-mlflow.db", "frugalnas.db", "mlartifacts", "mlflow.db"]


def readme_python_snippet() -> str:
    """The README's "same from Python" code block."""
    text = (REPO / "README.md").read_text()
    section = text.split("## The same from Python", 1)[1]
    return section.split("```python\n", 1)[1].split("```", 1)[0]


def test_readme_python_snippet_continues_the_run_files_study(tmp_path, monkeypatch):
    """The snippet gives every setting the run file stores, so its ``create_study`` reopens
    the study that ``frugalnas run examples/first_study.toml`` created (no training here)."""
    from dataclasses import asdict

    import frugalnas
    from frugalnas.ports.config import load_run_file

    monkeypatch.chdir(tmp_path)
    fresh_mlflow_uri(tmp_path / "mlflow.db")
    config, run = load_run_file(REPO / "examples" / "first_study.toml")
    cfg = asdict(config)
    frugalnas.create_study(storage=run["storage"], study_name=run["study_name"],
                           **{k: v for k, v in cfg.items() if k != "directions"},
                           directions=config.directions)
    opening = readme_python_snippet().split("study.optimize(", 1)[0]
    namespace: dict = {}
    exec(opening, namespace)  # a ConfigConflictError here names each differing setting
    assert namespace["study"].config == config


# The command lines below only list, check or run a few table lookups: they run in one
# interpreter (ops_support.cli_driver), each with its own stdout, stderr and exit status.
PLUGINS = [["plugins"], ["plugins", "--json"], ["plugins", "--json", "-p", "no:random"]]
RUN_FLAGS = [["run", "--estimator", "nb201-table", "--n-trials", "3", "--no-tracking",
              "-o", "estimator.dataset=cifar10", "--dry-run"],
             ["run", "--n-trials", "3", "--no-tracking", "-q"],
             ["run", "--estimator", "train", "--dataset", "digits", "--pruner", "median",
              "--no-tracking", "-o", "estimator.lr=0.1", "--dry-run"]]
ERRORS = [
    (["run", "--space", "nb-201"], "unknown search space 'nb-201'"),
    (["run", "-o", "estimator.epochz=2", "--estimator", "train"], "unknown option 'epochz'"),
    (["run", "-o", "widget.x=1"], "unknown option group 'widget'"),
    (["run", "-p", "not_a_plugin_module"], "'not_a_plugin_module' failed to import"),
]


@pytest.fixture(scope="module")
def cli_results(tmp_path_factory):
    """{tuple(argv): {"rc", "out", "err"}} for every command line above."""
    from ops_support.cli_driver import cli_cases

    cases = [*PLUGINS, *RUN_FLAGS, *([*args, "--no-tracking"] for args, _ in ERRORS)]
    env = {**os.environ, "FRUGALNAS_PROGRESS": "1"}
    results = cli_cases(cases, tmp_path_factory.mktemp("cli"), env=env, timeout=600)
    return {tuple(argv): result for argv, result in zip(cases, results)}


def _ok(result: dict) -> dict:
    assert result["rc"] in (0, None), result
    return result


def test_plugins_command_lists_builtins(cli_results):
    out = _ok(cli_results[tuple(PLUGINS[0])])["out"]
    for name in ("nb201", "random", "single-device", "mlflow", "train", "nb201-table", "digits"):
        assert name in out
    data = json.loads(_ok(cli_results[tuple(PLUGINS[1])])["out"])
    names = {p["name"] for p in data["plugins"]}
    assert {"nb201", "mlflow", "progress"} <= names
    blocked = json.loads(_ok(cli_results[tuple(PLUGINS[2])])["out"])
    assert "random" not in {c["name"] for c in blocked["components"]["strategies"]}


def test_run_with_flags_and_dry_run(cli_results):
    plan = json.loads(_ok(cli_results[tuple(RUN_FLAGS[0])])["out"])
    # every option of every component, given or by default
    assert plan["estimator"]["options"] == {"dataset": "cifar10", "select_on": "valid",
                                            "simulated_epochs": 200.0, "known_hardware": True,
                                            "any_network": False}
    assert "mlflow" not in plan["plugins"] and plan["run"]["n_trials"] == 3
    assert "3 trial(s) completed" in _ok(cli_results[tuple(RUN_FLAGS[1])])["out"]
    plan = json.loads(_ok(cli_results[tuple(RUN_FLAGS[2])])["out"])
    assert {k: plan["estimator"]["options"][k] for k in ("lr", "momentum", "epochs")} \
        == {"lr": 0.1, "momentum": 0.9, "epochs": 1.0}
    assert plan["pruner"]["options"]["n_startup_trials"] == 5


@pytest.mark.parametrize("args, fragment", ERRORS)
def test_cli_errors_exit_2_with_a_message(cli_results, args, fragment):
    result = cli_results[(*args, "--no-tracking")]
    assert result["rc"] == 2
    assert fragment in result["err"]


def test_the_closing_line_counts_completed_trials_and_names_the_others(tmp_path, capsys):
    import optuna

    from frugalnas.cli.main import main

    storage = f"sqlite:///{tmp_path / 'study.db'}"
    args = ["run", "-q", "--no-tracking", "--estimator", "nb201-table", "--storage", storage,
            "--study-name", "s", "--n-trials", "2"]
    assert main(args) == 0
    optuna.load_study(study_name="s", storage=storage).ask()  # another worker's, running
    capsys.readouterr()
    assert main(args) == 0
    assert "study 's': 2 trial(s) completed this run, 4 in total (1 more failed, pruned or " \
        "unfinished)" in capsys.readouterr().out


COUNTING_PLUGIN = '''
import os

def frugalnas_check_config(config, host):
    with open(os.environ["COUNT_FILE"], "a") as out:
        out.write("check\\n")
'''


def test_run_checks_the_configuration_and_builds_the_components_once(tmp_path):
    """``frugalnas run`` plans a study once (one host, one check, one build) and opens that
    plan; it does not check and build again when it creates the study."""
    (tmp_path / "tp_counting.py").write_text(COUNTING_PLUGIN)
    count = tmp_path / "count.txt"
    proc = frugalnas_cli("run", "--space", "nb201", "--n-trials", "2", "--no-tracking",
                         "-p", "tp_counting", "-o", "estimator.any_network=true",
                         "-o", "space.N=1", "-o", "space.C=4", cwd=tmp_path,
                         env={"PYTHONPATH": os.pathsep.join([str(tmp_path), *sys.path]),
                              "COUNT_FILE": str(count), "FRUGALNAS_PLUGINS_ALLOW": "tp_counting"})
    assert "2 trial(s) completed this run" in proc.stdout
    assert count.read_text().splitlines() == ["check"]
