"""Workers: many processes, on one machine or many, sharing one optuna storage.

Each worker runs trials until the study holds ``n_trials`` finished (COMPLETE or PRUNED)
trials plus the ones running now. The check and the creation of a trial happen under one
lock (a file lock beside a sqlite or journal file; a PostgreSQL advisory lock or a MySQL
named lock for server databases), so the workers together run exactly ``n_trials``.
With ``heartbeat`` set, optuna's heartbeat marks the trials of a dead worker FAIL after
``grace`` seconds; frugalnas then closes their MLflow runs as KILLED and, with ``retries``,
enqueues the same architecture again.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import optuna
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from frugalnas.core.config import StudyConfig
from frugalnas.core.optuna_compat import BaseHeartbeat, heartbeat_interval
from frugalnas.core.errors import ConfigError, check_range

COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)


class QuotaReached(Exception):
    """Raised inside ``create_new_trial`` when the study already has its trials."""


def _lock_for(url: str) -> Callable[[], contextlib.AbstractContextManager[None]]:
    if url.startswith("sqlite:///"):
        path = Path(url[len("sqlite:///"):]).resolve()
        return lambda: file_lock(path.with_name(path.name + ".frugalnas.lock"))
    if url.startswith("journal:"):
        path = Path(url[len("journal:"):]).resolve()
        return lambda: file_lock(path.with_name(path.name + ".frugalnas.lock"))
    if url.startswith(("postgresql", "mysql")):
        return lambda: _database_lock(url)
    raise ConfigError(f"unsupported storage URL {url!r} for workers; valid: sqlite:///PATH, "
                      "journal:PATH, postgresql://..., mysql://...")


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) across processes of this machine."""
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)


@contextlib.contextmanager
def _database_lock(url: str) -> Iterator[None]:
    import sqlalchemy

    key = int(hashlib.sha1(url.encode()).hexdigest()[:15], 16)
    engine = sqlalchemy.create_engine(url)
    with engine.connect() as conn:
        if url.startswith("postgresql"):
            conn.execute(sqlalchemy.text(f"SELECT pg_advisory_lock({key})"))
            unlock = f"SELECT pg_advisory_unlock({key})"
        else:
            conn.execute(sqlalchemy.text(f"SELECT GET_LOCK('frugalnas{key}', 600)"))
            unlock = f"SELECT RELEASE_LOCK('frugalnas{key}')"
        try:
            yield
        finally:
            conn.execute(sqlalchemy.text(unlock))
    engine.dispose()


def _delegate(name: str) -> Callable[..., Any]:
    def method(self: "QuotaStorage", *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)
    method.__name__ = name
    return method


class QuotaStorage(BaseStorage, BaseHeartbeat):
    """An optuna storage that refuses new trials once the study has ``n_trials``."""

    def __init__(self, inner: BaseStorage, url: str, n_trials: int):
        self.inner, self.n_trials = inner, n_trials
        self._lock = _lock_for(url)

    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        with self._lock():
            counted = self.inner.get_all_trials(study_id, deepcopy=False, states=COUNTED_STATES)
            waiting = template_trial is not None and template_trial.state == TrialState.WAITING
            if len(counted) >= self.n_trials and not waiting:
                raise QuotaReached(f"study has {len(counted)} of {self.n_trials} trials")
            return self.inner.create_new_trial(study_id, template_trial)

    def get_heartbeat_interval(self) -> int | None:
        return heartbeat_interval(self.inner)

    def __getattr__(self, name: str) -> Any:
        return getattr(self.inner, name)


for _name in sorted((BaseStorage.__abstractmethods__ | BaseHeartbeat.__abstractmethods__)
                    - {"create_new_trial", "get_heartbeat_interval"}):
    setattr(QuotaStorage, _name, _delegate(_name))
QuotaStorage.__abstractmethods__ = frozenset()


