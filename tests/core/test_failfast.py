"""Fail fast, fail loud: everything that can be checked before the first trial is,
``--dry-run`` runs exactly those checks, every bad value is one line (exit 2) that names it and
what would be valid, nothing is written to the storage when a check fails, and a run in which
no trial completed or a plugin hook raised exits 1 with a one-line summary.

The command line runs as real subprocesses. Starting one costs seconds, so the bad-input
cases run in one process that calls the CLI's ``main`` once per case
(``ops_support.cli_driver``)."""

from __future__ import annotations

import json
import os
import pickle
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

import frugalnas
from frugalnas import ConfigError, PluginError
from frugalnas.engine import storage_url
from frugalnas.ports.errors import ConfigConflictError, PluginHookError
from frugalnas.engine.storage_url import check_storage_url
from ops_support.cli_driver import cli_cases as ops_cli_cases

NO_PLUGINS = {"disable_plugins": ["mlflow", "progress"]}
OFF = {**NO_PLUGINS, "dataset": None}


def _env(tmp_path: Path) -> dict[str, str]:
    return {**os.environ, "FRUGALNAS_PROGRESS": "0",
            "PYTHONPATH": os.pathsep.join([str(tmp_path), os.environ.get("PYTHONPATH", "")])}


def cli_cases(cases: list[list[str]], cwd: Path) -> list[dict]:
    """Run ``frugalnas ARGV`` for each case in one fresh interpreter."""
    return ops_cli_cases(cases, cwd, env=_env(cwd))


def cli(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frugalnas.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, env=_env(cwd), timeout=300)


def files(root: Path) -> set[str]:
    return {str(p.relative_to(root)) for p in root.rglob("*")}


def _cifar_batch(path: Path) -> None:
    with open(path, "wb") as fh:
        pickle.dump({"data": [[0] * 3072] * 4, "labels": [0, 1, 0, 1]}, fh)


RAISING_CHECK = """
import frugalnas

@frugalnas.hookimpl
def frugalnas_check_config(config, host):
    {}["missing"]
"""

RAISING_LIFECYCLE = """
import frugalnas

@frugalnas.hookimpl
def frugalnas_trial_finished(report):
    raise ValueError("cannot record a " + report.state.name + " trial")

@frugalnas.hookimpl
def frugalnas_study_finished(study):
    raise RuntimeError("flush failed")
"""

FAILING_ESTIMATOR = """
import frugalnas

class AlwaysFails(frugalnas.Estimator):
    '''Fails every evaluation.'''
    needs_dataset = False

    def evaluate(self, arch, context):
        raise RuntimeError("simulated evaluation failure")

@frugalnas.hookimpl
def frugalnas_estimators():
    return {"always-fails": AlwaysFails}
"""

BAD = ["run", "--no-tracking", "-q"]

