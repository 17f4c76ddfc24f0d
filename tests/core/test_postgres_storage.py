"""PostgreSQL as a worker storage and as an MLflow store, on a throwaway server
(tests/ops_support/servers.py; skipped without the server binaries, required in CI).
The multi-machine recipe itself runs in tests/core/test_chaos_workers.py."""

from __future__ import annotations

import threading
import time

import optuna
import pytest
import sqlalchemy

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.distribution.locks import StorageLock
from frugalnas.distribution.worker import run_worker
from frugalnas.tracking.mlflow.checks import check_tracking_uri
from ops_support.checks import assert_exactly_n_distinct, assert_mlflow_follows_storage


def _advisory_locks(url: str) -> int:
    engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
    with engine.connect() as conn:
        n = conn.execute(sqlalchemy.text(
            "SELECT count(*) FROM pg_locks WHERE locktype = 'advisory' AND granted")).scalar()
    engine.dispose()
    return int(n)


def test_the_worker_lock_is_an_advisory_lock_shared_by_connections(postgres_server):
    url = postgres_server.new_database("lock")
    a, b = StorageLock(url), StorageLock(url)  # as two processes would hold them
    a.acquire()
    assert _advisory_locks(url) == 1
    got = threading.Event()
    waiter = threading.Thread(target=lambda: (b.acquire(), got.set(), b.release()))
    waiter.start()
    time.sleep(0.5)
    assert not got.is_set(), "a second holder got the lock while the first held it"
    a.acquire()  # re-entrant in the holder
    a.release()
    assert not got.is_set()
    a.release()
    waiter.join(timeout=10)
    assert got.is_set() and _advisory_locks(url) == 0


def test_a_worker_on_postgresql_runs_exactly_n_trials_and_mlflow_follows(postgres_server, tmp_path):
    from frugalnas.testing import fresh_mlflow_uri

    storage = postgres_server.new_database("studies")
    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    config = frugalnas.StudyConfig(space="nb201", estimator="nb201-table", dataset=None,
                                   strategy="regularized-evolution",
                                   strategy_options={"n_init": 3, "population_size": 4,
                                                     "sample_size": 2},
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    run_worker(config, storage, "pg", 6, heartbeat=1, grace=2)
    study = run_worker(config, storage, "pg", 8, heartbeat=1, grace=2)  # a second worker
    assert study.plugin_state["mlflow"]["errors"] == []
    assert_exactly_n_distinct(storage, "pg", 8)
    assert_mlflow_follows_storage(storage, uri, "pg")
    summaries = optuna.get_all_study_summaries(storage)
    assert [s.study_name for s in summaries] == ["pg"]


def test_a_postgresql_tracking_uri_is_checked_before_the_first_trial(postgres_server):
    check_tracking_uri(postgres_server.url("postgres"))  # reachable: no error
    from ops_support.servers import free_port

    dead = f"postgresql://nas:secret@127.0.0.1:{free_port()}/mlflow"
    start = time.monotonic()
    with pytest.raises(ConfigError, match="MLflow tracking database .* is not reachable") as err:
        check_tracking_uri(dead)
    assert time.monotonic() - start < 10
    assert "secret" not in str(err.value) and len(str(err.value).splitlines()) == 1
