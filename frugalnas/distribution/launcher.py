"""Launchers: what runs a study's trials on many worker processes, on this machine or on a
cluster, instead of in the process that asked for them.

A launcher is a component kind (``frugalnas_launchers``). Every worker it starts runs the
same :class:`WorkerJob`: :func:`~frugalnas.distribution.worker.run_worker` on the study's shared
storage, so the exact quota, the exclusive proposals, the heartbeats and the retries of a dead
worker's architecture are those of ``frugalnas worker``. A plugin chooses the launcher of a run
from its own run options (``frugalnas_launcher``); ``frugalnas run`` checks it before anything
is written (:meth:`Launcher.check`) and hands it the job once the study exists.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from frugalnas.ports.config import StudyConfig
from frugalnas.ports.errors import ConfigError, FrugalnasError, PluginError
from frugalnas.engine.dask_url import is_dask_url
from frugalnas.engine.storage_url import masked
from frugalnas.host.plugins import PluginHost


class LaunchError(FrugalnasError):
    """A worker of a launched study failed (an error in its trials' setup, a worker that the
    cluster gave up on); the message names it."""


@dataclass(frozen=True)
class WorkerJob:
    """What each launched worker runs: ``run_worker``'s arguments. ``storage`` is a URL every
    worker reaches; ``retries`` re-runs the architecture of a trial whose worker died."""

    config: StudyConfig
    storage: str
    study_name: str
    n_trials: int
    heartbeat: int | None = None
    grace: int | None = None
    retries: int = 1
    timeout: float | None = None
    isolate: str = "none"

    def run(self) -> str:
        """Run one worker of the job in this process until the study has its trials; returns
        a one-line summary of the study's trials."""
        import optuna

        from frugalnas.distribution.worker import run_worker

        # One line per trial from optuna and N workers would bury the run's own output.
        optuna.logging.set_verbosity(optuna.logging.WARNING)
        host = PluginHost(self.config.plugins, self.config.disable_plugins)
        study = run_worker(self.config, self.storage, self.study_name, self.n_trials,
                           heartbeat=self.heartbeat, grace=self.grace,
                           retries=self.retries if self.heartbeat else 0, timeout=self.timeout,
                           host=host, isolate=self.isolate)
        states = [t.state.name for t in study.trials]
        return (f"study {study.name!r}: {states.count('COMPLETE')} complete, "
                f"{states.count('FAIL')} failed trial(s)")


def check_shared_storage(storage: object, where: str) -> str:
    """``storage`` as a URL that workers of other processes share, or a ConfigError naming it
    and the valid forms: a database storage (heartbeats fail a dead worker's trial), never
    the in-memory default, a journal file (no heartbeats) or a relative sqlite path (each
    worker would resolve it in its own working directory)."""
    valid = ("sqlite:////ABSOLUTE/PATH.db on a filesystem every worker mounts, "
             "postgresql://... or mysql://...")
    if not isinstance(storage, str) or not storage:
        raise ConfigError(f"{where} needs a storage its workers share; the study is in memory "
                          f"(give --storage: {valid})")
    if storage in ("sqlite://", "sqlite:///:memory:") or ":memory:" in storage:
        raise ConfigError(f"{where} needs a storage its workers share; {storage!r} is in "
                          f"memory (give {valid})")
    if storage.startswith("sqlite:///"):
        if not storage[len("sqlite:///"):].startswith("/"):
            raise ConfigError(f"{where}: storage {storage!r} is a relative path, which each "
                              f"worker would resolve in its own working directory; give "
                              f"{valid}")
        return storage
    if storage.startswith(("postgresql", "mysql")):
        return storage
    if is_dask_url(storage):
        raise ConfigError(f"{where} cannot use storage {storage!r}: it keeps the study in the "
                          "memory of a Dask scheduler, which only that cluster's workers share; "
                          f"give --cluster tcp://HOST:PORT with it, or {valid}")
    raise ConfigError(f"{where} cannot use storage {masked(storage)!r}: its workers need "
                      f"heartbeats, so that a dead worker's trial is failed and run again; "
                      f"give {valid}")