# (argv, fragments the one-line message must hold); {tmp} is the test's directory.
BAD_INPUT = [
    # numbers and run settings, with and without --dry-run
    (BAD + ["--n-trials", "-5", "--dry-run"], ["n_trials -5", "integer >= 1"]),
    (BAD + ["--n-trials", "-5"], ["n_trials -5", "integer >= 1"]),
    (["run", "ten.toml", "--no-tracking", "--dry-run"], ["n_trials 'ten'", "integer >= 1"]),
    (BAD + ["--n-jobs", "0", "--dry-run"], ["n_jobs 0", ">= 1", "-1"]),
    (BAD + ["--timeout", "0", "--dry-run"], ["timeout 0.0", "seconds > 0"]),
    (BAD + ["--trial-timeout", "-1", "--dry-run"], ["trial_timeout -1.0", "seconds > 0"]),
    (BAD + ["--seed", "-1", "--dry-run"], ["seed -1", "valid range: [0, "]),
    (["worker", "--no-tracking", "--storage", "sqlite:///w.db", "--n-trials", "-5", "--dry-run"],
     ["n_trials -5", "integer >= 1"]),
    (["worker", "--no-tracking", "--storage", "sqlite:///{tmp}/w.db", "--n-trials", "2",
      "--max-failures", "-1", "--dry-run"], ["invalid max_failures -1"]),
    # storage URLs: scheme, driver, directory
    (BAD + ["--storage", "study.db"], ["'study.db'", "sqlite:///study.db", "journal:PATH",
                                       "postgresql://"]),
    (BAD + ["--storage", "study.db", "--dry-run"], ["'study.db'", "sqlite:///PATH"]),
    (BAD + ["--storage", "postgres://me:hunter2@db/nas"], ["'postgres://me:***@db/nas'",
                                                         "did you mean postgresql://"]),
    (BAD + ["--storage", "mysql+pymysql://me:hunter2@db/nas"],
     ["'mysql+pymysql://me:***@db/nas'", "'pymysql'", "pip install pymysql"]),
    (BAD + ["--storage", "postgresql+pg8000://me@db/nas"], ["pip install pg8000"]),
    (BAD + ["--storage", "mysql+aiomysql://db/nas"], ["'aiomysql'", "pymysql", "async"]),
    (BAD + ["--storage", "sqlite:///{tmp}/no/such/dir/s.db"],
     ["'{tmp}/no/such/dir'", "does not exist"]),
    (BAD + ["--storage", "sqlite://s.db"], ["'sqlite://s.db'", "sqlite:///s.db"]),
    (["worker", "--no-tracking", "--storage", "s.db", "--n-trials", "3", "--dry-run"],
     ["'s.db'", "sqlite:///s.db"]),
    (["worker", "--no-tracking", "--storage", "journal:w.log", "--n-trials", "3",
      "--heartbeat", "1", "--dry-run"], ["heartbeats need an RDB storage", "'journal:w.log'"]),
    # datasets: required options, paths, files
    (BAD + ["--estimator", "train", "--dataset", "cifar", "--dry-run"],
     ["dataset 'cifar'", "'path'", "-o dataset.path="]),
    (BAD + ["--estimator", "train", "--dataset", "cifar", "--n-trials", "1",
            "--storage", "sqlite:///s.db"], ["dataset 'cifar'", "'path'"]),
    (BAD + ["--estimator", "train", "--dataset", "image-folder", "-o",
            "dataset.path='{tmp}/no-images'", "--dry-run"],
     ["image-folder", "'{tmp}/no-images'", "does not exist"]),
    (BAD + ["--estimator", "train", "--dataset", "cifar", "-o", "dataset.path='{tmp}'",
            "--dry-run"], ["no CIFAR batch files", "'{tmp}'", "cifar-10-batches-py"]),
    (BAD + ["--estimator", "train", "-o", "dataset.valid_fraction=1.5", "--dry-run"],
     ["valid_fraction 1.5", "(0, 1)"]),
    # objectives against the estimator's declared metrics
    (BAD + ["--objective", "acc", "--dry-run"], ["'acc'", "nb201-table", "value"]),
    # plugins: a check hook that raises names its plugin
    (BAD + ["-p", "raising_check", "--dry-run"],
     ["plugin 'raising_check'", "frugalnas_check_config", "KeyError"]),
    (["plugins", "-p", "no_such_plugin_module"], ["'no_such_plugin_module'"]),
]


def test_bad_input_is_one_line_exit_2_and_creates_nothing(tmp_path):
    (tmp_path / "ten.toml").write_text('n_trials = "ten"\n')
    (tmp_path / "raising_check.py").write_text(RAISING_CHECK)
    (tmp_path / "cifar-10-batches-py").mkdir()  # the user passed its parent directory
    cases = [[a.replace("{tmp}", str(tmp_path)) for a in argv] for argv, _ in BAD_INPUT]
    good = ["run", "--no-tracking", "--storage", "sqlite:///plan.db", "--study-name", "p",
            "--n-trials", "2", "--dry-run"]
    before = files(tmp_path)
    results = cli_cases([*cases, good], tmp_path)
    for (argv, fragments), result in zip(BAD_INPUT, results):
        err = result["err"]
        assert result["rc"] == 2, (argv, result)
        assert "Traceback" not in err and err.count("\n") == 1, (argv, err)
        assert err.startswith("frugalnas: error: ") and result["out"] == "", (argv, result)
        for fragment in fragments:
            assert fragment.replace("{tmp}", str(tmp_path)) in err, (argv, fragment, err)
        assert "hunter2" not in err
    # --dry-run passes a good configuration, prints the plan and writes nothing
    plan = results[-1]
    assert plan["rc"] == 0, plan
    assert json.loads(plan["out"])["run"]["storage"] == "sqlite:///plan.db"
    assert files(tmp_path) == before  # no storage file, no journal, no directory


