import os
from pathlib import Path

import optuna
import pytest

from frugalnas.testing import fresh_mlflow_uri

REPO = Path(__file__).resolve().parents[1]
SHARED_CSV = REPO.parent / "shared" / "data" / "nats_bench.csv"

os.environ.setdefault("FRUGALNAS_PROGRESS", "0")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(autouse=True)
def _isolated_mlflow(tmp_path, monkeypatch):
    """Any study that tracks without an explicit URI writes to this test's own store."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", fresh_mlflow_uri(tmp_path / "default-mlflow.db"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def stores(tmp_path):
    """(optuna storage URL, MLflow tracking URI), both sqlite files in tmp_path."""
    return f"sqlite:///{tmp_path / 'optuna.db'}", fresh_mlflow_uri(tmp_path / "mlflow.db")


# -- servers for the multi-machine tests -------------------------------------------------------
@pytest.fixture(scope="session")
def postgres_server():
    """A throwaway PostgreSQL server (initdb + pg_ctl in a temporary folder, 127.0.0.1, a free
    port) for the whole session; ``.new_database(prefix)`` returns the URL of a new database.
    Skips when the server binaries are missing, unless FRUGALNAS_REQUIRE_POSTGRES=1 (CI)."""
    from ops_support.servers import PostgresServer, postgres_missing

    reason = postgres_missing()
    if reason:
        if os.environ.get("FRUGALNAS_REQUIRE_POSTGRES") == "1":
            pytest.fail(f"FRUGALNAS_REQUIRE_POSTGRES=1 but {reason}")
        pytest.skip(reason)
    server = PostgresServer().start()
    yield server
    server.stop()


@pytest.fixture(scope="session")
def mlflow_server(postgres_server, tmp_path_factory):
    """An ``mlflow server`` on 127.0.0.1 with its runs in a PostgreSQL database and its
    artifacts in a temporary folder, started with the exact command of docs/operations.md's
    multi-machine recipe. Yields (server, the recipe's environment)."""
    from ops_support.recipe import SEVERAL_MACHINES, mlflow_server as server_command, read_recipe
    from ops_support.servers import MlflowServer, free_port

    folder = tmp_path_factory.mktemp("mlflow-server")
    port = free_port()
    env = {"STUDIES": "", "MLFLOW_DB": postgres_server.new_database("mlflow"),
           "ARTIFACTS": str(folder / "artifacts"), "TRACKING": f"http://127.0.0.1:{port}"}
    recipe = read_recipe(SEVERAL_MACHINES)
    assert set(recipe.exports) == set(env), f"the recipe exports {sorted(recipe.exports)}"
    server = MlflowServer(server_command(recipe, env, port), port, folder / "server.log")
    try:
        server.wait_ready()
    except Exception:
        server.stop()
        raise
    yield server, env
    server.stop()


@pytest.fixture
def one_thread():
    """torch on one thread for the test: tiny models run fastest so, and tests that run
    beside others on a busy machine do not oversubscribe its cores."""
    import torch

    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def sqlite_mlflow_server(tmp_path):
    """An ``mlflow server`` on 127.0.0.1 with a sqlite store and an artifact folder under
    ``tmp_path / "server"``, without authentication (it ignores credentials a client
    sends). Yields the server (``.port``, ``.uri``)."""
    from ops_support.chaos import env_with_tests
    from ops_support.servers import MlflowServer, free_port, mlflow_server_command

    folder = tmp_path / "server"
    folder.mkdir()
    port = free_port()
    command = mlflow_server_command(f"sqlite:///{folder / 'runs.db'}", folder / "artifacts", port)
    server = MlflowServer(command, port, folder / "server.log",
                          env=env_with_tests(Path(__file__).resolve().parent))
    try:
        server.wait_ready()
    except Exception:
        server.stop()
        raise
    yield server
    server.stop()
