"""Locks shared by every process that uses one optuna storage: a file lock beside a sqlite or
journal file, a PostgreSQL advisory lock or a MySQL named lock for server databases, a lock
kept by the Dask scheduler for a study in its memory.

:class:`StorageLock` is public: the workers take turns on a study's quota and proposals with
``storage_lock(url, "trials")``, and the MLflow plugin serializes its writes for one study with
``storage_lock(url, "mlflow")``, across machines when the storage is a database server.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

from frugalnas.engine.dask_url import is_dask_url
from frugalnas.ports import optuna_compat
from frugalnas.ports.errors import ConfigError

SUPPORTED_URLS = "sqlite:///PATH, journal:PATH, postgresql://..., mysql://..."


# -- locks ----------------------------------------------------------------------------------
class StorageLock:
    """A re-entrant lock shared by every process that uses one storage URL.

    sqlite and journal files: an ``fcntl`` lock on a file beside them (the processes of one
    machine). PostgreSQL: a session advisory lock; MySQL: a named lock (every machine that
    reaches the database). ``dask:ADDRESS``: a lock kept by that Dask scheduler, released
    when the holder's Dask client leaves. ``None`` (an in-memory storage): a lock of this process only.
    A lock held by a process that dies is released by the operating system (file locks) or
    by the database when the connection drops (advisory and named locks). ``purpose`` names
    independent locks on one storage. Acquire and release in the same thread.
    """

    def __init__(self, url: str | None, purpose: str = "trials"):
        self.url, self.purpose = url, purpose
        self._local = threading.RLock()
        self._depth = 0
        self._release: Callable[[], None] | None = None
        self._engine: Any = None
        if url is None:
            self._kind = "local"
        elif url.startswith(("sqlite:///", "journal:")):
            self._kind = "file"
            raw = url[len("sqlite:///"):] if url.startswith("sqlite:///") else url[len("journal:"):]
            path = Path(raw).resolve()
            suffix = ".frugalnas.lock" if purpose == "trials" else f".frugalnas-{purpose}.lock"
            self._path = path.with_name(path.name + suffix)
        elif url.startswith(("postgresql", "mysql")):
            self._kind = "database"
            text = url if purpose == "trials" else f"{url}#{purpose}"
            self._key = int(hashlib.sha1(text.encode()).hexdigest()[:15], 16)
        elif is_dask_url(url):
            # A lock kept by the Dask scheduler, released when its holder's client leaves.
            from frugalnas.engine.dask_storage import SchedulerLock, scheduler_address

            self._kind = "dask"
            self._dask = SchedulerLock(scheduler_address(url), f"frugalnas-{purpose}")
        else:
            raise ConfigError(f"unsupported storage URL {url!r} for workers; valid: "
                              f"{SUPPORTED_URLS}")

    def acquire(self) -> None:
        self._local.acquire()
        if self._depth == 0:
            try:
                self._release = self._acquire_shared()
            except BaseException:
                self._local.release()
                raise
        self._depth += 1

    def release(self) -> None:
        self._depth -= 1
        try:
            if self._depth == 0:
                release, self._release = self._release, None
                if release is not None:
                    release()
        finally:
            self._local.release()

    @property
    def held(self) -> bool:
        return self._depth > 0

    def __enter__(self) -> "StorageLock":
        self.acquire()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.release()

    def _acquire_shared(self) -> Callable[[], None] | None:
        url = self.url
        if self._kind == "local" or url is None:  # the url is None exactly for "local"
            return None
        if self._kind == "dask":
            return self._dask.acquire()
        if self._kind == "file":
            fh = open(self._path, "a+")
            try:
                fcntl.flock(fh, fcntl.LOCK_EX)
            except BaseException:
                fh.close()
                raise

            def unlock() -> None:
                try:
                    fcntl.flock(fh, fcntl.LOCK_UN)
                finally:
                    fh.close()
            return unlock
        import sqlalchemy

        if self._engine is None:
            self._engine = sqlalchemy.create_engine(url, poolclass=sqlalchemy.pool.NullPool)
        conn = self._engine.connect()
        try:
            if url.startswith("postgresql"):
                conn.execute(sqlalchemy.text(f"SELECT pg_advisory_lock({self._key})"))
                unlock_sql = f"SELECT pg_advisory_unlock({self._key})"
            else:
                conn.execute(sqlalchemy.text(f"SELECT GET_LOCK('frugalnas{self._key}', -1)"))
                unlock_sql = f"SELECT RELEASE_LOCK('frugalnas{self._key}')"
        except BaseException:
            conn.close()
            raise

        def unlock_database() -> None:
            try:
                conn.execute(sqlalchemy.text(unlock_sql))
            except Exception:  # the session is gone; so is its lock
                pass
            finally:
                conn.close()
        return unlock_database


_LOCKS: dict[tuple[str | None, str], StorageLock] = {}
_LOCKS_GUARD = threading.Lock()


def _forget_locks_in_child() -> None:
    """A forked child starts with no locks: those it inherited may be held by threads of the
    parent that do not exist in it (a re-entrant lock it could never take), and a file or
    database lock the parent holds is the parent's, not the child's. The guard itself may have
    been held by such a thread at the fork: the child, with one thread, releases it."""
    _LOCKS.clear()
    if _LOCKS_GUARD.locked():
        _LOCKS_GUARD.release()


if hasattr(os, "register_at_fork"):
    os.register_at_fork(after_in_child=_forget_locks_in_child)


def storage_lock(url: str | None, purpose: str = "trials") -> StorageLock:
    """The process's :class:`StorageLock` for ``url`` and ``purpose`` (one object each, so
    nested uses in one thread re-enter it)."""
    with _LOCKS_GUARD:
        lock = _LOCKS.get((url, purpose))
        if lock is None:
            lock = _LOCKS[(url, purpose)] = StorageLock(url, purpose)
        return lock


def study_lock(study: Any, purpose: str) -> StorageLock:
    """A :class:`StorageLock` for ``purpose`` shared by every process on the storage of
    ``study`` (a frugalnas or optuna study); process-local for storages without a URL."""
    ostudy = getattr(study, "optuna_study", study)
    url = optuna_compat.storage_url(ostudy)
    if url is None:
        url = getattr(optuna_compat.unwrapped(optuna_compat.storage_of(ostudy)), "journal_url",
                      None)
    if url is not None and not url.startswith(("sqlite:///", "journal:", "postgresql", "mysql")) \
            and not is_dask_url(url):
        url = None
    return storage_lock(url, purpose)


@contextlib.contextmanager
def file_lock(path: Path) -> Iterator[None]:
    """An exclusive lock on ``path`` (created if missing) across processes of this machine."""
    with open(path, "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