def test_raising_lifecycle_plugin_keeps_trials_complete_and_exits_1(tmp_path):
    (tmp_path / "raising_hooks.py").write_text(RAISING_LIFECYCLE)
    storage = f"sqlite:///{tmp_path / 's.db'}"
    proc = cli("run", "-p", "raising_hooks", "--no-tracking", "-q", "--storage", storage,
               "--study-name", "s", "--n-trials", "3", cwd=tmp_path)
    assert proc.returncode == 1, proc.stderr
    assert "Traceback" not in proc.stderr
    lines = proc.stderr.strip().splitlines()
    # reported once per plugin and hook while running, then one summary line
    assert sum("frugalnas_trial_finished" in line for line in lines[:-1]) == 1
    summary = lines[-1]
    assert summary.startswith("frugalnas: error: ")
    assert ("plugin 'raising_hooks' failed in frugalnas_trial_finished: ValueError: cannot "
            "record a COMPLETE trial (3 times)") in summary
    assert "plugin 'raising_hooks' failed in frugalnas_study_finished: RuntimeError" in summary
    assert "3 trial(s) completed" in proc.stdout
    study = optuna.load_study(study_name="s", storage=storage)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3


@pytest.mark.slow
def test_raising_lifecycle_plugin_in_a_worker_exits_1(tmp_path):
    (tmp_path / "raising_hooks.py").write_text(RAISING_LIFECYCLE)
    storage = f"sqlite:///{tmp_path / 'w.db'}"
    proc = cli("worker", "-p", "raising_hooks", "--no-tracking", "-q", "--storage", storage,
               "--study-name", "w", "--n-trials", "2", cwd=tmp_path)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr, proc.stderr
    assert "plugin 'raising_hooks' failed in frugalnas_trial_finished" in \
        proc.stderr.strip().splitlines()[-1]
    assert "2 complete" in proc.stdout


def test_no_trial_completed_exits_1_with_the_reasons_on_one_line(tmp_path):
    (tmp_path / "failing_estimator.py").write_text(FAILING_ESTIMATOR)
    proc = cli("run", "-p", "failing_estimator", "--estimator", "always-fails", "--no-tracking",
               "-q", "--n-trials", "2", cwd=tmp_path)
    assert proc.returncode == 1
    assert "Traceback" not in proc.stderr  # each failed trial is one warning line
    assert proc.stderr.strip().splitlines()[-1] == (
        "frugalnas: error: no trial completed; failures: 2 x RuntimeError: simulated "
        "evaluation failure")


def test_a_worker_whose_trials_all_fail_gives_up(tmp_path):
    # Failed trials do not count towards --n-trials, so without the limit this never ends.
    (tmp_path / "failing_estimator.py").write_text(FAILING_ESTIMATOR)
    storage = f"sqlite:///{tmp_path / 'w.db'}"
    proc = cli("worker", "-p", "failing_estimator", "--estimator", "always-fails",
               "--no-tracking", "-q", "--storage", storage, "--study-name", "w",
               "--n-trials", "5", "--max-failures", "3", cwd=tmp_path)
    assert proc.returncode != 0 and "Traceback" not in proc.stderr, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        "frugalnas: error: the last 3 trials of this worker failed (3 x RuntimeError: simulated "
        "evaluation failure); it stops (raise --max-failures, or 0 to never stop)")
    study = optuna.load_study(study_name="w", storage=storage)
    assert [t.state.name for t in study.trials] == ["FAIL"] * 3


