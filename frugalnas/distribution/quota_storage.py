"""The storage the workers of one study share (:class:`QuotaStorage`): an optuna storage that
refuses new trials once the study has its quota, keeps the proposal of a new trial exclusive
until its architecture is recorded, and gives each trial a heartbeat from its creation; and
:func:`make_storage`, an optuna storage for a URL with heartbeats and one-line errors.
"""

from __future__ import annotations

import contextlib
import os
import warnings
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any, cast

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.storages import BaseStorage
from optuna.trial import FrozenTrial, TrialState

from frugalnas.distribution.liveness import (BEATING_PROCESS_ATTR, ProcessId, is_running,
                                             this_process)
from frugalnas.distribution.locks import SUPPORTED_URLS, storage_lock
from frugalnas.engine.dask_url import is_dask_url
from frugalnas.engine.storage_url import storage_error
from frugalnas.ports import optuna_compat
from frugalnas.ports.errors import ConfigError, FrugalnasError
from frugalnas.ports.keys import ARCHITECTURE_ATTR, FAIL_REASON_ATTR
from frugalnas.ports.optuna_compat import BaseHeartbeat, heartbeat_interval
from frugalnas.ports.trial_architecture import architecture_from

if TYPE_CHECKING:
    from frugalnas.ports.space import SearchSpace

COUNTED_STATES = (TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING, TrialState.WAITING)
#: Trials whose architecture another trial must not evaluate again.
TAKEN_STATES = COUNTED_STATES
#: How the fail reason of a refused repeat starts (a worker has its own limit of them).
DUPLICATE_REASON = "duplicate architecture"
#: How optuna's ``tell`` refuses a trial it already reads as finished (by another worker's
#: stale check); one finished between that read and the write raises UpdateFinishedTrialError.
FINISHED_ELSEWHERE = "Cannot tell a "


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
            self._first_heartbeat(trial_id)
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
                self._first_heartbeat(trial_id)
            # sqlite reads the WAITING state outside the write's transaction: without the
            # lock two workers could both take one queued trial (a retry) and both run it
            with self.finish_lock:
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

    def _first_heartbeat(self, trial_id: int) -> None:
        """The heartbeat a WAITING trial gets before this worker tries to set it RUNNING (so
        that a RUNNING trial always has one). It names no process: another worker may win
        the trial, and its own heartbeat thread names it (:class:`_HeartbeatStorage`)."""
        storage = self._heartbeat_storage()
        if isinstance(storage, _HeartbeatStorage):
            storage.record_unclaimed_heartbeat(trial_id)
        else:
            storage.record_heartbeat(trial_id)

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
    """An RDB storage whose heartbeats name their process and never raise, and whose stale
    check spares the trials of live processes on this machine.

    * A heartbeat that cannot be written (a full disk, a dropped connection) is a missed one,
      which the grace allows (optuna records them in a thread of its own, where an exception
      would print a traceback); the trial's own writes meet the same failure and report it.
    * The first heartbeat a process writes for a RUNNING trial records the process
      (:mod:`~frugalnas.distribution.liveness`); a heartbeat for a WAITING trial (written
      before a worker tries to take it, a race it may lose) records nothing. A trial past the grace is stale unless that
      process is another one that still runs on this machine: a worker whose heartbeat thread
      starved on a loaded machine keeps its trial, and a quota is not counted twice. The
      checking process's own trials, and those of processes it cannot see (another machine),
      follow the heartbeat alone, by the storage's clock."""

    def __init__(self, *args: Any, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self._claimed: set[tuple[int, int]] = set()  # (pid, trial id) recorded as beating

    def record_heartbeat(self, trial_id: int) -> None:
        with contextlib.suppress(Exception):
            self._claim(trial_id)
            super().record_heartbeat(trial_id)

    def record_unclaimed_heartbeat(self, trial_id: int) -> None:
        """A heartbeat that names no process (written before the trial is won)."""
        with contextlib.suppress(Exception):
            super().record_heartbeat(trial_id)

    def _claim(self, trial_id: int) -> None:
        if (os.getpid(), trial_id) in self._claimed:  # every later heartbeat: nothing to read
            return
        me = this_process()
        if me is None:
            return
        # A heartbeat for a WAITING trial may come from a process that then loses it.
        if self.get_trial(trial_id).state != TrialState.RUNNING:
            return
        self.set_trial_system_attr(trial_id, BEATING_PROCESS_ATTR, me.text())
        self._claimed.add((me.pid, trial_id))

    def _get_stale_trial_ids(self, study_id: int) -> list[int]:
        me = this_process()

        def spared(trial_id: int) -> bool:
            owner = ProcessId.parse(
                self.get_trial_system_attrs(trial_id).get(BEATING_PROCESS_ATTR))
            return owner is not None and owner != me and is_running(owner) is True

        return [t for t in super()._get_stale_trial_ids(study_id) if not spared(t)]


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
