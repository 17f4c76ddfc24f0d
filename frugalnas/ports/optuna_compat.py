"""The one place frugalnas touches optuna internals. Every call here has no public equivalent
in the supported optuna range (``SUPPORTED_OPTUNA`` below, declared in pyproject.toml); a test
runs each against the installed optuna, so an upgrade that breaks one fails there, not in a
user's study."""

from __future__ import annotations

from collections.abc import Collection
from typing import Any

import optuna
from optuna.storages import BaseStorage, InMemoryStorage, RDBStorage
from optuna.trial import FrozenTrial

__all__ = ["SUPPORTED_OPTUNA", "BaseHeartbeat", "storage_of", "trial_id", "set_trial_system_attr",
           "fresh_trials", "TrialFeed", "storage_url", "heartbeat_interval"]

#: The optuna versions frugalnas is tested with (lower bound inclusive, upper exclusive).
SUPPORTED_OPTUNA = ("4.0", "6.0")

try:  # optuna >= 4: heartbeats live in a private module; there is no public alias.
    from optuna.storages._heartbeat import BaseHeartbeat
except ImportError:  # pragma: no cover - outside the supported range
    BaseHeartbeat = None  # type: ignore[assignment,misc]
try:  # optuna wraps every RDBStorage in this read cache (``optuna.storages.get_storage``).
    from optuna.storages._cached_storage import _CachedStorage
except ImportError:  # pragma: no cover - outside the supported range
    _CachedStorage = None  # type: ignore[assignment,misc]


class StorageWrapper(BaseStorage):
    """A storage that hands optuna's storage API on to the storage it wraps, :attr:`inner`
    (frugalnas's worker storage). What a storage is (in memory, an RDB, its URL) is read from
    the wrapped one: :func:`unwrapped`."""

    inner: BaseStorage


def unwrapped(storage: BaseStorage) -> BaseStorage:
    """The storage that holds the trials: ``storage``, or the one a wrapper hands on to."""
    return storage.inner if isinstance(storage, StorageWrapper) else storage


def storage_of(study: optuna.Study) -> BaseStorage:
    """The storage behind ``study`` (``optuna.Study`` keeps it private)."""
    return study._storage


def is_in_memory(study: optuna.Study) -> bool:
    """Whether ``study`` lives in an in-memory storage (this process's alone)."""
    return isinstance(unwrapped(storage_of(study)), InMemoryStorage)


def trial_id(trial: FrozenTrial | optuna.Trial) -> int:
    """The storage id of a trial (optuna exposes only its number)."""
    return trial._trial_id


def set_trial_system_attr(study: optuna.Study, trial: FrozenTrial | optuna.Trial, key: str,
                          value: Any) -> None:
    """Record a system attribute on a trial from inside a sampler, where only the frozen trial
    is at hand (``optuna.Trial.set_system_attr`` is deprecated and not available there)."""
    storage_of(study).set_trial_system_attr(trial_id(trial), key, value)


def fresh_trials(study: optuna.Study) -> list[FrozenTrial]:
    """Every trial of ``study`` read from its storage now, bypassing the per-process cache,
    so trials written by other workers since the last read are included."""
    return study._get_trials(deepcopy=False, use_cache=False)


class TrialFeed:
    """Reads one study's trials incrementally: each :meth:`read` returns the trials created
    since the previous one and those the caller asks for again (such as the ones it read
    unfinished), fresh from the storage (trials written by other workers included).

    The cost follows the number of trials returned, not the study's length, for the in-memory
    storage and for RDB storages (optuna's cache in front of an RDB, or a bare RDBStorage such
    as the one a worker wraps, read from the database only the trials created or unfinished
    since the last read); other storages (journal, gRPC) read every trial and keep those asked
    for. One feed serves one study; it is not thread-safe (its owner holds a lock)."""

    def __init__(self) -> None:
        #: Every trial numbered below this has been returned by a :meth:`read`.
        self.next_number = 0
        self._last_id = -1  # a bare RDB's largest trial id returned (ids grow with numbers)
        self._ids: dict[int, int] = {}  # a bare RDB's ids of the unfinished trials returned

    def read(self, study: optuna.Study, again: Collection[int] = ()) -> list[FrozenTrial]:
        """The trials numbered :attr:`next_number` or above, and those numbered in ``again``
        (below it), in number order; :attr:`next_number` moves past the last one."""
        return self.read_storage(storage_of(study), study._study_id, again)

    def read_storage(self, storage: BaseStorage, study_id: int,
                     again: Collection[int] = ()) -> list[FrozenTrial]:
        """:meth:`read` for the study ``study_id`` of ``storage`` (for a storage wrapper that
        has no ``optuna.Study``)."""
        trials = self._fetch(storage, study_id, sorted(n for n in again if n < self.next_number))
        if trials and trials[-1].number >= self.next_number:
            self.next_number = trials[-1].number + 1
        return trials

    def _fetch(self, storage: BaseStorage, study_id: int, wanted: list[int]) -> list[FrozenTrial]:
        storage = unwrapped(storage)
        start = self.next_number
        if isinstance(storage, InMemoryStorage):
            with storage._lock:
                listed = storage._studies[study_id].trials  # trial number == position
                return [listed[n] for n in wanted if n < len(listed)] + listed[start:]
        if _CachedStorage is not None and isinstance(storage, _CachedStorage):
            storage._read_trials_from_remote_storage(study_id)
            with storage._lock:
                cached = storage._studies[study_id].trials  # trial number -> trial
                # An RDB numbers a study's trials 0, 1, 2, ... in creation order.
                if all(n in cached for n in range(start, len(cached))):
                    return ([cached[n] for n in wanted if n in cached]
                            + [cached[n] for n in range(start, len(cached))])
        elif isinstance(storage, RDBStorage):
            if all(n in self._ids for n in wanted):
                read = storage._get_trials(study_id, None, {self._ids[n] for n in wanted},
                                           self._last_id)
                read.sort(key=lambda t: t.number)
                if all(t.number >= start or t.number in wanted for t in read):
                    return self._note_ids(read)
            keep = set(wanted)
            return self._note_ids([t for t in storage.get_all_trials(study_id, deepcopy=False)
                                   if t.number >= start or t.number in keep])
        keep = set(wanted)
        # Storages without a read cache (journal, gRPC, Dask) read every trial fresh.
        return [t for t in storage.get_all_trials(study_id, deepcopy=False)
                if t.number >= start or t.number in keep]

    def _note_ids(self, trials: list[FrozenTrial]) -> list[FrozenTrial]:
        for t in trials:
            self._last_id = max(self._last_id, t._trial_id)
            if t.state.is_finished():
                self._ids.pop(t.number, None)
            else:
                self._ids[t.number] = t._trial_id
        return trials


def storage_url(study: optuna.Study) -> str | None:
    """The database URL of an RDB storage (``None`` for other storages)."""
    inner = unwrapped(storage_of(study))
    url = getattr(inner, "url", None)
    if url is None:
        url = getattr(getattr(inner, "_backend", None), "url", None)
    return url


def heartbeat_interval(storage: BaseStorage) -> int | None:
    """The heartbeat interval of a storage that supports heartbeats, else ``None``."""
    if BaseHeartbeat is not None and isinstance(storage, BaseHeartbeat):
        return storage.get_heartbeat_interval()
    return None
