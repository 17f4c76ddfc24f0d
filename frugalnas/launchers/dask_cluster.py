"""The ``dask`` launcher: a study's workers as tasks on an existing Dask cluster.

Each task runs one :class:`WorkerJob` (``run_worker``) in a thread of a Dask worker and holds
the task's resources (``resources={"GPU": 1}``) while it runs trials, one at a time. When a
Dask worker dies, its trial's heartbeat stops: another worker fails the trial once the grace
has passed and, with retries, proposes its architecture again; the scheduler gives the dead
worker's task to another (or a replacement) worker, where it joins the study again.

The storage ``dask`` keeps the study in the scheduler's memory (``dask:ADDRESS``, see
:mod:`frugalnas.engine.dask_storage`): no database server, the same guarantees.
"""

from __future__ import annotations

import os
import socket
import sys
import uuid
from pathlib import Path
from typing import Any

from frugalnas.ports.errors import ConfigError, one_line
from frugalnas.distribution.launcher import LaunchError, Launcher, WorkerJob, positive_workers
from frugalnas.engine.dask_url import DASK_STORAGE, is_dask_url
from frugalnas.engine.storage_url import masked

SCHEMES = ("tcp", "tls", "ws", "wss", "ucx")
#: Seconds to reach the scheduler before a run is refused.
CONNECT_TIMEOUT = 5.0


def check_address(address: Any) -> str:
    """``address`` as a scheduler address ``SCHEME://HOST:PORT``, or a ConfigError."""
    valid = "tcp://HOST:PORT (the address `dask scheduler` prints), e.g. tcp://10.0.0.5:8786"
    if not isinstance(address, str) or "://" not in address:
        raise ConfigError(f"invalid Dask scheduler address {address!r}; expected {valid}")
    scheme, _, rest = address.partition("://")
    host, colon, port = rest.rpartition(":")
    if scheme not in SCHEMES or not colon or not host or not port.isdigit():
        raise ConfigError(f"invalid Dask scheduler address {address!r}; expected {valid} "
                          f"(schemes: {', '.join(SCHEMES)})")
    return address


def _format(resources: dict[str, float]) -> str:
    return ",".join(f"{k}={v:g}" for k, v in sorted(resources.items()))


def storage_problem(storage: str) -> str | None:
    """Run on a Dask worker: why this machine cannot use ``storage``, or ``None``."""
    if is_dask_url(storage):
        try:
            import optuna_integration.dask  # noqa: F401
        except ImportError as exc:
            return f"optuna-integration's DaskStorage does not import there ({one_line(exc)})"
        return None
    if storage.startswith("sqlite:///"):
        folder = Path(storage[len("sqlite:///"):]).parent
        if not folder.is_dir():
            return f"folder {str(folder)!r} does not exist there"
        if not os.access(folder, os.W_OK):
            return f"folder {str(folder)!r} is not writable there"
        return None
    from sqlalchemy.engine import make_url

    url = make_url(storage)
    port = url.port or {"postgresql": 5432, "mysql": 3306}.get(url.get_backend_name(), 0)
    try:
        with socket.create_connection((url.host or "localhost", port), timeout=3):
            return None
    except OSError as exc:
        return f"cannot connect to {url.host}:{port} ({one_line(exc)})"


def run_job(job: WorkerJob) -> str:
    """A Dask task: one frugalnas worker of ``job``."""
    return job.run()