# -- the Python API -----------------------------------------------------------------------

@pytest.mark.parametrize("url, fragments", [
    ("study.db", ["'study.db'", "sqlite:///study.db"]),
    ("x.log", ["'x.log'", "journal:x.log"]),
    ("redis://localhost/0", ["'redis'", "sqlite:///PATH", "journal:PATH", "postgresql://"]),
    ("mysql://u:pw@h/db", ["'mysql://u:***@h/db'", "pip install mysqlclient", "pymysql"]),
    ("sqlite:///no/such/dir/s.db", ["'no/such/dir'", "does not exist"]),
    ("journal:/no/such/dir/s.log", ["'/no/such/dir'", "does not exist"]),
    ("journal:", ["journal:PATH"]),
    ("", ["sqlite:///PATH"]),
    (5, ["invalid storage 5"]),
])
def test_storage_url_check(url, fragments):
    with pytest.raises(ConfigError) as info:
        check_storage_url(url)
    for fragment in fragments:
        assert fragment in str(info.value)


def test_storage_url_check_accepts_valid_urls(tmp_path):
    for url in (None, f"sqlite:///{tmp_path}/s.db", "sqlite:///relative.db", "sqlite://",
                f"journal:{tmp_path}/j.log", optuna.storages.InMemoryStorage()):
        check_storage_url(url)


def test_postgresql_without_its_driver_names_the_package(monkeypatch):
    monkeypatch.setattr(storage_url, "_installed", lambda module: False)
    with pytest.raises(ConfigError, match=r"'postgresql://me:\*\*\*@db/nas'.*driver 'psycopg2'"
                                          r".*pip install psycopg2-binary.*pg8000"):
        check_storage_url("postgresql://me:secret@db/nas")


def test_bad_storage_fails_before_anything_is_created(tmp_path):
    before = files(tmp_path)
    for storage in ("study.db", f"sqlite:///{tmp_path}/missing/s.db"):
        with pytest.raises(ConfigError):
            frugalnas.create_study(storage=storage, **OFF)
        with pytest.raises(ConfigError):
            frugalnas.load_study(study_name="s", storage=storage)
    for storage in (f"sqlite:///{tmp_path}/never.db", f"journal:{tmp_path}/never.log"):
        with pytest.raises(ConfigError, match="never.* does not exist"):
            frugalnas.load_study(study_name="s", storage=storage)
    with pytest.raises(ConfigError, match="dataset 'cifar' needs the option 'path'"):
        frugalnas.create_study(storage=f"sqlite:///{tmp_path}/s.db", estimator="train",
                               dataset="cifar", disable_plugins=["mlflow"])
    assert files(tmp_path) == before


def test_unreachable_database_is_one_line_without_the_password():
    with pytest.raises(ConfigError) as info:
        frugalnas.create_study(storage="postgresql://me:secret@127.0.0.1:1/nas", **OFF)
    message = str(info.value)
    assert "secret" not in message and "\n" not in message
    assert "postgresql://me:***@127.0.0.1:1/nas" in message


def test_journal_storage_url_works_for_run_and_reload(tmp_path):
    url = f"journal:{tmp_path / 'j.log'}"
    frugalnas.create_study(storage=url, study_name="j", **OFF).optimize(2)
    assert len(frugalnas.load_study(study_name="j", storage=url).completed_trials()) == 2


