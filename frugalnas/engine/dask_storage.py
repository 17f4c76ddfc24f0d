"""Studies kept in the memory of a Dask scheduler: the storage URL ``dask:ADDRESS``
(``dask:tcp://10.0.0.5:8786``), what ``frugalnas run --cluster ADDRESS --storage dask`` gives
its workers.

optuna-integration's ``DaskStorage`` keeps an optuna in-memory storage on the scheduler and
forwards every storage call there. Workers also need heartbeats and a lock they all share,
which it lacks; this module keeps both on the scheduler too (:class:`Coordinator`):

* **Heartbeats** are stamped with the scheduler's clock, so no two machines' clocks are
  compared. A RUNNING trial whose last heartbeat (or, without one, its first sighting by the
  scheduler) is older than the grace is stale: a worker fails it as on a database.
* **Locks** (:class:`SchedulerLock`) belong to a Dask client; when that client goes away (its
  process died, its connection dropped) the scheduler releases its locks at once.

The scheduler runs this module's code (:func:`install`), so frugalnas and optuna-integration
must be installed where it runs, as where the workers run. Every study on one scheduler is
in one storage (:data:`STORAGE_NAME`), as the studies of one database are.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
import warnings
from collections.abc import Callable
from typing import Any

import optuna
from optuna.exceptions import ExperimentalWarning
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports.errors import ConfigError, one_line
from frugalnas.ports.optuna_compat import BaseHeartbeat, trial_id
from frugalnas.engine.dask_url import DASK_STORAGE, is_dask_url

#: The name of the scheduler's optuna storage that holds frugalnas's studies.
STORAGE_NAME = "frugalnas"
#: The scheduler extension (and plugin) that keeps heartbeats and locks.
EXTENSION = "frugalnas"
#: Seconds to reach the scheduler before opening the storage fails.
CONNECT_TIMEOUT = 5.0

try:
    from distributed.diagnostics.plugin import SchedulerPlugin
except ImportError:  # pragma: no cover - without the cluster extra nothing here is used
    SchedulerPlugin = object  # type: ignore[assignment,misc]


def scheduler_address(url: str) -> str:
    """The scheduler address of a ``dask:ADDRESS`` URL, or a ConfigError for a bare ``dask``
    (which only ``frugalnas run --cluster`` resolves)."""
    if not is_dask_url(url):
        raise ConfigError(f"invalid Dask storage URL {url!r}; expected dask:tcp://HOST:PORT")
    address = url[len(DASK_STORAGE) + 1:]
    if not address:
        raise ConfigError(f"storage {DASK_STORAGE!r} keeps the study in the memory of a Dask "
                          "scheduler: give --cluster tcp://HOST:PORT with it (or the URL "
                          "dask:tcp://HOST:PORT)")
    return address


class Coordinator(SchedulerPlugin):
    """Lives on the scheduler: the heartbeats of the trials in its optuna storages and the
    locks that workers share, each held by a Dask client until it releases it or leaves."""

    name = EXTENSION

    def __init__(self, scheduler: Any):
        self.scheduler = scheduler
        self.holders: dict[str, str] = {}            # lock name -> client id
        self.freed: dict[str, asyncio.Event] = {}    # lock name -> set when it is released
        self.beats: dict[tuple[str, int], float] = {}  # (storage, trial id) -> scheduler time
        scheduler.handlers.update({"frugalnas_lock": self.lock,
                                   "frugalnas_unlock": self.unlock,
                                   "frugalnas_heartbeat": self.heartbeat,
                                   "frugalnas_stale": self.stale})

    async def lock(self, name: str, client: str) -> bool:
        while self.holders.get(name, client) != client:
            await self.freed.setdefault(name, asyncio.Event()).wait()
        if client not in self.scheduler.clients:  # it left while it waited
            return False
        self.holders[name] = client
        return True

    def unlock(self, name: str, client: str) -> None:
        if self.holders.get(name) == client:
            del self.holders[name]
            freed = self.freed.pop(name, None)
            if freed is not None:
                freed.set()

    def remove_client(self, scheduler: Any, client: str) -> None:
        for name, holder in list(self.holders.items()):
            if holder == client:
                self.unlock(name, client)

    def heartbeat(self, storage: str, trial_id: int) -> None:
        self.beats[(storage, trial_id)] = time.monotonic()

    def stale(self, storage: str, study_id: int, grace: float) -> list[int]:
        inner = self.scheduler.extensions["optuna"].storages[storage]
        now = time.monotonic()
        out = []
        running = inner.get_all_trials(study_id, deepcopy=False, states=(TrialState.RUNNING,))
        for trial in running:
            seen = self.beats.setdefault((storage, trial_id(trial)), now)
            if now - seen > grace:
                out.append(trial_id(trial))
        # Forget the finished trials of this study; a trial not RUNNING yet beats again.
        ids = {trial_id(t) for t in inner.get_all_trials(study_id, deepcopy=False)} \
            - {trial_id(t) for t in running}
        for key in [k for k in self.beats if k[0] == storage and k[1] in ids]:
            del self.beats[key]
        return out


def install(dask_scheduler: Any) -> None:
    """Run on the scheduler (``client.run_on_scheduler``): add the :class:`Coordinator` once."""
    if EXTENSION not in dask_scheduler.extensions:
        coordinator = Coordinator(dask_scheduler)
        dask_scheduler.extensions[EXTENSION] = coordinator
        dask_scheduler.add_plugin(coordinator, name=EXTENSION)


def connect(address: str) -> Any:
    """A Dask client of the scheduler at ``address``: the worker's own inside a task of that
    cluster, else a new one (a ConfigError when the scheduler does not answer)."""
    import distributed

    try:
        worker = distributed.get_worker()
    except ValueError:
        worker = None
    if worker is not None and worker.scheduler.address == address:
        return distributed.get_client()
    try:
        return distributed.Client(address, timeout=CONNECT_TIMEOUT,  # type: ignore[no-untyped-call]
                                  set_as_default=False)
    except Exception as exc:
        raise ConfigError(f"Dask scheduler {address} is not reachable within "
                          f"{CONNECT_TIMEOUT:g} s ({one_line(exc)}); a dask: storage lives in "
                          "the memory of a running scheduler") from None


def _register(client: Any, address: str) -> None:
    try:
        client.run_on_scheduler(install)
    except Exception as exc:
        raise ConfigError(f"the Dask scheduler at {address} cannot keep a study "
                          f"({one_line(exc)}); install frugalnas and optuna-integration where "
                          "the scheduler runs") from None


def _dask_storage_class() -> type:
    try:
        from optuna_integration.dask import DaskStorage
    except ImportError as exc:
        raise ConfigError(f"a dask: storage needs optuna-integration and distributed "
                          f"({one_line(exc)}); pip install 'frugalnas[cluster]'") from None
    return DaskStorage  # type: ignore[no-any-return]


def open_dask_storage(url: str, *, heartbeat: int | None = None, grace: int | None = None,
                      on_stale: Callable[[optuna.Study, FrozenTrial], None] | None = None
                      ) -> optuna.storages.BaseStorage:
    """The optuna storage of ``url`` (``dask:ADDRESS``): the scheduler's, with heartbeats
    every ``heartbeat`` seconds, stale after ``grace`` (default twice the heartbeat)."""
    address = scheduler_address(url)
    base = _dask_storage_class()

    class SchedulerStorage(base, BaseHeartbeat):  # type: ignore[valid-type,misc]
        """optuna-integration's DaskStorage with heartbeats kept by the scheduler."""

        def get_heartbeat_interval(self) -> int | None:
            return heartbeat or None

        def get_heartbeat_stale_trial_callback(
                self) -> Callable[[optuna.Study, FrozenTrial], None] | None:
            return on_stale

        def record_heartbeat(self, trial_id: int) -> None:
            # A missed heartbeat (a dropped connection) is what the grace allows for.
            with contextlib.suppress(Exception):
                self.client.sync(self.client.scheduler.frugalnas_heartbeat,
                                 storage=self.name, trial_id=trial_id)

        def _get_stale_trial_ids(self, study_id: int) -> list[int]:
            if not heartbeat:
                return []
            ids: list[int] = self.client.sync(self.client.scheduler.frugalnas_stale,
                                              storage=self.name, study_id=study_id,
                                              grace=float(grace or 2 * heartbeat))
            return ids

        def __reduce__(self) -> tuple[Any, ...]:
            return (open_dask_storage, (url,))

    client = connect(address)
    _register(client, address)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", ExperimentalWarning)
        storage = SchedulerStorage(None, name=STORAGE_NAME, client=client)
    storage.url = url  # how frugalnas finds the locks of this storage (study_lock)
    return storage


class SchedulerLock:
    """A lock named ``name`` on the scheduler at ``address``, held by this process's Dask
    client: released by :meth:`release`, or by the scheduler when the client leaves."""

    def __init__(self, address: str, name: str):
        self.address, self.name = address, name
        self._client: Any = None

    def acquire(self) -> Callable[[], None]:
        """Wait for the lock; returns what releases it."""
        if self._client is None:
            client = connect(self.address)
            _register(client, self.address)
            self._client = client
        client = self._client
        if not client.sync(client.scheduler.frugalnas_lock, name=self.name, client=client.id):
            raise ConfigError(f"lost the connection to the Dask scheduler at {self.address} "
                              f"while waiting for lock {self.name!r}")

        def release() -> None:
            with contextlib.suppress(Exception):  # the client is gone; so is its lock
                client.sync(client.scheduler.frugalnas_unlock, name=self.name, client=client.id)
        return release
