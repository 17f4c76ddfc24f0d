"""Secrets are used at run time and stored nowhere: a password in the optuna storage URL or
in the MLflow tracking URI (a PostgreSQL store, a tracking server behind ``user:password@``)
and a plugin option its plugin declares secret. Each study runs through the real command
line; then every store it wrote (the optuna database, the MLflow database, the artifact
folders, the server's log) and every line it printed is searched for the secret."""

from __future__ import annotations

import hashlib
import os
import subprocess
import sys
from pathlib import Path

import pytest
from mlflow import MlflowClient

from frugalnas.ports.config import StudyConfig
from frugalnas.ports.secrets import OptionRoles, mask_text
from frugalnas.tracking.mlflow.store import runtime_uri

TESTS = Path(__file__).resolve().parents[1]
PG_SECRET = "pgPw7c1f9eXq"
WRONG_SECRET = "wrongPw3b8d2Zk"
HTTP_SECRET = "httpPw5a2e0Yt"
TOKEN_SECRET = "tokenQ9v4m1Rw"

PLUGIN_SOURCE = '''
"""A plugin with a secret option: it proves the running process sees the real value by
writing its SHA-256 (not the value) to token.sha256."""
import hashlib
from pathlib import Path

from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import hookimpl
from frugalnas.ports.secrets import OptionRoles

NAME = "secret_token_plugin"


@hookimpl
def frugalnas_option_roles():
    return OptionRoles(secret=("token",))


@hookimpl
def frugalnas_check_config(config, host):
    token = config.plugin_options.get(NAME, {}).get("token")
    if not isinstance(token, str) or not token:
        raise ConfigError(f"plugin {NAME!r} needs -o {NAME}.token=TOKEN")


@hookimpl
def frugalnas_study_started(study):
    token = study.config.plugin_options[NAME]["token"]
    Path("token.sha256").write_text(hashlib.sha256(token.encode()).hexdigest())
'''


