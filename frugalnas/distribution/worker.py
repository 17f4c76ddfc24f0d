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

The storage they share is :class:`~frugalnas.distribution.quota_storage.QuotaStorage`, and the
locks they take turns under are those of :mod:`frugalnas.distribution.locks`.
"""

from __future__ import annotations

import os
import sys
import time
from dataclasses import asdict
from typing import Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from frugalnas.distribution.quota_storage import (DUPLICATE_REASON, FINISHED_ELSEWHERE,
                                                  QuotaReached, QuotaStorage, make_storage,
                                                  quiet_experimental)
from frugalnas.engine.runner import signals_interrupt, storage_failures_stop
from frugalnas.engine.study import Study, create_study
from frugalnas.ports.config import (DEFAULT_MAX_FAILURES, ISOLATION_MODES, StudyConfig,
                                   check_worker_settings)
from frugalnas.ports.errors import ConfigError, FrugalnasError, check_choice
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.keys import FAIL_REASON_ATTR

#: A worker whose strategy proposes this many taken architectures in a row stops.
MAX_DUPLICATES_IN_A_ROW = 20


class WorkerGaveUp(FrugalnasError):
    """Every one of a worker's last ``max_failures`` trials failed."""

    def __init__(self, max_failures: int, reasons: list[str]):
        counts: dict[str, int] = {}
        for r in reasons:
            counts[r] = counts.get(r, 0) + 1
        common = "; ".join(f"{n} x {r}" for r, n in sorted(counts.items(), key=lambda kv: -kv[1])[:3])
        super().__init__(f"the last {max_failures} trials of this worker failed ({common}); it "
                         "stops (raise --max-failures, or 0 to never stop)")


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
                  f"raise --grace on a loaded machine): {str(exc).splitlines()[0]}; going on",
                  file=sys.stderr, flush=True)
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