class Launcher(ABC):
    """Runs a :class:`WorkerJob` on worker processes until the study holds its trials."""

    #: How messages name this launcher (``"cluster tcp://10.0.0.5:8786"``).
    where: str = "launcher"

    def shared_storage(self, storage: object) -> str:
        """The URL of ``storage`` as this launcher's workers reach it, or a ConfigError (one
        line) when they cannot share it (:func:`check_shared_storage`)."""
        return check_shared_storage(storage, self.where)

    def check(self, job: WorkerJob) -> None:
        """Raise ConfigError (one line) for what would make the job fail on its workers,
        before anything is written: by default, a storage the workers cannot share."""
        check_shared_storage(job.storage, self.where)

    @abstractmethod
    def launch(self, job: WorkerJob) -> None:
        """Run ``job`` on the workers and return when every one has ended; raise
        :class:`LaunchError` naming the workers that failed."""

    def close(self) -> None:
        """Release what :meth:`check` or :meth:`launch` opened (a connection to a cluster)."""


def launcher_for(host: PluginHost, config: StudyConfig) -> Launcher | None:
    """The launcher the plugins of ``host`` choose for a run of ``config``
    (``frugalnas_launcher``), or ``None``: the trials run in this process."""
    answers = host.answers("frugalnas_launcher", config=config, host=host)
    for plugin, answer in answers.items():
        if not isinstance(answer, Launcher):
            raise PluginError(f"plugin {plugin!r} returned {answer!r} from frugalnas_launcher; "
                              "expected a frugalnas.distribution.launcher.Launcher")
    if len(answers) > 1:
        raise ConfigError(f"plugins {', '.join(sorted(answers))} each want to launch this run's "
                          "workers; choose one (-p no:NAME blocks a plugin)")
    return next(iter(answers.values()), None)


def positive_workers(value: object, what: str) -> int:
    """``value`` as a number of workers >= 1, or a ConfigError naming it."""
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigError(f"invalid {what} {value!r}; expected an integer >= 1")
    return value


@dataclass(frozen=True)
class PreparedLaunch:
    """A checked launcher and the job of a ``frugalnas run`` whose study is not created yet."""

    launcher: Launcher
    job: WorkerJob

    def run(self, study_name: str, n_trials: int) -> None:
        """Run the job's workers on the study ``study_name`` until it holds ``n_trials``."""
        from dataclasses import replace

        try:
            self.launcher.launch(replace(self.job, study_name=study_name, n_trials=n_trials))
        finally:
            self.launcher.close()


def prepare_launch(host: PluginHost, config: StudyConfig, run: dict[str, object], *,
                   heartbeat: int | None, grace: int | None,
                   isolate: str) -> PreparedLaunch | None:
    """For ``frugalnas run``: the launcher its plugins choose (:func:`launcher_for`), checked
    against the run's settings before anything is written, or ``None``."""
    launcher = launcher_for(host, config)
    if launcher is None:
        if is_dask_url(run.get("storage")):
            raise ConfigError(f"storage {run.get('storage')!r} keeps the study in the memory of "
                              "a Dask scheduler, which only the workers of that cluster share: "
                              "give --cluster tcp://HOST:PORT with it, or a storage of this "
                              "process: in memory (no --storage), sqlite:///PATH, "
                              "journal:PATH, postgresql://... or mysql://...")
        return None
    storage = launcher.shared_storage(run.get("storage"))
    if run.get("n_jobs") not in (None, 1):
        raise ConfigError(f"n_jobs {run['n_jobs']!r} runs threads in this process; the trials "
                          f"of this run go to the workers of {launcher.where}: give one of them")
    if heartbeat is None:
        raise ConfigError(f"{launcher.where} needs heartbeats, so that the trial of a worker "
                          "that dies is failed and run again; leave --heartbeat at its default "
                          "or give it seconds > 0")
    timeout = run.get("timeout")
    n_trials = run.get("n_trials", 10)
    job = WorkerJob(config, storage,
                    str(run.get("study_name") or "frugalnas"),
                    n_trials if isinstance(n_trials, int) else 10, heartbeat=heartbeat,
                    grace=grace, timeout=float(timeout) if isinstance(timeout, (int, float))
                    else None, isolate=isolate)
    launcher.check(job)
    return PreparedLaunch(launcher, job)
