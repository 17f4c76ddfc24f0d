"""A study whose storage fails for good (its folder made read-only mid-study): the command
ends in one line, what was recorded is kept, the MLflow parent run ends FAILED while the MLflow
store can be written, and the next start of the study puts MLflow right.

Permissions do not bind root, so as root the study runs in a user namespace of its own
(``unshare --user``) without capabilities: it still owns root's files, so it reads the checkout
wherever that lies, and a folder without write permission binds it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import optuna
import pytest

from ops_support.checks import mlflow_runs

#: A plugin that makes the study's folder read-only (its files too, as ``chmod -R a-w``
#: does) once trial 2 ends, after the MLflow parent run exists.
READ_ONLY_PLUGIN = '''
import logging
import os
import time
from pathlib import Path

from frugalnas.host.plugins import hookimpl


@hookimpl
def frugalnas_trial_finished(study, report):
    if report.number != 2:
        return
    from mlflow import MlflowClient

    logging.getLogger("mlflow").setLevel(logging.WARNING)  # a new store says so on stderr
    client = MlflowClient(os.environ["RO_TRACKING"])
    role = "tags.`frugalnas.role` = 'study'"
    end = time.monotonic() + 120
    while time.monotonic() < end:
        exp = client.get_experiment_by_name(study.name)
        if exp is not None and client.search_runs([exp.experiment_id], filter_string=role):
            break
        time.sleep(0.2)
    folder = Path(os.environ["RO_FOLDER"])
    for path in folder.iterdir():
        path.chmod(0o444)
    folder.chmod(0o555)
'''

#: root without its capabilities (``nobody`` in a user namespace of its own)
UNPRIVILEGED = ["unshare", "--user", "--map-user=65534", "--map-group=65534"]


@pytest.fixture
def work():
    folder = Path(tempfile.mkdtemp(prefix="frugalnas-readonly-"))
    (folder / "study").mkdir()
    (folder / "read_only_plugin.py").write_text(READ_ONLY_PLUGIN)
    if os.geteuid() == 0:
        subprocess.run(["chmod", "a-w", str(folder)], check=True)
        probe = subprocess.run([*UNPRIVILEGED, "sh", "-c", f"! touch {folder}/probe 2>/dev/null"],
                               capture_output=True, text=True, check=False)
        subprocess.run(["chmod", "u+w", str(folder)], check=True)
        if probe.returncode != 0:
            pytest.skip(f"as root, without user namespaces a read-only folder binds no one: "
                        f"{probe.stderr.strip()}")
    yield folder
    subprocess.run(["chmod", "-R", "u+w", str(folder)], check=False)
    shutil.rmtree(folder, ignore_errors=True)


def _run(work: Path, n_trials: int) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("MLFLOW_TRACKING", "PYTHONPATH"))}
    env.update(HOME=str(work), PYTHONPATH=str(work), FRUGALNAS_PROGRESS="0",
               PYTHONWARNINGS="ignore", RO_FOLDER=str(work / "study"),
               RO_TRACKING=f"sqlite:///{work / 'mlflow.db'}")
    user = UNPRIVILEGED if os.geteuid() == 0 else []
    return subprocess.run(
        [*user, sys.executable, "-m", "frugalnas.cli.main", "run", "-q", "-p", "read_only_plugin",
         "--space", "nb201", "--estimator", "nb201-table", "--n-trials", str(n_trials),
         "--storage", f"sqlite:///{work / 'study' / 's.db'}", "--study-name", "s",
         "--tracking-uri", env["RO_TRACKING"]],
        cwd=work, env=env, capture_output=True, text=True, timeout=300)


@pytest.mark.slow
def test_a_read_only_study_folder_ends_the_run_in_one_line_and_its_parent_run_failed(work):
    storage = f"sqlite:///{work / 'study' / 's.db'}"
    tracking = f"sqlite:///{work / 'mlflow.db'}"
    first = _run(work, 10)
    assert first.returncode == 2, first.stderr[-3000:]
    assert first.stderr.count("\n") == 1, first.stderr
    assert first.stderr.startswith(f"frugalnas: error: storage {storage!r} failed: ")
    assert "readonly database" in first.stderr and "what was recorded before it is kept" \
        in first.stderr
    _, trial_runs, parents = mlflow_runs(tracking, "s")
    assert [p.info.status for p in parents] == ["FAILED"]
    assert all(r.info.status != "RUNNING" for r in trial_runs)

    # made writable again, the same command continues the study and MLflow follows it
    subprocess.run(["chmod", "-R", "u+w", str(work / "study")], check=True)
    again = _run(work, 2)
    assert again.returncode == 0, again.stderr[-3000:]
    trials = optuna.load_study(study_name="s", storage=storage).trials
    complete = {t.number for t in trials if t.state == optuna.trial.TrialState.COMPLETE}
    assert len(complete) == 4  # two before the failure, two now
    _, trial_runs, parents = mlflow_runs(tracking, "s")
    assert [p.info.status for p in parents] == ["FINISHED"]
    runs = {int(r.data.tags["frugalnas.trial_number"]): r.info.status for r in trial_runs}
    assert len(runs) == len(trial_runs)  # one run per trial
    assert set(runs) == {t.number for t in trials if t.state.is_finished()}
    assert {runs[n] for n in complete} == {"FINISHED"}
    assert "RUNNING" not in runs.values()
