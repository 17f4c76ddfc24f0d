"""Workers: many processes, on one machine or many, sharing one optuna storage.

Each worker runs trials until the study holds ``n_trials`` finished (COMPLETE or PRUNED)
trials plus the ones running now. Three things are shared through the storage:

* **The quota.** The check and the creation of a trial happen under one lock (a file lock
  beside a sqlite or journal file; a PostgreSQL advisory lock or a MySQL named lock for
  server databases; a lock kept by the Dask scheduler for a study in its memory), so the
  workers together run exactly ``n_trials``.
* **The proposals.** The same lock is held from the creation of a trial until its
  architecture is recorded, so each strategy sees every architecture other workers
  evaluated or are running, and a proposal that repeats one anyway (an optuna sampler that
  does not look) becomes a FAIL trial with ``fail_reason = "duplicate architecture: ..."``
  instead of a second evaluation (unless ``repeats=True``).
* **Liveness.** With ``heartbeat`` set, optuna's heartbeat marks the trials of a dead worker
  FAIL after ``grace`` seconds (a trial has a heartbeat from the moment it is created, so a
  worker killed while its strategy proposes is detected too); the plugins are told (MLflow
  closes the run as KILLED) and, with ``retries``, the same architecture is queued again.
  Finishing a trial (a tell, a stale check's FAIL) holds a lock of its own, so a trial is
  finished once even where the database does not isolate the read of its state (sqlite).

:class:`StorageLock` is public: the MLflow plugin serializes its writes for one study with
``storage_lock(url, "mlflow")``, across machines when the storage is a database server.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import os
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports import optuna_compat
from frugalnas.ports.config import DEFAULT_MAX_FAILURES, ISOLATION_MODES, StudyConfig
from frugalnas.ports.errors import ConfigError, FrugalnasError, check_choice, check_range
from frugalnas.ports.keys import ARCHITECTURE_ATTR, FAIL_REASON_ATTR
from frugalnas.ports.optuna_compat import BaseHeartbeat, heartbeat_interval
from frugalnas.engine.runner import signals_interrupt, storage_failures_stop
from frugalnas.engine.dask_url import is_dask_url
from frugalnas.engine.storage_url import storage_error
from frugalnas.ports.trial_architecture import architecture_from

if TYPE_CHECKING:
    from frugalnas.host.plugins import PluginHost
    from frugalnas.ports.space import SearchSpace
    from frugalnas.engine.study import Study

COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
#: Trials whose architecture another trial must not evaluate again.
TAKEN_STATES = COUNTED_STATES
#: A worker whose strategy proposes this many taken architectures in a row stops.
MAX_DUPLICATES_IN_A_ROW = 20
#: How the fail reason of a refused repeat starts (they have their own limit, above).
DUPLICATE_REASON = "duplicate architecture"
#: How optuna's ``tell`` refuses a trial it already reads as finished (by another worker's
#: stale check); one finished between that read and the write raises UpdateFinishedTrialError.
FINISHED_ELSEWHERE = "Cannot tell a "
SUPPORTED_URLS = "sqlite:///PATH, journal:PATH, postgresql://..., mysql://..."


_EMPTY_WAITING = optuna.trial.create_trial(state=TrialState.WAITING)


class QuotaReached(Exception):
    """Raised inside ``create_new_trial`` when the study already has its trials."""


class DuplicateArchitecture(FrugalnasError):
    """A worker's strategy proposed an architecture another trial evaluated or runs."""