def make_storage(url: str, *, heartbeat: int | None = None, grace: int | None = None,
                 on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None) -> BaseStorage:
    """An optuna storage for ``url`` with heartbeats when ``heartbeat`` seconds are given."""
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        if heartbeat:
            raise ConfigError("heartbeats need an RDB storage (sqlite/postgresql/mysql URL); "
                              f"got {url!r}")
        return optuna.storages.JournalStorage(JournalFileBackend(url[len("journal:"):]))
    if not url.startswith(("sqlite:///", "postgresql", "mysql")):
        raise ConfigError(f"unsupported storage URL {url!r}; valid: sqlite:///PATH, journal:PATH, "
                          "postgresql://..., mysql://...")
    kwargs: dict[str, Any] = {}
    if heartbeat:
        kwargs = {"heartbeat_interval": int(heartbeat), "grace_period": int(grace or 2 * heartbeat),
                  "heartbeat_stale_trial_callback": on_stale}
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    # Workers starting together on a new database would race to create its tables.
    with _lock_for(url)():
        return optuna.storages.RDBStorage(url, engine_kwargs=engine_kwargs, **kwargs)


def check_worker_settings(heartbeat: int | None, grace: int | None, retries: int) -> None:
    """Raise ConfigError for heartbeat/grace/retries values that cannot work."""
    if heartbeat is not None:
        check_range("heartbeat (seconds)", heartbeat, 1)
    if grace is not None:
        if heartbeat is None:
            raise ConfigError(f"grace {grace!r} needs heartbeats; add --heartbeat SECONDS")
        if not isinstance(grace, int) or grace <= heartbeat:
            raise ConfigError(f"invalid grace {grace!r}; it must exceed the heartbeat interval "
                              f"({heartbeat} s), or live trials would be failed as stale")
    check_range("retries", retries, 0)
    if retries and heartbeat is None:
        raise ConfigError(f"retries {retries!r} needs heartbeats to detect dead trials; "
                          "add --heartbeat SECONDS")


def run_worker(config: StudyConfig, storage: str, study_name: str, n_trials: int, *,
               heartbeat: int | None = None, grace: int | None = None, retries: int = 0,
               timeout: float | None = None, host: Any = None) -> Any:
    """Join (or create) the study and run trials until it has ``n_trials``; returns the Study."""
    from dataclasses import asdict

    from frugalnas.core.study import create_study

    if not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigError(f"invalid n_trials {n_trials!r} for a worker; expected an integer >= 1")
    check_worker_settings(heartbeat, grace, retries)
    holder: dict[str, Any] = {}
    retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=retries) if retries else None

    def on_stale(ostudy: optuna.Study, frozen: FrozenTrial) -> None:
        study = holder.get("study")
        if study is not None:
            study.report_stale_trial(frozen)
        if retry is not None:
            retry(ostudy, frozen)

    inner = make_storage(storage, heartbeat=heartbeat, grace=grace, on_stale=on_stale)
    quota = QuotaStorage(inner, storage, n_trials)
    cfg = asdict(config)
    study = create_study(storage=quota, study_name=study_name, load_if_exists=True, host=host,
                         **{k: v for k, v in cfg.items() if k != "directions"},
                         directions=config.directions)
    holder["study"] = study
    study.planned_trials = n_trials
    # One plugin session (MLflow tracker, progress bar) for the whole worker, so that stale
    # trials failed while this worker waits below are still reported to MLflow.
    study._start()
    try:
        _work(study, timeout, heartbeat)
    finally:
        study.finish()
    return study


def _work(study: Any, timeout: float | None, heartbeat: int | None) -> None:
    start = time.monotonic()
    while True:
        left = None if timeout is None else timeout - (time.monotonic() - start)
        if left is not None and left <= 0:
            return
        try:
            study.optuna_study.optimize(study._run_trial, n_trials=None, timeout=left,
                                        catch=(Exception,), gc_after_trial=False)
            return  # timeout
        except QuotaReached:
            pass
        # The quota counts running trials. Trials of live workers finish; trials of dead
        # workers become FAIL once their heartbeat is stale, which frees their slots.
        running = study.optuna_study.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
        if not running or not heartbeat:
            return
        time.sleep(min(float(heartbeat), 5.0))
        optuna.storages.fail_stale_trials(study.optuna_study)