def test_dataset_checks(tmp_path):
    (tmp_path / "one").mkdir()
    (tmp_path / "one" / "a").mkdir()
    with pytest.raises(ConfigError, match="at least 2 class sub-folders"):
        frugalnas.create_study(estimator="train", dataset="image-folder",
                               dataset_options={"path": str(tmp_path / "one")}, **NO_PLUGINS)
    (tmp_path / "one" / "b").mkdir()
    with pytest.raises(ConfigError, match="holds no images"):
        frugalnas.create_study(estimator="train", dataset="image-folder",
                               dataset_options={"path": str(tmp_path / "one")}, **NO_PLUGINS)
    (tmp_path / "c10").mkdir()
    _cifar_batch(tmp_path / "c10" / "data_batch_1")
    frugalnas.create_study(estimator="train", dataset="cifar",
                           dataset_options={"path": str(tmp_path / "c10")}, **NO_PLUGINS)
    with pytest.raises(ConfigError, match=r"invalid n 1; valid range: \[2, inf\]"):
        frugalnas.create_study(estimator="train", dataset="synthetic",
                               dataset_options={"n": 1}, **NO_PLUGINS)


class Recorder:
    """A lifecycle plugin that works: it must still see every call."""

    __name__ = "recorder"

    def __init__(self):
        self.calls: list[str] = []

    @frugalnas.hookimpl
    def frugalnas_study_started(self):
        self.calls.append("study_started")

    @frugalnas.hookimpl
    def frugalnas_trial_finished(self, report):
        self.calls.append(report.state.name)

    @frugalnas.hookimpl
    def frugalnas_study_finished(self):
        self.calls.append("study_finished")


class Breaker:
    """Every lifecycle hook raises."""

    __name__ = "breaker"

    @frugalnas.hookimpl
    def frugalnas_study_started(self):
        raise RuntimeError("started")

    @frugalnas.hookimpl
    def frugalnas_trial_started(self):
        raise RuntimeError("trial started")

    @frugalnas.hookimpl
    def frugalnas_trial_finished(self):
        raise ValueError("trial finished")

    @frugalnas.hookimpl
    def frugalnas_study_metrics(self):
        raise KeyError("metrics")

    @frugalnas.hookimpl
    def frugalnas_study_finished(self):
        raise RuntimeError("finished")


def test_raising_lifecycle_hooks_are_recorded_not_fatal(capsys):
    recorder = Recorder()
    study = frugalnas.create_study(plugins=[Breaker(), recorder], **OFF)
    study.optimize(3)
    study.log_metrics({"x": 1.0}, step=0)
    candidate = study.ask()
    study.tell(candidate, 1.0)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4
    assert recorder.calls == ["study_started", "COMPLETE", "COMPLETE", "COMPLETE",
                              "study_finished", "study_started", "COMPLETE"]
    errors = {e.hook: e for e in study.plugin_errors}
    assert set(errors) == {"frugalnas_study_started", "frugalnas_trial_started",
                           "frugalnas_trial_finished", "frugalnas_study_metrics",
                           "frugalnas_study_finished"}
    assert all(isinstance(e, PluginHookError) and e.plugin == "breaker" for e in errors.values())
    assert errors["frugalnas_trial_finished"].count == 4
    assert str(errors["frugalnas_trial_finished"]) == (
        "plugin 'breaker' failed in frugalnas_trial_finished: ValueError: trial finished (4 times)")
    err = capsys.readouterr().err
    assert err.count("plugin 'breaker' failed in frugalnas_trial_finished") == 1  # reported once
    assert "Traceback" not in err


def test_a_raising_check_config_hook_names_its_plugin():
    class Checker:
        __name__ = "checker"

        @frugalnas.hookimpl
        def frugalnas_check_config(self, config):
            return config.no_such_field

    with pytest.raises(PluginError, match="plugin 'checker' failed in frugalnas_check_config: "
                                          "AttributeError"):
        frugalnas.create_study(plugins=[Checker()], **OFF)


def test_configuration_conflict_names_fields_for_python_and_cli_users(tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    frugalnas.create_study(storage=storage, study_name="s", seed=1, **OFF)
    with pytest.raises(ConfigConflictError) as info:
        frugalnas.create_study(storage=storage, study_name="s", seed=2, load_if_exists=True,
                               **OFF)
    assert "seed: 1 -> 2" in str(info.value) and "load_study()" in str(info.value)
    cli_message = info.value.for_cli()
    assert "seed: 1 -> 2" in cli_message and "--study-name" in cli_message
    assert "load_study" not in cli_message and "()" not in cli_message
