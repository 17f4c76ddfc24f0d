"""What ``frugalnas run`` and ``frugalnas worker`` do once the checks that need no engine have
passed (:func:`frugalnas.cli.main.check_run`): the components built
(:func:`~frugalnas.cli.plan.plan`), a launcher prepared, the study opened and optimised, or
joined as a worker. The command line imports this module only then, so that ``--help``, a
misspelt name or flag and ``plugins`` are answered without optuna or torch."""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import sys
from typing import Any

import optuna

from frugalnas.cli.plan import plan
from frugalnas.distribution.launcher import prepare_launch
from frugalnas.distribution.quota_storage import make_storage
from frugalnas.distribution.worker import run_worker
from frugalnas.engine.dask_url import is_dask_url
from frugalnas.engine.isolation import check_process_isolation
from frugalnas.engine.study import Study, open_study
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.config import DEFAULT_RUN_HEARTBEAT, StudyConfig, check_worker_settings
from frugalnas.ports.errors import ConfigError

#: What a command that ran trials hands back: the study, and whether no trial completed.
Outcome = tuple[Study, bool]


def run_study(args: argparse.Namespace, config: StudyConfig, run: dict[str, Any],
              host: PluginHost) -> Outcome | None:
    """``frugalnas run``: plan, then run the study's trials here or on a launcher's workers;
    ``None`` after ``--dry-run`` has printed the plan."""
    resolved, study_plan = plan(config, run, host)
    heartbeat = _run_heartbeat(args, run.get("storage"))
    launch = prepare_launch(host, config, run, heartbeat=heartbeat, grace=args.grace,
                            isolate=args.isolate)
    if launch is not None and is_dask_url(run.get("storage")):
        run["storage"] = launch.job.storage  # "dask": the scheduler of the launcher's cluster
    if args.dry_run:
        print(json.dumps(resolved, indent=2, default=str))
        return None
    _optuna_logging()
    if args.isolate == "process":   # where a child process cannot evaluate: one line, first
        check_process_isolation(study_plan.sampler, study_plan.host, study_plan.config)
    holder: dict[str, Any] = {}
    storage: Any = run.get("storage")
    if heartbeat is not None:
        def on_stale(ostudy: Any, frozen: Any) -> None:
            # A trial of a dead run, failed when a later run starts: the plugins are told.
            if "study" in holder:
                with contextlib.suppress(Exception):
                    holder["study"].report_stale_trial(frozen)

        storage = make_storage(storage, heartbeat=heartbeat, grace=args.grace, on_stale=on_stale)
    try:
        study = open_study(study_plan, storage, run.get("study_name"),
                           run.get("load_if_exists", bool(run.get("storage"))))
    except optuna.exceptions.DuplicatedStudyError:
        raise ConfigError(f"study {run.get('study_name')!r} already exists in the storage and "
                          "load_if_exists is false; set load_if_exists = true to continue it, "
                          "or choose another --study-name") from None
    holder["study"] = study
    n_trials = run.get("n_trials", 10)
    planned = study.trials_to_run(n_trials)
    if planned is not None and planned < n_trials:
        print(f"frugalnas: note: strategy {config.strategy!r} ends its search after "
              f"{planned} more trial(s); n_trials = {n_trials} is only an upper bound",
              file=sys.stderr, flush=True)
    done = len(study.completed_trials())
    if launch is not None:  # the trials run on the launcher's workers, not in this process
        launch.run(study.name, done + n_trials)
    else:
        study.optimize(n_trials=n_trials, timeout=run.get("timeout"),
                       n_jobs=run.get("n_jobs", 1), isolate=args.isolate)
    total = len(study.completed_trials())
    completed, others = total - done, len(study.trials) - total
    rest = f" ({others} more failed, pruned or unfinished)" if others else ""
    print(f"study {study.name!r}: {completed} trial(s) completed this run, {total} in total{rest}")
    try:
        best = study.best_trials if len(config.directions) > 1 else [study.best_trial]
        for t in best:
            print(f"best trial {t.number}: values={t.values} architecture={t.architecture}")
    except ValueError as exc:  # none completed, or none meets the constraints
        print(str(exc) if config.constraints else "no completed trial")
    return study, completed == 0


def join_study(args: argparse.Namespace, config: StudyConfig, run: dict[str, Any],
               host: PluginHost) -> Outcome | None:
    """``frugalnas worker``: plan, then run trials as one of the study's workers until it
    holds ``--n-trials``; ``None`` after ``--dry-run`` has printed the plan."""
    _optuna_logging()
    resolved, study_plan = plan(config, run, host)
    if args.dry_run:
        print(json.dumps(resolved, indent=2, default=str))
        return None
    if args.isolate == "process":   # where a child process cannot evaluate: one line, first
        check_process_isolation(study_plan.sampler, study_plan.host, study_plan.config)
    study = run_worker(config, run["storage"], run.get("study_name") or "frugalnas",
                       run["n_trials"], heartbeat=args.heartbeat, grace=args.grace,
                       retries=args.retries, timeout=run.get("timeout"), host=host,
                       max_failures=args.max_failures, isolate=args.isolate)
    states = [t.state.name for t in study.trials]
    print(f"worker {os.getpid()} done: study {study.name!r} has {states.count('COMPLETE')} complete, "
          f"{states.count('FAIL')} failed, {states.count('RUNNING')} running trial(s)")
    return study, states.count("COMPLETE") == 0


def _run_heartbeat(args: argparse.Namespace, storage: str | None) -> int | None:
    """The heartbeat of ``run``: ``--heartbeat`` (0: none), by default
    :data:`DEFAULT_RUN_HEARTBEAT` seconds on a database storage; none in memory or on a
    journal file, which has no heartbeats."""
    database = (isinstance(storage, str) and storage.startswith(("sqlite:///", "postgresql",
                                                                 "mysql"))
                and ":memory:" not in storage) or is_dask_url(storage)
    heartbeat: int | None = args.heartbeat
    if heartbeat is None:
        heartbeat = DEFAULT_RUN_HEARTBEAT if database else None
    elif heartbeat == 0:
        heartbeat = None
    elif not database:
        raise ConfigError(f"--heartbeat {heartbeat} needs a database storage (--storage "
                          "sqlite:///PATH, postgresql://..., mysql://...); a journal file or an "
                          "in-memory study has no heartbeats")
    check_worker_settings(heartbeat, args.grace, 0)
    return heartbeat


class _OneLineTrialFailures:
    """A logging filter for optuna's logger: a failed trial is one line (optuna logs the
    traceback and a second line); ``FRUGALNAS_TRACEBACK=1`` keeps optuna's full output."""

    def filter(self, record: Any) -> bool:
        message = str(record.msg)
        if " failed with value " in message and message.startswith("Trial "):
            return False
        record.exc_info = None
        record.exc_text = None
        return True


def _optuna_logging() -> None:
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if os.environ.get("FRUGALNAS_TRACEBACK", "") in ("", "0"):
        # Records of optuna's modules propagate to the handlers of the "optuna" logger.
        for handler in logging.getLogger("optuna").handlers:
            if not any(isinstance(f, _OneLineTrialFailures) for f in handler.filters):
                handler.addFilter(_OneLineTrialFailures())