def _env(extra_path: Path | None = None) -> dict[str, str]:
    env = dict(os.environ)
    paths = [str(TESTS)] + ([str(extra_path)] if extra_path else [])
    env["PYTHONPATH"] = os.pathsep.join(paths + [env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["FRUGALNAS_PROGRESS"] = "0"
    env["PYTHONWARNINGS"] = "ignore"
    env.pop("MLFLOW_TRACKING_USERNAME", None)
    env.pop("MLFLOW_TRACKING_PASSWORD", None)
    return env


def _cli(cwd: Path, *args: str, env: dict[str, str] | None = None,
         timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "frugalnas.cli.main", *args], cwd=cwd,
                          env=env or _env(), capture_output=True, text=True, timeout=timeout)


def _study_args(storage: str, tracking: str, n_trials: int, ui_url: str | None = None
                ) -> list[str]:
    ui = ["-o", f"mlflow.ui_url='{ui_url}'"] if ui_url else []
    return ["-q", "--space", "nb201", "--estimator", "nb201-table", "--n-trials", str(n_trials),
            "--storage", storage, "--study-name", "secret", "--tracking-uri", tracking, *ui]


def _files_holding(folder: Path, secrets: list[str]) -> list[str]:
    """Every file under ``folder`` that holds one of ``secrets`` (bytes, any encoding of text)."""
    found = []
    for path in folder.rglob("*"):
        if path.is_file():
            data = path.read_bytes()
            found += [f"{path}: {s}" for s in secrets if s.encode() in data]
    return found


def _database_dump(url: str) -> str:
    """Every row of every table of the database at ``url``, as text."""
    import sqlalchemy

    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    meta = sqlalchemy.MetaData()
    meta.reflect(engine)
    with engine.connect() as conn:
        # each value whole (a Row's repr shortens long strings)
        rows = [f"{table.name}: " + " | ".join(str(v) for v in row)
                for table in meta.sorted_tables for row in conn.execute(table.select())]
    engine.dispose()
    return "\n".join(rows)


def _postgres_with_password():
    from ops_support.servers import PostgresServer, postgres_missing

    reason = postgres_missing()
    if reason:
        if os.environ.get("FRUGALNAS_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"FRUGALNAS_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)
    return PostgresServer(password=PG_SECRET).start()


@pytest.fixture(scope="module")
def pg_server():
    """A throwaway PostgreSQL server whose superuser logs in with PG_SECRET only."""
    server = _postgres_with_password()
    yield server
    server.stop()


@pytest.fixture
def plain_mlflow_server(tmp_path, sqlite_mlflow_server):
    """The suite's sqlite ``mlflow server``, which ignores the credentials a client sends,
    with its folder."""
    return sqlite_mlflow_server, tmp_path / "server"


# -- the stored form of a configuration ----------------------------------------------------
def test_stored_config_masks_uri_passwords_and_declared_secrets_and_pins_no_machine_setting():
    roles = {"mlflow": OptionRoles(run=("tracking_uri",)), "vault": OptionRoles(secret=("token",))}
    config = StudyConfig(
        backend_options={"device": "cpu"},
        dataset_options={"url": f"https://ann:{HTTP_SECRET}@data.example/set?token={TOKEN_SECRET}"},
        plugin_options={"mlflow": {"tracking_uri": f"postgresql://u:{PG_SECRET}@db/mlflow"},
                        "vault": {"token": TOKEN_SECRET, "region": "eu"}})
    text = config.to_json(roles)
    for secret in (PG_SECRET, HTTP_SECRET, TOKEN_SECRET):
        assert secret not in text
    stored = StudyConfig.from_json(text)
    assert stored.plugin_options == {"mlflow": {"tracking_uri": "postgresql://u:***@db/mlflow"},
                                     "vault": {"token": "***", "region": "eu"}}
    assert stored.dataset_options["url"] == "https://ann:***@data.example/set?token=***"
    # another machine: another device, the store under another name: the same study
    other = StudyConfig(
        backend_options={"device": "auto", "threads": 4},
        dataset_options=dict(config.dataset_options),
        plugin_options={"mlflow": {"tracking_uri": "postgresql://u@db.local/mlflow"},
                        "vault": {"token": "another", "region": "eu"}})
    assert stored.differences(other, roles) == []
    assert stored.pinned(roles) == other.pinned(roles)
    changed = StudyConfig(**{**other.__dict__, "seed": 3,
                             "plugin_options": {"vault": {"token": "t", "region": "us"}}})
    lines = stored.differences(changed, roles)
    assert len(lines) == 2 and lines[0].startswith("seed: 0 -> 3")
    assert "'region': 'eu'" in lines[1] and "'region': 'us'" in lines[1]
    assert "another" not in " ".join(lines) and TOKEN_SECRET not in " ".join(lines)


def test_a_tracking_server_uri_hands_its_credentials_to_mlflow_through_the_environment(
        monkeypatch):
    monkeypatch.delenv("MLFLOW_TRACKING_USERNAME", raising=False)
    monkeypatch.delenv("MLFLOW_TRACKING_PASSWORD", raising=False)
    assert runtime_uri(f"http://bob:{HTTP_SECRET}@127.0.0.1:5001/") == "http://127.0.0.1:5001/"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "bob"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == HTTP_SECRET
    # a stored (masked) URI: the password stays the environment's
    assert runtime_uri("https://carol:***@mlflow.example") == "https://mlflow.example"
    assert os.environ["MLFLOW_TRACKING_USERNAME"] == "carol"
    assert os.environ["MLFLOW_TRACKING_PASSWORD"] == HTTP_SECRET
    # a database keeps its password in the URI (the driver needs it), a masked one is dropped
    assert runtime_uri(f"postgresql://u:{PG_SECRET}@h/db") == f"postgresql://u:{PG_SECRET}@h/db"
    assert runtime_uri("postgresql://u:***@h/db") == "postgresql://u@h/db"
    assert mask_text(f"no 'postgresql://u:{PG_SECRET}@h/db' here") == "no 'postgresql://u:***@h/db' here"


# -- whole studies through the command line ----------------------------------------------------
@pytest.mark.slow
def test_a_password_in_the_ui_url_is_masked_in_the_review_and_written_nowhere(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    tracking = f"sqlite:///{tmp_path / 'mlflow.db'}"
    ui_url = f"http://bob:{HTTP_SECRET}@127.0.0.1:5000"
    run = _cli(tmp_path, "run", *_study_args(storage, tracking, 3, ui_url=ui_url))
    assert run.returncode == 0, run.stderr[-3000:]
    # the review of `frugalnas report`, linked to the runs through the same address
    report = _cli(tmp_path, "report", "--storage", storage, "--study-name", "secret",
                  "--html", str(tmp_path / "report.html"), "--mlflow-url", ui_url)
    assert report.returncode == 0, report.stderr[-3000:]
    assert _files_holding(tmp_path, [HTTP_SECRET]) == []  # both stores, every artifact
    for out in (run, report):
        assert HTTP_SECRET not in out.stdout + out.stderr
    pages = [*tmp_path.rglob("leaderboard.html"), tmp_path / "report.html"]
    assert len(pages) == 2
    for page in pages:  # the links keep the user and the address, not the password
        assert "http://bob:***@127.0.0.1:5000/#/experiments/" in page.read_text()


@pytest.mark.slow
def test_postgres_passwords_of_the_storage_and_the_tracking_store_are_stored_nowhere(
        pg_server, tmp_path):
    storage = pg_server.new_database("optuna")
    tracking = pg_server.new_database("mlflow")
    assert PG_SECRET in storage and PG_SECRET in tracking
    ui_url = f"http://bob:{HTTP_SECRET}@127.0.0.1:5000"  # the review links to it
    outputs = []
    first = _cli(tmp_path, "run", *_study_args(storage, tracking, 3, ui_url))
    outputs.append(first)
    assert first.returncode == 0, first.stderr[-3000:]
    # reopened with the same secret-bearing URIs: the same study, not "a different configuration"
    again = _cli(tmp_path, "run", *_study_args(storage, tracking, 2, ui_url))
    outputs.append(again)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "5 in total" in again.stdout
    outputs.append(_cli(tmp_path, "run", "--dry-run", *_study_args(storage, tracking, 2, ui_url)))
    assert outputs[-1].returncode == 0 and "postgres:***@127.0.0.1" in outputs[-1].stdout
    # report reopens the study from its stored config: the tracking password is not there
    outputs.append(_cli(tmp_path, "report", "--storage", storage, "--study-name", "secret"))
    assert outputs[-1].returncode == 2
    assert "give it in the environment (PGPASSWORD" in outputs[-1].stderr
    outputs.append(_cli(tmp_path, "report", "--storage", storage, "--study-name", "secret",
                        env={**_env(), "PGPASSWORD": PG_SECRET}))
    assert outputs[-1].returncode == 0, outputs[-1].stderr[-3000:]
    assert "nb201:" in outputs[-1].stdout
    # a refused login: one line, exit 2, and the password that was tried is not shown either
    wrong = tracking.replace(PG_SECRET, WRONG_SECRET)
    refused = _cli(tmp_path, "run", *_study_args(storage, wrong, 1, ui_url))
    outputs.append(refused)
    assert refused.returncode == 2
    assert refused.stderr.count("\n") == 1 and refused.stderr.startswith("frugalnas: error:")
    assert "postgres:***@127.0.0.1" in refused.stderr

    client = MlflowClient(tracking_uri=tracking)
    experiment = client.get_experiment_by_name("secret")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    trial_runs = [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"]
    parent = next(r for r in runs if r.data.tags.get("frugalnas.role") == "study")
    assert len(trial_runs) == 5
    assert "postgres:***@127.0.0.1" in parent.data.params["plugin_options"]

    secrets = [PG_SECRET, WRONG_SECRET, HTTP_SECRET]
    for url in (storage, tracking):
        dump = _database_dump(url)
        assert "postgres:***@127.0.0.1" in dump  # the stored config, the parent's params
        assert [s for s in secrets if s in dump] == [], url.rsplit("/", 1)[-1]
    assert _files_holding(tmp_path, secrets) == []  # ./mlruns: the runs' artifacts
    assert any(p.name == "study_config.json" for p in tmp_path.rglob("*"))
    assert any(p.name == "leaderboard.html" for p in tmp_path.rglob("*"))
    for out in outputs:
        assert [s for s in secrets if s in out.stdout + out.stderr] == []


@pytest.mark.slow
def test_credentials_of_a_tracking_server_and_a_secret_plugin_option_are_stored_nowhere(
        plain_mlflow_server, tmp_path):
    server, folder = plain_mlflow_server
    plugins = tmp_path / "plugins"
    plugins.mkdir()
    (plugins / "secret_token_plugin.py").write_text(PLUGIN_SOURCE)
    env = _env(plugins)
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    work = tmp_path / "work"
    work.mkdir()
    plugin = ["-p", "secret_token_plugin", "-o", f"secret_token_plugin.token='{TOKEN_SECRET}'"]
    outputs = []
    first = _cli(work, "run", *plugin, *_study_args(
        storage, f"http://bob:{HTTP_SECRET}@127.0.0.1:{server.port}", 3), env=env)
    outputs.append(first)
    assert first.returncode == 0, first.stderr[-3000:]
    # the running process saw the real token
    assert (work / "token.sha256").read_text() == hashlib.sha256(TOKEN_SECRET.encode()).hexdigest()
    # the same server under another name, the same credentials: the same study
    again = _cli(work, "run", *plugin, *_study_args(
        storage, f"http://bob:{HTTP_SECRET}@localhost:{server.port}", 2), env=env)
    outputs.append(again)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "5 in total" in again.stdout
    outputs.append(_cli(work, "run", "--dry-run", *plugin, *_study_args(
        storage, f"http://bob:{HTTP_SECRET}@127.0.0.1:{server.port}", 1), env=env))
    assert outputs[-1].returncode == 0, outputs[-1].stderr[-3000:]
    assert '"token": "***"' in outputs[-1].stdout

    client = MlflowClient(tracking_uri=server.uri)
    experiment = client.get_experiment_by_name("secret")
    runs = client.search_runs([experiment.experiment_id], max_results=100)
    assert sum(r.data.tags.get("frugalnas.role") == "trial" for r in runs) == 5
    parent = next(r for r in runs if r.data.tags.get("frugalnas.role") == "study")
    assert f"bob:***@127.0.0.1:{server.port}" in parent.data.params["plugin_options"]
    assert '"token": "***"' in parent.data.params["plugin_options"]

    secrets = [HTTP_SECRET, TOKEN_SECRET]
    assert _files_holding(tmp_path, secrets) == []  # optuna.db, the server's store and log
    assert (folder / "runs.db").stat().st_size > 0 and (tmp_path / "optuna.db").stat().st_size > 0
    assert any(p.name == "study_config.json" for p in (folder / "artifacts").rglob("*"))
    for out in outputs:
        assert [s for s in secrets if s in out.stdout + out.stderr] == []


@pytest.mark.slow
def test_an_unreachable_tracking_server_with_credentials_is_one_line_naming_its_host(tmp_path):
    from ops_support.servers import free_port

    port = free_port()
    result = _cli(tmp_path, "run", *_study_args(
        f"sqlite:///{tmp_path / 'optuna.db'}", f"http://bob:{HTTP_SECRET}@127.0.0.1:{port}", 1))
    assert result.returncode == 2
    assert result.stderr.count("\n") == 1, result.stderr
    assert f"MLflow tracking server http://127.0.0.1:{port} is not reachable" in result.stderr
    assert "Name or service not known" not in result.stderr
    assert HTTP_SECRET not in result.stdout + result.stderr
    assert not (tmp_path / "optuna.db").exists()


@pytest.mark.slow
def test_the_ui_server_gets_the_store_password_in_its_environment_not_on_a_command_line(
        pg_server, tmp_path):
    """Every user of a machine can read every process's command line (``ps``): ``frugalnas
    ui`` hands the tracking store's URI to the MLflow server in its environment."""
    import signal
    import time
    import urllib.request

    from ops_support.servers import free_port

    tracking = pg_server.new_database("mlflow_ui")
    assert PG_SECRET in tracking
    port = free_port()
    proc = subprocess.Popen([sys.executable, "-m", "frugalnas.cli.main", "ui", "--port",
                             str(port)], env={**_env(), "MLFLOW_TRACKING_URI": tracking},
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 180
        while True:
            assert proc.poll() is None, proc.communicate()[1][-3000:]
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                    break
            except OSError:
                assert time.monotonic() < end, "the MLflow UI did not start"
                time.sleep(0.3)
        holding = []
        for pid in filter(str.isdigit, os.listdir("/proc")):
            try:
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
            except OSError:
                continue
            if PG_SECRET.encode() in cmdline:
                holding.append(cmdline.replace(b"\0", b" ").decode(errors="replace"))
        assert holding == []
    finally:
        proc.send_signal(signal.SIGTERM)
        out, err = proc.communicate(timeout=60)
    assert PG_SECRET not in out + err