@contextlib.contextmanager
def quiet_experimental() -> Iterator[None]:
    """Hide optuna's ExperimentalWarning for features frugalnas itself uses (heartbeats,
    stale-trial retries): the user did not choose them and cannot act on the warning."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        yield


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


# -- the storage wrapper ----------------------------------------------------------------------
def _delegate(name: str) -> Callable[..., Any]:
    def method(self: "QuotaStorage", *args: Any, **kwargs: Any) -> Any:
        return getattr(self.inner, name)(*args, **kwargs)
    method.__name__ = name
    return method


#: Attributes a :class:`QuotaStorage` keeps itself; any other attribute the inner storage
#: has is read from and written to it (``storage.heartbeat_interval = 5`` reaches optuna's
#: storage, as it would on a bare ``RDBStorage``).
_OWN_ATTRS = frozenset({
    "inner", "n_trials", "repeats", "space", "lock", "finish_lock", "lock_url",
    "duplicates_in_a_row", "study_id", "_proposal", "_keys", "_feed", "_feed_study",
    "_trials"})


class QuotaStorage(optuna_compat.StorageWrapper, BaseHeartbeat):
    """An optuna storage that refuses new trials once the study has ``n_trials``, keeps the
    proposal of a new trial exclusive until its architecture is recorded (refusing one that
    another trial took, unless ``repeats``), and records each trial's first heartbeat at
    creation. Every other method of optuna's storage API goes to ``inner`` unchanged, and so
    do the settings optuna's storage has (``heartbeat_interval``, ``grace_period``,
    ``heartbeat_stale_trial_callback``, ``failed_trial_callback``, ...), read or written.

    Code that needs the storage optuna made (``isinstance(storage, RDBStorage)``) uses
    :attr:`inner`. A QuotaStorage can be pickled and deep-copied (a study sent to another
    process): its locks are not copied; the copy takes the locks of its own process for the
    same URL, and a proposal in progress is not carried over."""

    def __init__(self, inner: BaseStorage, url: str, n_trials: int, *, repeats: bool = False,
                 space: SearchSpace | None = None):
        self.inner, self.n_trials, self.repeats, self.space = inner, n_trials, repeats, space
        self.lock_url = url
        self.lock = storage_lock(url, "trials")
        self.finish_lock = storage_lock(url, "finish")
        self.duplicates_in_a_row = 0
        self._proposal: tuple[int, int] | None = None  # (trial id, study id) holding the lock
        self._keys: dict[str, str | None] = {}
        self.study_id: int | None = None
        # The study's trials as last read under the lock; each proposal reads only the trials
        # created since and those unfinished then, so its cost does not grow with the study.
        self._feed = optuna_compat.TrialFeed()
        self._feed_study: int | None = None
        self._trials: dict[int, FrozenTrial] = {}

    # -- optuna's storage contract: copies, settings ---------------------------------------
    def __getstate__(self) -> dict[str, Any]:
        """What a copy keeps: no lock (a thread lock cannot be pickled, and a lock held here
        is this process's), no proposal in progress, no cache of the trials read."""
        state = {k: v for k, v in self.__dict__.items()
                 if k not in ("lock", "finish_lock", "_proposal", "_feed", "_trials", "_keys")}
        state["_feed_study"] = None
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        object.__setattr__(self, "__dict__", dict(state))
        self.lock = storage_lock(self.lock_url, "trials")
        self.finish_lock = storage_lock(self.lock_url, "finish")
        self._proposal = None
        self._keys = {}
        self._feed, self._trials = optuna_compat.TrialFeed(), {}

    def __setattr__(self, name: str, value: Any) -> None:
        inner = self.__dict__.get("inner")
        if name not in _OWN_ATTRS and inner is not None and hasattr(inner, name) \
                and not hasattr(type(self), name):
            setattr(inner, name, value)
        else:
            object.__setattr__(self, name, value)

    def _read_trials(self, study_id: int) -> list[FrozenTrial]:
        """Every trial of ``study_id``, fresh from the storage: held under the lock."""
        if self._feed_study != study_id:
            self._feed, self._trials, self._feed_study = optuna_compat.TrialFeed(), {}, study_id
        unfinished = [n for n, t in self._trials.items() if not t.state.is_finished()]
        for t in self._feed.read_storage(self.inner, study_id, unfinished):
            self._trials[t.number] = t
        return list(self._trials.values())

    # -- the quota and the exclusive proposal --------------------------------------------
    def create_new_trial(self, study_id: int, template_trial: FrozenTrial | None = None) -> int:
        self.end_proposal()
        self.study_id = study_id
        waiting = template_trial is not None and template_trial.state == TrialState.WAITING
        self.lock.acquire()
        try:
            counted = sum(t.state in COUNTED_STATES for t in self._read_trials(study_id))
            if counted >= self.n_trials and not waiting:
                raise QuotaReached(f"study has {counted} of {self.n_trials} trials")
            if template_trial is None and heartbeat_interval(self.inner) is not None:
                trial_id = self._create_with_heartbeat(study_id)
            else:
                trial_id = self.inner.create_new_trial(study_id, template_trial)
        except BaseException:
            self.lock.release()
            raise
        if template_trial is None and not self.repeats:
            self._proposal = (trial_id, study_id)  # released when its architecture is recorded
        else:
            self.lock.release()
        return trial_id

    def _create_with_heartbeat(self, study_id: int) -> int:
        """A new RUNNING trial that has a heartbeat from its first moment: it is created
        WAITING, given its heartbeat, then set RUNNING. A worker killed in between leaves a
        WAITING trial without parameters, which the next worker takes and runs; a RUNNING
        trial without a heartbeat would never become stale (optuna skips those).

        No heartbeat follows from this storage: within ``optimize`` optuna's heartbeat thread
        starts as soon as ``ask`` returns (and the strategy proposes inside the objective,
        under it); a trial asked outside ``optimize`` and abandoned goes stale after the
        grace, by optuna's rules, and its stale callbacks and retries run."""
        while True:
            trial_id = self.inner.create_new_trial(study_id, _EMPTY_WAITING)
            self._heartbeat_storage().record_heartbeat(trial_id)
            if self.inner.set_trial_state_values(trial_id, TrialState.RUNNING):
                return trial_id

    def _take_waiting(self, trial_id: int) -> bool:
        """Optuna pops a WAITING trial (queued by a user or a retry, or left by a worker
        killed while creating it): its heartbeat first, then RUNNING. One without parameters
        needs a proposal, which is exclusive like a new trial's."""
        self.end_proposal()
        frozen = self.inner.get_trial(trial_id)
        proposes = not frozen.params and "fixed_params" not in frozen.system_attrs
        if proposes:
            self.lock.acquire()
        try:
            if heartbeat_interval(self.inner) is not None:
                self._heartbeat_storage().record_heartbeat(trial_id)
            ok = self.inner.set_trial_state_values(trial_id, TrialState.RUNNING)
        except BaseException:
            if proposes:
                self.lock.release()
            raise
        if proposes:
            if ok and not self.repeats and self.study_id is not None:
                self._proposal = (trial_id, self.study_id)
            else:
                self.lock.release()
        return ok

    def set_trial_user_attr(self, trial_id: int, key: str, value: Any) -> None:
        if self._proposal is None or self._proposal[0] != trial_id or key != ARCHITECTURE_ATTR:
            return self.inner.set_trial_user_attr(trial_id, key, value)
        try:
            taken = self._taken_by(trial_id, self._proposal[1], value)
            self.inner.set_trial_user_attr(trial_id, key, value)
            if taken is not None:
                self.duplicates_in_a_row += 1
                reason = (f"{DUPLICATE_REASON}: trial {taken.number} "
                          f"({taken.state.name}) has {value}; workers do not evaluate an "
                          "architecture twice")
                self.inner.set_trial_user_attr(trial_id, FAIL_REASON_ATTR, reason)
                raise DuplicateArchitecture(reason)
            self.duplicates_in_a_row = 0
        finally:
            self.end_proposal()

    def set_trial_state_values(self, trial_id: int, state: TrialState,
                               values: Any = None) -> bool:
        if state == TrialState.RUNNING:
            return self._take_waiting(trial_id)
        try:
            # sqlite reads the trial's state outside the write's transaction, so two workers
            # failing one stale trial at once (or one failing it while its owner tells it)
            # would both succeed, and both retry it; one lock makes the second write see the
            # first and be refused as optuna refuses any update of a finished trial.
            with self.finish_lock:
                return self.inner.set_trial_state_values(trial_id, state, values)
        finally:
            if self._proposal is not None and self._proposal[0] == trial_id:
                self.end_proposal()

    def end_proposal(self, error: BaseException | None = None) -> None:
        """Release the lock held for a proposal; with ``error`` (the strategy raised while
        proposing), fail that trial with the error as its reason."""
        proposal, self._proposal = self._proposal, None
        if proposal is None:
            return
        try:
            if error is not None:
                reason = f"{type(error).__name__}: {error}".splitlines()[0][:2000]
                with contextlib.suppress(Exception):
                    self.inner.set_trial_user_attr(proposal[0], FAIL_REASON_ATTR, reason)
                    self.inner.set_trial_state_values(proposal[0], TrialState.FAIL)
        finally:
            self.lock.release()

    def _key(self, text: str | None, params: dict[str, Any] | None = None) -> str | None:
        """A comparable key of an architecture string (or of complete params): the rule of
        :func:`~frugalnas.ports.trial_architecture.architecture_from` on a string that may not
        be stored yet, cached per string (the quota reads every trial on each proposal), and
        ``None``, never an error, when it does not read (another space's trial is no duplicate)."""
        if self.space is None:
            return text
        if text and text in self._keys:
            return self._keys[text]
        if not text and not params:
            return None
        try:
            key: str | None = architecture_from(text, params or {}, self.space).key
        except Exception:
            key = None
        if text:
            self._keys[text] = key
        return key

    def _taken_by(self, trial_id: int, study_id: int, text: Any) -> FrozenTrial | None:
        key = self._key(str(text))
        if key is None:
            return None
        for t in self._read_trials(study_id):
            if t.state not in TAKEN_STATES or optuna_compat.trial_id(t) == trial_id:
                continue
            if self._key(t.user_attrs.get(ARCHITECTURE_ATTR), t.params) == key:
                return t
        return None

    # -- heartbeats -----------------------------------------------------------------------
    def get_heartbeat_interval(self) -> int | None:
        return heartbeat_interval(self.inner)

    def _heartbeat_storage(self) -> BaseHeartbeat:
        """``inner`` as the heartbeat storage it is: called only where
        :func:`heartbeat_interval` of ``inner`` is not ``None``, which checks that class."""
        return cast(BaseHeartbeat, self.inner)

    def __getattr__(self, name: str) -> Any:
        if name == "inner" or name.startswith("__"):  # not set yet (copy, unpickling)
            raise AttributeError(name)
        return getattr(self.inner, name)


# Every method of optuna's storage API that QuotaStorage does not define goes to the inner
# storage, abstract or not (RDBStorage overrides remove_session, get_best_trial, ...).
for _name in sorted({n for base in (BaseStorage, BaseHeartbeat) for n, v in vars(base).items()
                     if callable(v) and not n.startswith("__")} - set(vars(QuotaStorage))):
    setattr(QuotaStorage, _name, _delegate(_name))
QuotaStorage.__abstractmethods__ = frozenset()


class _HeartbeatStorage(optuna.storages.RDBStorage):
    """An RDB storage whose heartbeat writes never raise (optuna records them in a thread of
    its own, where an exception would print a traceback): a heartbeat that cannot be written
    (a full disk, a dropped connection) is a missed one, which the grace allows; the trial's
    own writes meet the same failure and report it in one line."""

    def record_heartbeat(self, trial_id: int) -> None:
        with contextlib.suppress(Exception):
            super().record_heartbeat(trial_id)


def check_heartbeat_arguments(heartbeat: Any, grace: Any) -> None:
    """Raise :class:`ConfigError` (a ``ValueError``, as optuna raises) for what optuna's
    ``RDBStorage`` refuses, in one line naming the value and the valid range: a heartbeat or
    a grace that is not a positive whole number of seconds (``0`` included: it is not read as
    "the default"), and a grace without a heartbeat (it would be ignored)."""
    for what, value in (("heartbeat", heartbeat), ("grace", grace)):
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise ConfigError(f"invalid {what} {value!r}; valid: a whole number of seconds "
                              ">= 1, or None for no " + ("heartbeats" if what == "heartbeat"
                                                         else "grace (2 x the heartbeat)"))
    if grace is not None and heartbeat is None:
        raise ConfigError(f"invalid grace {grace!r} without a heartbeat; valid: give a "
                          "heartbeat >= 1 (seconds) with it, or no grace")


def make_storage(url: str, *, heartbeat: int | None = None, grace: int | None = None,
                 on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None) -> BaseStorage:
    """An optuna storage for ``url`` with heartbeats when ``heartbeat`` seconds are given,
    a trial going stale after ``grace`` seconds without one (default twice the heartbeat).
    The arguments are checked as optuna's ``RDBStorage`` checks them, for every kind of URL
    (:func:`check_heartbeat_arguments`)."""
    check_heartbeat_arguments(heartbeat, grace)
    if url.startswith("journal:"):
        from optuna.storages.journal import JournalFileBackend

        if heartbeat:
            raise ConfigError("heartbeats need an RDB storage (sqlite/postgresql/mysql URL); "
                              f"got {url!r}")
        storage = optuna.storages.JournalStorage(JournalFileBackend(url[len("journal:"):]))
        storage.journal_url = url  # type: ignore[attr-defined]
        return storage
    if is_dask_url(url):
        from frugalnas.engine.dask_storage import open_dask_storage

        return open_dask_storage(url, heartbeat=heartbeat, grace=grace, on_stale=on_stale)
    if not url.startswith(("sqlite:///", "postgresql", "mysql")):
        raise ConfigError(f"unsupported storage URL {url!r}; valid: {SUPPORTED_URLS}")
    kwargs: dict[str, Any] = {}
    if heartbeat:
        kwargs = {"heartbeat_interval": heartbeat,
                  "grace_period": 2 * heartbeat if grace is None else grace,
                  "heartbeat_stale_trial_callback": on_stale}
    engine_kwargs = {"connect_args": {"timeout": 60}} if url.startswith("sqlite") else None
    try:
        # Workers starting together on a new database would race to create its tables.
        with storage_lock(url, "trials"), quiet_experimental():
            factory = _HeartbeatStorage if heartbeat else optuna.storages.RDBStorage
            return factory(url, engine_kwargs=engine_kwargs, **kwargs)
    except FrugalnasError:
        raise
    except Exception as exc:  # unreachable server, refused login: one line, password masked
        error = storage_error(url, exc)
        if error is None:
            raise
        raise error from exc


class WorkerGaveUp(FrugalnasError):
    """Every one of a worker's last ``max_failures`` trials failed."""

    def __init__(self, max_failures: int, reasons: list[str]):
        counts: dict[str, int] = {}
        for r in reasons:
            counts[r] = counts.get(r, 0) + 1
        common = "; ".join(f"{n} x {r}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])
        super().__init__(f"the last {max_failures} trials of this worker failed ({common}); it "
                         "stops (raise --max-failures, or 0 to never stop)")


def check_worker_settings(heartbeat: int | None, grace: int | None, retries: int,
                          max_failures: int = DEFAULT_MAX_FAILURES) -> None:
    """Raise ConfigError for heartbeat/grace/retries/max_failures values that cannot work."""
    check_range("max_failures", max_failures, 0)
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
               timeout: float | None = None, host: PluginHost | None = None,
               repeats: bool = False, max_failures: int = DEFAULT_MAX_FAILURES,
               isolate: str = "none") -> Study:
    """Join (or create) the study and run trials until it has ``n_trials``; returns the Study.
    ``repeats=True`` lets the strategy evaluate an architecture another trial has. The worker
    gives up (:class:`WorkerGaveUp`) after ``max_failures`` of its own trials failed in a row
    (failed trials do not count towards ``n_trials``, so it would otherwise never end); 0
    never gives up. ``isolate`` says where trials are evaluated, as for ``Study.optimize``."""
    from dataclasses import asdict

    from frugalnas.engine.study import create_study

    if not isinstance(n_trials, int) or n_trials < 1:
        raise ConfigError(f"invalid n_trials {n_trials!r} for a worker; expected an integer >= 1")
    check_worker_settings(heartbeat, grace, retries, max_failures)
    check_choice("isolate", isolate, ISOLATION_MODES)
    holder: dict[str, Any] = {}
    with quiet_experimental():
        retry = optuna.storages.RetryHeartbeatStaleTrialCallback(max_retry=retries) \
            if retries else None

    def on_stale(ostudy: optuna.Study, frozen: FrozenTrial) -> None:
        study = holder.get("study")
        if study is not None:
            try:
                study.report_stale_trial(frozen)
            except Exception:
                # A trial killed before its architecture was complete: the plugins learn of
                # it from the storage (the MLflow plugin reconciles at the next start/end).
                pass
        if retry is not None:
            with quiet_experimental():
                retry(ostudy, frozen)

    inner = make_storage(storage, heartbeat=heartbeat, grace=grace, on_stale=on_stale)
    # QuotaStorage's abstract methods are delegated to ``inner`` when this module loads (the
    # loop after the class clears __abstractmethods__), which mypy cannot see.
    quota = QuotaStorage(inner, storage, n_trials, repeats=repeats)  # type: ignore[abstract]
    cfg = asdict(config)
    study = create_study(storage=quota, study_name=study_name, load_if_exists=True, host=host,
                         **{k: v for k, v in cfg.items() if k != "directions"},
                         directions=config.directions)
    quota.space = study.space
    quota.study_id = inner.get_study_id_from_name(study.name)
    holder["study"] = study
    study.planned_trials = n_trials
    study.runner.isolate(isolate)
    # One plugin session (MLflow tracker, progress bar) for the whole worker, so that stale
    # trials failed while this worker waits below are still reported to MLflow.
    study.runner.start()
    try:
        with signals_interrupt(), storage_failures_stop():
            _work(study, quota, timeout, heartbeat, max_failures)
    finally:
        study.runner.finish()
    return study


def _work(study: Any, quota: QuotaStorage, timeout: float | None, heartbeat: int | None,
          max_failures: int = DEFAULT_MAX_FAILURES) -> None:
    start = time.monotonic()
    failed: list[str] = []  # reasons of this worker's trials that failed in a row

    def failures(frozen: FrozenTrial) -> str | None:
        reason = str(frozen.user_attrs.get(FAIL_REASON_ATTR, "no reason recorded"))
        if frozen.state != TrialState.FAIL:
            failed.clear()
        elif not reason.startswith(DUPLICATE_REASON):
            failed.append(reason)
        return "failures" if max_failures and len(failed) >= max_failures else None

    def duplicates(frozen: FrozenTrial) -> str | None:
        return "duplicates" if quota.duplicates_in_a_row >= MAX_DUPLICATES_IN_A_ROW else None

    # The worker's own limits first, then the stop rule every run shares (the strategy's).
    stop = study.runner.stop_rule(failures, duplicates)
    while True:
        left = None if timeout is None else timeout - (time.monotonic() - start)
        if left is not None and left <= 0:
            return
        try:
            with study.runner.interrupts():
                study.optuna_study.optimize(study.runner.run, n_trials=None, timeout=left,
                                            catch=(Exception,), callbacks=[stop],
                                            gc_after_trial=False)
        except QuotaReached:
            study.runner.raise_pending()  # a signal while the quota stopped a trial's creation
        except (ValueError, optuna.exceptions.UpdateFinishedTrialError) as exc:
            if isinstance(exc, ValueError) and not str(exc).startswith(FINISHED_ELSEWHERE):
                quota.end_proposal(error=exc)
                raise
            # Another worker failed this trial as stale while it still ran (its heartbeat
            # thread starved on a loaded machine): the storage keeps that verdict, this
            # worker goes on with the next trial.
            quota.end_proposal()
            print(f"frugalnas: warning: worker {os.getpid()}: a trial of this worker was "
                  "failed as stale by another worker before it finished (heartbeat missed; "
                  "raise --grace on a loaded machine); going on", file=sys.stderr, flush=True)
            continue
        except BaseException as exc:  # the strategy raised while proposing
            quota.end_proposal(error=exc)
            raise
        else:
            if stop.reason == "failures":
                raise WorkerGaveUp(max_failures, failed)
            if stop.reason == "duplicates":
                raise ConfigError(
                    f"strategy {study.config.strategy!r} proposed {MAX_DUPLICATES_IN_A_ROW} "
                    "architectures in a row that other trials already evaluated or run (is the "
                    "search space exhausted?); this worker stops")
            return  # timeout, or the strategy's search is over
        # The quota counts running and queued trials. Queued ones (retries, a trial whose
        # worker died while creating it) run next; trials of live workers finish; trials of
        # dead workers become FAIL once their heartbeat is stale, which frees their slots.
        trials = study.optuna_study.get_trials(
            deepcopy=False, states=(TrialState.RUNNING, TrialState.WAITING))
        if any(t.state == TrialState.WAITING for t in trials):
            continue
        if not trials or not heartbeat:
            return
        time.sleep(min(float(heartbeat), 5.0))
        with quiet_experimental():
            optuna.storages.fail_stale_trials(study.optuna_study)
