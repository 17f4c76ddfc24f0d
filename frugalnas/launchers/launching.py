"""``launch``: a study's quota of trials run on the workers of a launcher, from Python (the
command line does the same with ``frugalnas run --workers N`` or ``--cluster ADDRESS``)."""

from __future__ import annotations

from dataclasses import asdict

from frugalnas.ports.config import DEFAULT_RUN_HEARTBEAT, StudyConfig, check_worker_settings
from frugalnas.distribution.launcher import Launcher, WorkerJob
from frugalnas.distribution.quota_storage import make_storage
from frugalnas.engine.study import Study, create_study
from frugalnas.host.plugins import PluginHost


def launch(config: StudyConfig, storage: str, n_trials: int, launcher: Launcher, *,
           study_name: str = "frugalnas", heartbeat: int | None = None,
           grace: int | None = None, retries: int = 1, timeout: float | None = None,
           isolate: str = "none", host: PluginHost | None = None) -> Study:
    """Run the study ``study_name`` of ``config`` on ``storage`` until it holds ``n_trials``
    trials, on the workers of ``launcher`` (``LocalLauncher(4)``, ``DaskLauncher(
    "tcp://HOST:PORT")``); returns the study as this process sees it afterwards. With a
    ``DaskLauncher``, ``storage="dask"`` keeps the study in the memory of its scheduler. Everything
    that can be checked (the storage the workers share, the cluster, its resources) is
    checked before the study is created. A worker that dies loses its running trial, which
    is failed after ``grace`` seconds without a heartbeat (``heartbeat``: seconds between
    heartbeats, by default ``frugalnas run``'s) and, with ``retries``, run again."""
    heartbeat = DEFAULT_RUN_HEARTBEAT if heartbeat is None else heartbeat
    check_worker_settings(heartbeat, grace, retries)
    host = host or PluginHost(config.plugins, config.disable_plugins)
    storage = launcher.shared_storage(storage)
    job = WorkerJob(config, storage, study_name, n_trials, heartbeat=heartbeat, grace=grace,
                    retries=retries, timeout=timeout, isolate=isolate)
    launcher.check(job)
    cfg = asdict(config)
    study = create_study(storage=make_storage(storage, heartbeat=heartbeat, grace=grace),
                         study_name=study_name, load_if_exists=True, host=host,
                         **{k: v for k, v in cfg.items() if k != "directions"},
                         directions=config.directions)
    try:
        launcher.launch(job)
    finally:
        launcher.close()
    return study