class DaskLauncher(Launcher):
    """Run a study's trials on the workers of the Dask cluster whose scheduler is at
    ``address``: ``workers`` tasks (default: one per thread of the workers that have
    ``resources``), each a frugalnas worker holding ``resources`` while it runs."""

    def __init__(self, address: str, workers: int | None = None,
                 resources: dict[str, float] | None = None):
        self.address = check_address(address)
        self.workers = None if workers is None else positive_workers(workers, "number of workers")
        self.resources = dict(resources or {})
        self.where = f"cluster {address}"

    def _client(self) -> Any:
        from distributed import Client

        try:
            return Client(self.address, timeout=CONNECT_TIMEOUT, set_as_default=False)
        except Exception as exc:
            raise ConfigError(f"Dask scheduler {self.address} is not reachable within "
                              f"{CONNECT_TIMEOUT:g} s ({one_line(exc)}); start one with "
                              "`dask scheduler` and give the address it prints") from None

    def _eligible(self, client: Any) -> dict[str, dict[str, Any]]:
        """The cluster's workers that have the resources a task asks for; a ConfigError when
        there are none."""
        workers: dict[str, dict[str, Any]] = client.scheduler_info(n_workers=-1)["workers"]
        if not workers:
            raise ConfigError(f"the Dask cluster at {self.address} has no workers; start some "
                              f"with `dask worker {self.address}`")
        eligible = {a: w for a, w in workers.items()
                    if all(w.get("resources", {}).get(k, 0) >= v
                           for k, v in self.resources.items())}
        if not eligible:
            offers = sorted({_format(w.get("resources") or {}) or "none"
                             for w in workers.values()})
            raise ConfigError(f"no worker of the Dask cluster at {self.address} has the "
                              f"resources {_format(self.resources)} that each trial asks for "
                              f"(its workers offer: {'; '.join(offers)}); start workers with "
                              f"`dask worker {self.address} --resources "
                              f"\"{_format(self.resources)}\"`")
        return eligible

    def shared_storage(self, storage: object) -> str:
        """``dask`` (a study kept in this cluster's scheduler) becomes ``dask:ADDRESS``;
        other storages must be ones the workers share (:func:`check_shared_storage`)."""
        if is_dask_url(storage):
            own = f"{DASK_STORAGE}:{self.address}"
            if storage not in (DASK_STORAGE, own):
                raise ConfigError(f"storage {storage!r} is kept by another Dask scheduler than "
                                  f"{self.where}'s; give {DASK_STORAGE} (or {own}) to keep the "
                                  "study in this cluster's scheduler")
            return own
        return super().shared_storage(storage)

    def check(self, job: WorkerJob) -> None:
        if not is_dask_url(job.storage):
            super().check(job)
        client = self._client()
        try:
            eligible = self._eligible(client)
            if is_dask_url(job.storage):
                from frugalnas.engine.dask_storage import install

                try:
                    client.run_on_scheduler(install)
                except Exception as exc:
                    raise ConfigError(f"the Dask scheduler at {self.address} cannot keep the "
                                      f"study ({one_line(exc)}); install frugalnas and "
                                      "optuna-integration where the scheduler runs, or give "
                                      "a database storage") from None
            try:
                problems = client.run(storage_problem, job.storage, workers=list(eligible))
            except Exception as exc:
                raise ConfigError(f"the workers of the Dask cluster at {self.address} cannot "
                                  f"run frugalnas ({one_line(exc)}); install frugalnas, with "
                                  "the plugins the study uses, where the workers run") from None
            for worker, problem in sorted(problems.items()):
                if problem:
                    raise ConfigError(f"storage {masked(job.storage)!r} cannot be used from "
                                      f"worker {worker} of the Dask cluster: {problem}; give a "
                                      "storage every worker reaches (sqlite on a filesystem "
                                      "they all mount, or postgresql://...)")
        finally:
            client.close()

    def launch(self, job: WorkerJob) -> None:
        client = self._client()
        try:
            eligible = self._eligible(client)
            count = self.workers or sum(int(w.get("nthreads", 1)) for w in eligible.values())
            token = uuid.uuid4().hex[:8]
            futures = [client.submit(run_job, job, key=f"frugalnas-worker-{token}-{i}",
                                     pure=False, resources=self.resources or None)
                       for i in range(count)]
            errors: list[str] = []
            try:
                for future in futures:  # all must end: the order of waiting does not matter
                    try:
                        future.result()
                    except Exception as exc:
                        errors.append(one_line(exc))
            except BaseException:
                client.cancel(futures)
                raise
            if errors:
                lost = ("; the study the scheduler kept in memory is lost with it"
                        if is_dask_url(job.storage)
                        and "scheduler-connection-lost" in errors[0] else "")
                raise LaunchError(f"{len(errors)} of {count} worker task(s) on the Dask "
                                  f"cluster at {self.address} failed: {errors[0]}{lost}")
            if is_dask_url(job.storage):
                print(f"frugalnas: note: study {job.study_name!r} is kept in the memory of the "
                      f"Dask scheduler at {self.address} and is lost when it stops; copy it "
                      "to a file with optuna.copy_study while it runs (docs/cluster.md)",
                      file=sys.stderr, flush=True)
        finally:
            client.close()
