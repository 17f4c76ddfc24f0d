"""Failures of the machine rather than of the input, met by real commands: a database server
that is unreachable or refuses the password, a full disk under the optuna storage or under
the MLflow store. Each is one line on stderr, exit 2, with what was recorded before it kept
and no password shown; MLflow's own logging stays out of the output."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import optuna
import pytest

from frugalnas.engine.storage_url import operational_failure

TABLE = ["--estimator", "nb201-table", "-q"]


def frugalnas(*args: str, cwd: Path, timeout: float = 300) -> subprocess.CompletedProcess:
    env = dict(os.environ, FRUGALNAS_PROGRESS="0")
    return subprocess.run([sys.executable, "-m", "frugalnas.cli.main", *args], cwd=cwd,
                          env=env, capture_output=True, text=True, timeout=timeout)


def assert_one_line(proc: subprocess.CompletedProcess, *expected: str) -> str:
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-3000:])
    err = proc.stderr
    assert err.count("\n") == 1 and err.startswith("frugalnas: error: "), err[-3000:]
    for text in expected:
        assert text in err, err
    return err


@pytest.fixture
def small_disk(tmp_path):
    """A 600 KiB tmpfs: a store on it fills up within a study. Skipped where this process
    cannot mount one (mounting needs root and a kernel that allows it)."""
    mount = tmp_path / "small"
    mount.mkdir()
    made = subprocess.run(["mount", "-t", "tmpfs", "-o", "size=600k", "tmpfs", str(mount)],
                          capture_output=True, text=True)
    if made.returncode != 0:
        pytest.skip(f"cannot mount a small tmpfs here: {made.stderr.strip() or made.returncode}")
    yield mount
    subprocess.run(["umount", "-l", str(mount)], capture_output=True)


def test_the_cause_chain_is_searched_for_a_full_disk_or_a_database_error():
    import sqlite3

    try:
        try:
            raise sqlite3.OperationalError("database or disk is full")
        except sqlite3.OperationalError as inner:
            raise RuntimeError("commit failed") from inner
    except RuntimeError as wrapped:
        try:
            raise AssertionError("Should not reach.")
        except AssertionError as outer:
            outer.__context__ = wrapped
            failure = operational_failure(outer, "postgresql://u:secret@h/db")
    assert failure is not None
    assert "storage 'postgresql://u:***@h/db' failed: OperationalError: database or disk is " \
           "full" in str(failure) and "secret" not in str(failure)
    assert operational_failure(ValueError("a bug"), "sqlite:///x.db") is None
    assert operational_failure(OSError(28, "No space left on device")) is not None


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "worker"])
def test_a_full_disk_under_the_storage_is_one_line_and_keeps_the_trials(tmp_path, small_disk,
                                                                         command):
    url = f"sqlite:///{small_disk / 'study.db'}"
    proc = frugalnas(command, *TABLE, "--no-tracking", "--storage", url, "--study-name", "s",
                     "--n-trials", "5000", cwd=tmp_path)
    assert_one_line(proc, f"storage {url!r} failed: OperationalError: database or disk is full",
                    "run the same command to continue")
    done = [t for t in optuna.load_study(study_name="s", storage=url).trials
            if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) > 10


@pytest.mark.slow
def test_a_full_disk_under_the_mlflow_store_is_one_line_and_the_trials_complete(tmp_path,
                                                                                small_disk):
    storage = f"sqlite:///{tmp_path / 'study.db'}"
    tracking = f"sqlite:///{small_disk / 'mlflow.db'}"
    proc = frugalnas("run", *TABLE, "--storage", storage, "--study-name", "s", "--n-trials",
                     "300", "--tracking-uri", tracking, cwd=tmp_path, timeout=600)
    err = assert_one_line(proc, f"MLflow store {tracking!r} failed:")
    assert "disk is full" in err or "No space left on device" in err, err
    assert "Traceback" not in proc.stdout and "sqlalchemy" not in proc.stdout
    ostudy = optuna.load_study(study_name="s", storage=storage)
    assert sum(t.state == optuna.trial.TrialState.COMPLETE for t in ostudy.trials) == 300


def test_an_unreachable_database_is_one_line_for_a_worker_too(tmp_path):
    url = "postgresql://user:hunter2@127.0.0.1:1/db"
    for command in ("run", "worker"):
        proc = frugalnas(command, *TABLE, "--no-tracking", "--storage", url, "--n-trials", "2",
                         cwd=tmp_path)
        err = assert_one_line(proc, "postgresql://user:***@127.0.0.1:1/db")
        assert "hunter2" not in err + proc.stdout
    # nothing written (the suite's own default MLflow store was there before)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["default-mlflow.db"]


@pytest.mark.slow
def test_a_wrong_database_password_is_one_line_for_run_and_worker(tmp_path):
    from ops_support.servers import PostgresServer, postgres_missing

    if postgres_missing():
        if os.environ.get("FRUGALNAS_REQUIRE_POSTGRES") == "1":
            pytest.fail(postgres_missing())
        pytest.skip(postgres_missing())
    server = PostgresServer(password="right-secret").start()
    try:
        url = server.url(password="wrong-secret")
        for command in ("run", "worker"):
            proc = frugalnas(command, *TABLE, "--no-tracking", "--storage", url,
                             "--n-trials", "2", cwd=tmp_path)
            err = assert_one_line(proc, f"127.0.0.1:{server.port}", "password authentication "
                                  "failed")
            assert "wrong-secret" not in err + proc.stdout and "right-secret" not in err
        good = frugalnas("worker", *TABLE, "--no-tracking", "--storage", server.url(),
                         "--study-name", "ok", "--n-trials", "3", cwd=tmp_path)
        assert good.returncode == 0, good.stderr[-2000:]
    finally:
        server.stop()


@pytest.mark.slow
def test_mlflow_over_http_writes_nothing_of_its_own_under_q(tmp_path, mlflow_server):
    server, env = mlflow_server
    proc = frugalnas("run", *TABLE, "--storage", f"sqlite:///{tmp_path / 's.db'}",
                     "--study-name", "quiet-http", "--n-trials", "5", "--tracking-uri",
                     env["TRACKING"], cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr[-3000:]
    output = proc.stdout + proc.stderr
    assert "View run" not in output and "View experiment" not in output, output[-3000:]
    assert proc.stderr == "", proc.stderr[-3000:]


LOST_FILTER = '''\
import warnings
_simplefilter = warnings.simplefilter


def simplefilter(action, category=Warning, lineno=0, append=False):
    # as when another thread leaves warnings.catch_warnings() while requests imports
    if getattr(category, "__name__", "") == "DependencyWarning":
        return
    return _simplefilter(action, category, lineno, append)


warnings.simplefilter = simplefilter
'''


def test_a_lost_third_party_warning_filter_leaves_stderr_clean(tmp_path):
    """requests hides urllib3's PySocks notice by a filter it adds while importing; when that
    filter is lost (warning filters are process-wide), the command's stderr stays clean."""
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(LOST_FILTER)
    env = dict(os.environ, FRUGALNAS_PROGRESS="0", PYTHONPATH=str(site))
    proc = subprocess.run([sys.executable, "-m", "frugalnas.cli.main", "run", *TABLE,
                           "--n-trials", "2", "--tracking-uri",
                           f"sqlite:///{tmp_path / 'mlflow.db'}"],
                          cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "SOCKS" not in proc.stderr and "Warning" not in proc.stderr, proc.stderr
    assert "2 trial(s) completed" in proc.stdout
