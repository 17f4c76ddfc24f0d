"""Built-in plugin "mlflow": every study an MLflow experiment, every trial a nested run.

The study gets a parent run (config as params, study-level metrics, best-so-far curve and,
for two objectives, the Pareto front); each trial a child run with the genotype as params,
the estimator's metrics and cost as metrics, strategy/estimator/backend/state as tags, and two
artifacts (``architecture.json`` and ``cell.png``). A trial's run is written when the trial
ends, with the trial's start time. All MLflow calls run on one background writer thread per
study, so logging does not sit on the trial's critical path; the writer is drained when the
study finishes and at interpreter exit. The writer searches MLflow for the study's runs once,
when it connects, and then keeps its own account of the runs it wrote and found (one more
search only when another process's reconciliation wrote runs meanwhile, or for a trial another
process started); finished trials are written in batches, on a SQL store each batch of new
runs in one transaction (:func:`~frugalnas.tracking.mlflow.reconcile.create_runs`). The
study's end writes what is still queued, then reconciles and closes the parent run
(FINISHED; FAILED when the study ended on an exception other than an interrupt, or when the
storage or its lock failed so that the end could not reconcile: the parent run is closed all
the same while MLflow can be written, and the next start reconciles); it waits as long as the
writer makes progress, and a study whose runs could not all be written ends with one line
saying how many (:class:`OperationalFailure`).
Block it with ``-p no:mlflow`` (``--no-tracking``,
``disable_plugins=["mlflow"]``).

The optuna storage is the record of truth and MLflow follows it: when a study (or a worker)
starts and when it ends, :mod:`frugalnas.tracking.mlflow.reconcile` writes the runs that a
killed process never wrote and closes the ones it left open. The writes of all processes on
one storage take turns under one lock (``frugalnas.distribution.worker.study_lock``), so there is one
parent run per study and one run per trial. The tracking URI is checked before the first
trial (:mod:`frugalnas.tracking.mlflow.checks`).

The parent run also carries the review of the study (:meth:`StudyTracker._write_review`):
``leaderboard.html`` (every completed trial ranked, its architecture whole, objective values,
feasibility, size, cost and a link to its run), the best-so-far plot or, with two
objectives, the Pareto plot, axes named with units; it is rewritten at the end of each
session, after a reconciliation that changed something and, while trials finish, at most
every :data:`REVIEW_SECONDS`. It is kept incrementally and bounded
(:mod:`frugalnas.tracking.mlflow.review`: the best 100 trials, the exact best-so-far curve, a
sample of at most 1,000 plotted trials), so rewriting it costs the same at any study size. A study with several objectives logs ``hypervolume`` on the
parent run after every trial (step = trial number), against a reference point that is fixed
once (:func:`default_reference`) and logged as the parent parameter
``hypervolume_reference``.

Options (``plugin_options={"mlflow": {...}}``, ``-o mlflow.KEY=VALUE``): ``tracking_uri``
(default: ``MLFLOW_TRACKING_URI``, else ``sqlite:///mlflow.db``); ``hypervolume_reference``
(one number per objective, in the objectives' units); ``ui_url`` (the MLflow UI the
leaderboard links to, default ``http://127.0.0.1:5000``, where ``frugalnas ui`` serves);
``units`` (``{objective or metric: unit}`` for plot axes, beyond the units frugalnas knows).
The plugin also adds the ``--tracking-uri``/``--no-tracking`` flags to ``run`` and
``worker``, and the ``frugalnas ui`` command; it logs the networks ``frugalnas export`` trains
as MLflow models (``frugalnas_model_exported``, :mod:`frugalnas.tracking.mlflow.models`) and
links ``frugalnas report``'s leaderboard to the trial runs (``frugalnas_trial_links``).
"""

from __future__ import annotations

import argparse
import atexit
import json
import logging
import os
import queue
import signal
import subprocess
import sys
import tempfile
import threading
import time
import uuid
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any

from frugalnas.ports.errors import ConfigError, OperationalFailure
from frugalnas.host.plugins import hookimpl
from frugalnas.ports.secrets import OptionRoles, mask_text, without_masked_password
from frugalnas.engine.storage_url import operational_failure
from frugalnas.tracking.mlflow.checks import check_tracking_uri
from frugalnas.tracking.mlflow.drawing import draw_best_so_far, draw_pareto, objective_label
from frugalnas.tracking.mlflow.reconcile import (MAX_PARAM_LENGTH, TAG_ROLE, TAG_STUDY,
                                                 TAG_STUDY_ID, TAG_TRIAL, create_runs,
                                                 reconcile, trial_run, trial_runs,
                                                 unchecked_trials, write)
from frugalnas.tracking.mlflow.review import StudyReview, entry_of_report, entry_of_trial

if TYPE_CHECKING:  # the plugin loads for --help, which needs no optuna
    from frugalnas.ports.trial_report import TrialReport

PLUGIN = "mlflow"
OPTIONS = ("tracking_uri", "hypervolume_reference", "ui_url", "units")
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_UI_URL = "http://127.0.0.1:5000"
#: Most trials one writer job writes (on a SQL store: in one transaction).
MAX_BATCH = 100
#: While trials finish, the leaderboard and plots are rewritten at most this often.
REVIEW_SECONDS = 30.0
#: Study user attribute: the hypervolume reference point, once fixed (JSON list).
HV_REFERENCE_ATTR = "frugalnas_mlflow_hypervolume_reference"
#: Completed trials needed before the default hypervolume reference is fixed (the end of a
#: session fixes it with fewer).
HV_MIN_TRIALS = 10
#: The default reference lies this fraction of the observed range beyond the worst value.
HV_MARGIN = 0.1
#: Study user attribute: the id that tags this study's MLflow runs (``frugalnas.study_id``), so
#: that two studies with one name (in-memory studies run twice) never share runs.
UID_ATTR = "frugalnas_mlflow_study_id"
#: A study's end waits for its MLflow writes while they make progress (a run written, a job
#: done); after this many seconds without any (a tracking server gone away) it stops waiting.
STALL_SECONDS = 120.0
#: Study user attribute: how many reconciliations created runs (any process). A writer that
#: sees it change searches MLflow once for the runs of the trials it is about to write, since
#: another process may have written them from the storage.
RECONCILED_ATTR = "frugalnas_mlflow_reconciliations"


def resolve_tracking_uri(option: str | None) -> str:
    """The URI this process logs to: the ``tracking_uri`` option, else
    ``MLFLOW_TRACKING_URI``, else a sqlite file here, as :func:`runtime_uri` gives it."""
    return runtime_uri(option or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI)


def runtime_uri(uri: str) -> str:
    """``uri`` as MLflow is given it. A password masked in a stored configuration
    (``USER:***@``) is left out, for the driver to read from its environment (``PGPASSWORD``,
    ``~/.pgpass``, ``MLFLOW_TRACKING_PASSWORD``). A tracking server's credentials
    (``http://USER:PASSWORD@HOST:PORT``) leave the URI: MLflow reads them from
    ``MLFLOW_TRACKING_USERNAME``/``MLFLOW_TRACKING_PASSWORD``, set here for this process."""
    from urllib.parse import unquote, urlsplit, urlunsplit

    uri = without_masked_password(uri)
    if not uri.lower().startswith(("http://", "https://")):
        return uri
    parts = urlsplit(uri)
    if "@" not in parts.netloc:
        return uri
    userinfo, _, hostport = parts.netloc.rpartition("@")
    user, colon, password = userinfo.partition(":")
    if user:
        os.environ["MLFLOW_TRACKING_USERNAME"] = unquote(user)
    if colon and password:
        os.environ["MLFLOW_TRACKING_PASSWORD"] = unquote(password)
    return urlunsplit(parts._replace(netloc=hostport))


def tracking_uri_of(config: Any) -> str:
    """The tracking URI a study with ``config`` logs to."""
    return resolve_tracking_uri(config.plugin_options.get(PLUGIN, {}).get("tracking_uri"))


def prepare_tracking_store(uri: str) -> None:
    """Create the tables of a new sqlite MLflow store once, under a file lock: MLflow's own
    schema migration fails when several processes open a new sqlite store at the same time."""
    if not uri.startswith("sqlite:///"):
        return
    from mlflow import MlflowClient

    from frugalnas.distribution.worker import file_lock

    path = Path(uri[len("sqlite:///"):]).resolve()
    with file_lock(path.with_name(path.name + ".frugalnas.lock")):
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)


def default_reference(points: list[list[float]], directions: list[str],
                      margin: float = HV_MARGIN) -> list[float]:
    """The default hypervolume reference point: per objective, the worst value among
    ``points``, moved ``margin`` times the observed range further from the optimum (``margin``
    times the value, or ``margin`` itself at 0, when every point has the same value), so that
    the extreme trials add volume too."""
    ref = []
    for k, d in enumerate(directions):
        col = [float(p[k]) for p in points]
        worst = min(col) if d == "maximize" else max(col)
        span = max(col) - min(col)
        pad = margin * span if span > 0 else (margin * abs(worst) or margin)
        ref.append(worst - pad if d == "maximize" else worst + pad)
    return ref


def parse_reference(value: Any, n_objectives: int) -> list[float]:
    """The ``hypervolume_reference`` option as floats (a list, or text such as ``[0, 30]`` or
    ``0,30``); :class:`ConfigError` naming the value when it is not one finite number per
    objective."""
    import math

    items = value
    if isinstance(value, str):
        text = value.strip()
        try:
            items = json.loads(text)
        except ValueError:
            items = [v for v in text.strip("[]()").split(",") if v.strip()]
    try:
        ref = [float(v) for v in items]
        ok = all(math.isfinite(v) for v in ref) and not isinstance(items, (str, bytes))
    except (TypeError, ValueError):
        ok = False
    if not ok or len(ref) != n_objectives:
        raise ConfigError(f"invalid mlflow hypervolume_reference {value!r}; expected {n_objectives} "
                          f"finite number(s), one per objective, in the objectives' units "
                          "(e.g. [0, 100])")
    return ref


def artifact_root(uri: str) -> str | None:
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).resolve()
        return (db.parent / "mlartifacts").as_uri()
    return None


def ensure_experiment(client: Any, name: str, uri: str) -> str:
    """The id of study ``name``'s experiment, created (or restored from deletion) when
    needed: the one place the plugin makes a study's experiment, for its runs and for the
    models ``frugalnas export`` logs."""
    exp = client.get_experiment_by_name(name)
    if exp is not None:
        if exp.lifecycle_stage == "deleted":
            client.restore_experiment(exp.experiment_id)
        return exp.experiment_id
    try:
        return client.create_experiment(
            name, artifact_location=artifact_root(uri),
            # open on the runs view (MLflow 3 otherwise guesses a GenAI experiment)
            tags={TAG_STUDY: name, "mlflow.experimentKind": "custom_model_development"})
    except Exception:  # created meanwhile by a process on another storage
        return client.get_experiment_by_name(name).experiment_id


WRITER_THREAD = "frugalnas-mlflow"


class _WriterRecords(logging.Filter):
    """Drops the log records MLflow emits on the writer thread (a traceback per failed write,
    "View run" lines): the writer keeps its errors and the study reports them in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.threadName or "").startswith(WRITER_THREAD)


def quiet_writer_logs() -> None:
    """Attach :class:`_WriterRecords` to the handlers of MLflow's logger (idempotent), and
    turn off the two "View run/experiment" lines MLflow writes to stdout for every run it
    ends on a tracking server (MLflow's own switch; a user who set it keeps their value):
    the study's closing lines say where its runs are."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    for handler in logging.getLogger("mlflow").handlers:
        if not any(isinstance(f, _WriterRecords) for f in handler.filters):
            handler.addFilter(_WriterRecords())


class _Writer:
    """Runs MLflow calls in order on a daemon thread; errors are kept, not raised. After a
    failure of the store itself (a full disk, ...) the remaining writes are skipped: the next
    start of the study writes them from the storage."""

    def __init__(self, uri: str = "") -> None:
        self.uri = uri
        self.jobs: queue.Queue = queue.Queue()
        self.errors: list[str] = []
        self.failure: OperationalFailure | None = None
        #: Runs written and jobs done so far: what :meth:`drain` watches for progress.
        self.progress = 0
        self.thread = threading.Thread(target=self._loop, name=WRITER_THREAD, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                if self.failure is None:
                    job()
            except Exception as exc:  # logging must never kill a study
                self.failure = operational_failure(exc, self.uri, "MLflow store",
                                                   disk_only=True)
                if self.failure is None:
                    self.errors.append(mask_text(f"{type(exc).__name__}: {exc}"))
            finally:
                self.progress += 1
                self.jobs.task_done()

    def progressed(self, n: int = 1) -> None:
        """Count ``n`` runs written (within a job that writes many)."""
        self.progress += n

    def submit(self, fn: Any) -> None:
        self.jobs.put(fn)

    def drain(self, stall: float | None = None) -> bool:
        """Wait until every submitted job ran; give up (False) when no run was written and no
        job finished for ``stall`` seconds (a tracking server gone away: MLflow retries each
        call for minutes). A long job that keeps writing runs is waited for."""
        stall = STALL_SECONDS if stall is None else stall
        seen, since = self.progress, time.monotonic()
        while self.jobs.unfinished_tasks:
            time.sleep(0.02)
            if self.progress != seen:
                seen, since = self.progress, time.monotonic()
            elif time.monotonic() - since > stall:
                return False
        return True

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=5)


class StudyTracker:
    """MLflow state of one study: client, experiment, parent run, trial runs.

    Every MLflow call runs on the writer thread, under the study's MLflow lock (shared by
    every process on the storage), so workers never create a second parent run or a second
    run for one trial, and a reconciliation never sees a run another worker is writing."""

    def __init__(self, study: Any):
        from frugalnas.distribution.worker import study_lock

        self.study = study
        self.uri = tracking_uri_of(study.config)
        self.client: Any = None
        self.lock = study_lock(study, "mlflow")
        self.writer = _Writer(self.uri)
        options = study.config.plugin_options.get(PLUGIN, {})
        # the UI's address as the review shows and links it: a password in it is masked
        # (a browser asks for it)
        self.ui_url = mask_text(str(options.get("ui_url") or DEFAULT_UI_URL)).rstrip("/")
        self.units: dict[str, str] = {str(k): str(v) for k, v in (options.get("units") or {}).items()}
        self.hv_option = options.get("hypervolume_reference")
        self.hv_reference: list[float] | None = None
        # own completed trials of a multi-objective study whose hypervolume is not logged yet
        self.hv_pending: list[tuple[int, list[float]]] = []
        self.review_at = time.monotonic()
        # Trials this process runs and has not written yet: a reconciliation leaves them to
        # the queued write (a study's trials can finish before the writer has connected).
        self.inflight: set[int] = set()
        # Finished trials waiting for the writer; one flush job writes all that have queued.
        self.pending: list[TrialReport] = []
        self.pending_lock = threading.Lock()
        self.flush_scheduled = False
        # Trial number -> (state, run id) of the runs this process wrote or found right: the
        # reconciliation at the end searches MLflow only when the storage has others.
        self.known: dict[int, tuple[str, str]] = {}
        # Runs found when the writer connected (or caught up) for trials it had not settled
        # then: the writer completes them rather than creating a second run.
        self.found: dict[int, list[Any]] = {}
        # Trials this process started: a finished trial it did not start (a dead worker's,
        # failed here as stale) may have a half-written run, looked up by its number.
        self.mine: set[int] = set()
        self.reconciliations_seen: Any = None
        #: Searches of MLflow for runs, runs the writer created or completed, and the
        #: transactions (or single runs, off a SQL store) that created runs.
        self.counters = {"searches": 0, "created": 0, "completed": 0, "create_batches": 0}
        self.review = StudyReview(study.config.objectives, list(study.directions))
        self.status = "FINISHED"
        #: Whether the parent run was closed at the end of this session.
        self.ended = False
        self.lost = ""
        self.artifact_dirs: dict[str, Path] = {}
        # artifact locations of runs whose artifacts are not a local folder (a server's)
        self.artifact_uris: dict[str, str] = {}
        self.trial_values: list[tuple[int, float]] = []
        self.experiment_id = ""
        self.parent_run_id = ""
        self.uid = ""
        self.reconciled = {"created": 0, "repaired": 0, "removed": 0}
        # Opening the store (MLflow's import, a sqlite store's schema check: seconds) happens
        # on the writer thread too, so the first trial does not wait for it.
        self.writer.submit(self._connect)

    def _connect(self) -> None:
        from mlflow import MlflowClient

        quiet_writer_logs()
        prepare_tracking_store(self.uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        with self.lock:
            self._open()

    def _locked(self, fn: Any) -> Any:
        def job() -> None:
            if not self.parent_run_id:
                return  # opening failed (its error is recorded); nothing can be written
            with self.lock:
                fn()
        return job

    # -- runs on the writer thread -------------------------------------------------------
    def _open(self) -> None:
        name = self.study.name
        self.experiment_id = ensure_experiment(self.client, name, self.uri)
        ostudy = self.study.optuna_study
        self.uid = ostudy.user_attrs.get(UID_ATTR) or ""
        if not self.uid:  # the first tracked session of this study (we hold the lock)
            self.uid = uuid.uuid4().hex
            ostudy.set_user_attr(UID_ATTR, self.uid)
        parents = sorted(self.client.search_runs(
            [self.experiment_id], max_results=100,
            filter_string=f"tags.`{TAG_STUDY_ID}` = '{self.uid}' and tags.`{TAG_ROLE}` = 'study'"),
            key=lambda r: (r.info.start_time or 0, r.info.run_id))
        if parents:
            self.parent_run_id = parents[0].info.run_id
            self.remember_artifact_dir(parents[0])
            for extra in parents[1:]:  # written before parents were created under the lock
                self.client.delete_run(extra.info.run_id)
            if parents[0].info.status != "RUNNING":
                self.client.update_run(self.parent_run_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=f"study {name}",
                                         tags={TAG_STUDY: name, TAG_ROLE: "study",
                                               TAG_STUDY_ID: self.uid})
            self.parent_run_id = run.info.run_id
            self.remember_artifact_dir(run)
            self._log_config()
        if any(self._reconcile(at_start=True).values()):
            self._write_review()
        self.reconciliations_seen = ostudy.user_attrs.get(RECONCILED_ATTR)

    def _reconcile(self, at_start: bool = False) -> dict[str, int]:
        """Reconcile MLflow with the storage. At the start, the trials this process is about
        to write are left to it; at the end, nothing is read from MLflow when every finished
        trial in the storage is one whose run this process wrote or checked."""
        from frugalnas.ports import optuna_compat

        trials = optuna_compat.fresh_trials(self.study.optuna_study)
        self._review_trials(trials)
        skip: set[int] = set()
        if at_start:
            with self.pending_lock:
                skip = set(self.inflight) | {report.number for report in self.pending}
        elif not unchecked_trials(trials, self.known):
            return {"created": 0, "repaired": 0, "removed": 0}
        self.counters["searches"] += 1
        found: dict[int, list[Any]] = {}
        changes = reconcile(self, skip=skip, trials=trials, known=self.known, unsettled=found)
        if at_start:
            self.found = found
        for k, v in changes.items():
            self.reconciled[k] += v
        if changes["created"]:  # a writer of another process may hold some of these trials
            ostudy = self.study.optuna_study
            ostudy.set_user_attr(RECONCILED_ATTR,
                                 int(ostudy.user_attrs.get(RECONCILED_ATTR) or 0) + 1)
            self.reconciliations_seen = ostudy.user_attrs.get(RECONCILED_ATTR)
        if any(changes.values()):
            print(f"frugalnas: MLflow experiment {self.study.name!r} reconciled with the "
                  f"storage: {changes['created']} run(s) created, {changes['repaired']} "
                  f"repaired, {changes['removed']} duplicate(s) removed", file=sys.stderr,
                  flush=True)
        return changes

    def _log_config(self) -> None:
        from mlflow.entities import Param

        cfg = json.loads(self.study.config.to_json(self.study.host.option_roles()))
        params = [Param(k, json.dumps(v) if isinstance(v, (dict, list)) else str(v))
                  for k, v in sorted(cfg.items())]
        self.client.log_batch(self.parent_run_id, params=params)
        self.write_artifact(self.parent_run_id, "study_config.json", json.dumps(cfg, indent=2))

    def trial_tags(self, number: int) -> dict[str, str]:
        cfg = self.study.config
        return {TAG_STUDY: self.study.name, TAG_STUDY_ID: self.uid, TAG_ROLE: "trial",
                TAG_TRIAL: str(number), "mlflow.parentRunId": self.parent_run_id,
                "strategy": cfg.strategy, "estimator": cfg.estimator, "backend": cfg.backend,
                "space": cfg.space}

    def _flush_trials(self) -> None:
        """Write the finished trials queued so far, at most :data:`MAX_BATCH` in this job (the
        rest in a job of its own)."""
        with self.pending_lock:
            batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            more = bool(self.pending)
            self.flush_scheduled = more
        if more:
            self.writer.submit(self._locked(self._flush_trials))
        if batch:
            self._write_trials(batch)
        if time.monotonic() - self.review_at >= REVIEW_SECONDS:
            self._write_review()

    def _write_pending(self) -> None:
        """Write every finished trial still queued (the study's end: before its review)."""
        while True:
            with self.pending_lock:
                batch, self.pending = self.pending[:MAX_BATCH], self.pending[MAX_BATCH:]
            if not batch:
                return
            self._write_trials(batch)

    def _catch_up(self) -> None:
        """Whether another process's reconciliation wrote runs since this writer last looked
        (a study user attribute, one read): if so, one search of the study's trial runs
        tells which of this process's trials have one already."""
        seen = self.study.optuna_study.user_attrs.get(RECONCILED_ATTR)
        if seen == self.reconciliations_seen:
            return
        self.reconciliations_seen = seen
        self.counters["searches"] += 1
        for r in trial_runs(self):
            try:
                number = int(r.data.tags[TAG_TRIAL])
            except (KeyError, ValueError):
                continue
            if number not in self.known:
                self.found.setdefault(number, [])
                if all(r.info.run_id != f.info.run_id for f in self.found[number]):
                    self.found[number].append(r)

    def _write_trials(self, batch: list[TrialReport]) -> None:
        """Write finished trials, each run complete with params, metrics, tags and artifacts:
        the runs no process has written are created together (:func:`create_runs`: on a SQL
        store one transaction); a run found for a trial (half written by a dead worker, or
        written by another process's reconciliation) is completed instead. Which runs exist
        is this writer's bookkeeping: no search, unless another process reconciled since."""
        self._catch_up()
        new: list[tuple[TrialReport, Any]] = []
        done: list[tuple[int, list[float]]] = []
        try:
            for report in batch:
                number = report.number
                existing = self.found.pop(number, None)
                if existing is None and (number not in self.mine or number in self.known):
                    self.counters["searches"] += 1  # a trial another process started
                    existing = trial_runs(self, number)
                run = trial_run(self, report)
                if existing:
                    self.known[number] = (run.state, write(self, run, existing))
                    self.counters["completed"] += 1
                    self.writer.progressed()
                else:
                    new.append((report, run))
            ids = create_runs(self, [run for _, run in new])
            for (report, run), run_id in zip(new, ids):
                self.known[report.number] = (run.state, run_id)
            self.counters["created"] += len(ids)
        except Exception as exc:
            if operational_failure(exc, self.uri, disk_only=True) is not None:
                raise  # the store failed: the writer stops, the next start writes the rest
            # left to the next reconciliation
            self.writer.errors.append(mask_text(
                f"trials {batch[0].number}-{batch[-1].number}: {type(exc).__name__}: {exc}"))
            return
        finally:
            for report in batch:
                self.inflight.discard(report.number)
        for report in batch:
            values = report.values
            if not values or report.state.name != "COMPLETE":
                continue
            if self.review.wants(report.number, values):
                self.review.add(entry_of_report(report))
            else:
                self.review.mark(report.number)
            if len(values) == 1:
                self.trial_values.append((report.number, float(values[0])))
            else:
                done.append((report.number, [float(v) for v in values]))
        self._log_hypervolume(done)

    def _review_trials(self, trials: list[Any]) -> None:
        """Take the completed trials of the storage into the review (each trial once)."""
        from optuna.trial import TrialState

        for t in trials:
            if t.state == TrialState.COMPLETE and t.values is not None \
                    and t.number not in self.review.seen:
                if self.review.wants(t.number, t.values):
                    self.review.add(entry_of_trial(t))
                else:
                    self.review.mark(t.number)

    # -- the review of the study on its parent run -----------------------------------------
    def _value_alias(self, name: str) -> str | None:
        """For the objective ``value``: the estimator metric it equals on the first completed
        trials (``valid_accuracy_cifar10`` for the NB201 table), so that axes say what it is."""
        sample = self.review.first
        if name != "value" or not sample:
            return None
        index = self.study.config.objectives.index(name)
        for key in sample[0].metrics:
            if key != "value" and all(
                    key in e.metrics and abs(e.metrics[key] - e.values[index]) < 1e-9
                    for e in sample):
                return key
        return None

    def objective_labels(self) -> list[str]:
        """Axis labels of the study's objectives, with units."""
        return [objective_label(n, self._value_alias(n), self.units)
                for n in self.study.config.objectives]

    def run_links(self, numbers: list[int]) -> dict[int, str]:
        """Trial number -> URL of its run in the MLflow UI at ``ui_url``, for ``numbers``."""
        return {n: f"{self.ui_url}/#/experiments/{self.experiment_id}/runs/{self.known[n][1]}"
                for n in numbers if n in self.known and self.known[n][1]}

    def _write_review(self) -> None:
        """The review of the study on its parent run, from :attr:`review` (kept as runs are
        written: bounded, see :mod:`frugalnas.tracking.mlflow.review`): ``leaderboard.html``
        (the best :data:`~frugalnas.tracking.mlflow.review.TOP`), the best-so-far plot (one
        objective: also ``best_value``, ``best_architecture``) or the Pareto plot and
        ``pareto_front.json`` (two objectives)."""
        from mlflow.entities import Metric, RunTag

        from frugalnas.leaderboard import leaderboard_html, recorded_sizes
        from frugalnas.tracking.mlflow.review import TOP

        self.review_at = time.monotonic()
        review = self.review
        if not review.count:
            self.client.log_metric(self.parent_run_id, "n_complete_trials", 0.0)
            return
        dirs = list(self.study.directions)
        names = list(self.study.config.objectives)
        labels = self.objective_labels()
        now = int(time.time() * 1000)
        metrics = [Metric("n_complete_trials", float(review.count), now, 0)]
        tags: list[RunTag] = []
        points = review.points()
        shown = (f"{len(points)} of {review.count} trials shown" if len(points) < review.count
                 else f"{review.count} trials")
        if len(dirs) == 1:
            best = review.best()
            png = draw_best_so_far([n for n, _ in points], [v[0] for _, v in points],
                                   dirs[0] == "maximize", f"study {self.study.name} ({shown})",
                                   ylabel=labels[0], curve=review.curve())
            self.write_artifact(self.parent_run_id, "best_so_far.png", png)
            if best is not None:
                arch = best.architecture
                metrics.append(Metric("best_value", float(best.values[0]), now, 0))
                tags += [RunTag("best_trial", str(best.number)),
                         RunTag("best_architecture", arch if len(arch) <= MAX_PARAM_LENGTH
                                else arch[:MAX_PARAM_LENGTH] + " ... (best_architecture.txt)")]
                self.write_artifact(self.parent_run_id, "best_architecture.txt", arch)
        elif len(dirs) == 2:
            front = review.front
            png = draw_pareto([v for _, v in points], [e.values for e in front], labels,
                              f"study {self.study.name}: Pareto front "
                              f"({len(front)} of {review.count} trials; {shown})", dirs)
            self.write_artifact(self.parent_run_id, "pareto_front.png", png)
            front_json = [{"number": e.number, "values": dict(zip(names, e.values)),
                           "architecture": e.architecture}
                          for e in sorted(front, key=lambda e: e.number)]
            self.write_artifact(self.parent_run_id, "pareto_front.json",
                                json.dumps(front_json, indent=2))
            metrics.append(Metric("pareto_front_size", float(len(front)), now, 0))
        rows = recorded_sizes(review.rows())
        notes = [f"Written by frugalnas's MLflow plugin ({review.count} completed trial(s) at "
                 f"the time; this page lists the best {min(TOP, review.count)}). params: the "
                 "candidate's parameters as the estimator recorded them; `frugalnas report "
                 "--storage URL --study-name NAME` lists every trial and also counts forward "
                 "FLOPs.",
                 f"Trial links open the MLflow UI at {self.ui_url} (plugin option "
                 "mlflow.ui_url); MLflow's artifact viewer does not follow links, so open this "
                 "file on its own (download it) to use them."]
        html = leaderboard_html(rows, dict(zip(names, dirs)),
                                self.run_links([int(r["trial"]) for r in rows]),
                                title=f"study {self.study.name}: leaderboard", notes=notes)
        self.write_artifact(self.parent_run_id, "leaderboard.html", html)
        self.client.log_batch(self.parent_run_id, metrics=metrics, tags=tags)

    def _hv_reference(self, points: list[list[float]], final: bool) -> list[float] | None:
        """The hypervolume reference: the option, else the one the study fixed before, else
        :func:`default_reference` of ``points`` (fixed now, once there are
        :data:`HV_MIN_TRIALS` points, or at the end of a session); logged as the parent
        parameter ``hypervolume_reference``."""
        from mlflow.entities import Param

        dirs = list(self.study.directions)
        ostudy = self.study.optuna_study
        source = "option mlflow.hypervolume_reference"
        if self.hv_option is not None:
            ref = parse_reference(self.hv_option, len(dirs))
        elif ostudy.user_attrs.get(HV_REFERENCE_ATTR):
            ref = [float(v) for v in ostudy.user_attrs[HV_REFERENCE_ATTR]]
            source = "default: worst value seen per objective, pushed out by 10% of the range"
        elif points and (final or len(points) >= HV_MIN_TRIALS):
            ref = default_reference(points, dirs)
            ostudy.set_user_attr(HV_REFERENCE_ATTR, ref)
            source = "default: worst value seen per objective, pushed out by 10% of the range"
        else:
            return None
        try:
            self.client.log_batch(self.parent_run_id, params=[
                Param("hypervolume_reference", json.dumps(ref)),
                Param("hypervolume_reference_source", source)])
        except Exception:  # already logged by another session or worker
            pass
        return ref

    def _log_hypervolume(self, own: list[tuple[int, list[float]]], final: bool = False) -> None:
        """``hypervolume`` on the parent run at the step of each of this process's completed
        trials: the volume dominated by every completed trial numbered up to it."""
        from mlflow.entities import Metric
        from optuna.trial import TrialState

        from frugalnas.multiobjective.hypervolume import hypervolume

        dirs = list(self.study.directions)
        if len(dirs) < 2:
            return
        self.hv_pending.extend(own)
        if not self.hv_pending:
            return
        points = {t.number: list(t.values) for t in self.study.optuna_study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)) if t.values is not None}
        for number, values in self.hv_pending:
            points.setdefault(number, values)
        if self.hv_reference is None:
            self.hv_reference = self._hv_reference(list(points.values()), final)
            if self.hv_reference is None:
                return
        ordered = sorted(points.items())
        now, metrics = int(time.time() * 1000), []
        for number, _ in sorted(self.hv_pending):
            upto = [v for n, v in ordered if n <= number]
            metrics.append(Metric("hypervolume", hypervolume(upto, self.hv_reference, dirs),
                                  now, number))
        for k in range(0, len(metrics), 900):
            self.client.log_batch(self.parent_run_id, metrics=metrics[k:k + 900])
        self.hv_pending.clear()

    def write_artifact(self, run_id: str, name: str, content: str | bytes) -> None:
        """Write an artifact file: straight into a local artifact folder (no MLflow round trip
        to look the run up), or through the client for remote stores."""
        data = content.encode() if isinstance(content, str) else content
        root = self.artifact_dirs.get(run_id)
        if root is not None:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            return
        remote = self.artifact_uris.get(run_id)
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(name).name
            path.write_bytes(data)
            parent = str(Path(name).parent)
            folder = None if parent == "." else parent
            if remote is None:
                self.client.log_artifact(run_id, str(path), artifact_path=folder)
                return
            # the run's artifact location is known: no request to look the run up first
            from mlflow.store.artifact.artifact_repository_registry import get_artifact_repository

            get_artifact_repository(remote, tracking_uri=self.uri).log_artifact(str(path), folder)

    def remember_artifact_dir(self, run: Any) -> None:
        self.remember_artifact_uri(run.info.run_id, run.info.artifact_uri or "")

    def remember_artifact_uri(self, run_id: str, uri: str) -> None:
        """Where run ``run_id`` keeps its artifacts, when that is a local folder."""
        if uri.startswith("file://"):
            from urllib.parse import unquote, urlparse

            self.artifact_dirs[run_id] = Path(unquote(urlparse(uri).path))
        elif uri and "://" not in uri and ":" not in uri.split("/")[0]:
            self.artifact_dirs[run_id] = Path(uri)
        elif uri:
            self.artifact_uris[run_id] = uri

    def _log_study_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.parent_run_id,
                              metrics=[Metric(k, float(v), now, int(step)) for k, v in metrics.items()])

    def _log_trial_values(self) -> None:
        """This session's trial values, and the best so far at each of them over every
        completed trial the review has taken (the storage's, read at the study's end: so
        several workers agree), as step metrics on the parent run, batched here rather than
        one call per trial."""
        import bisect

        from mlflow.entities import Metric

        if not self.trial_values:
            return
        curve = self.review.curve()
        steps = [n for n, _ in curve]
        now, metrics = int(time.time() * 1000), []
        for number, value in sorted(self.trial_values):
            metrics.append(Metric("trial_value", value, now, number))
            i = bisect.bisect_right(steps, number)
            if i:
                metrics.append(Metric("best_so_far", curve[i - 1][1], now, number))
        for k in range(0, len(metrics), 900):
            self.client.log_batch(self.parent_run_id, metrics=metrics[k:k + 900])
        self.trial_values.clear()

    def _close(self) -> None:
        self._write_pending()  # the queued trials first: then nothing is left to reconcile
        self.writer.progressed()
        self._reconcile()
        self.writer.progressed()
        self._log_trial_values()
        self._log_hypervolume([], final=True)
        self.writer.progressed()
        self._write_review()  # with n_complete_trials
        self.client.set_terminated(self.parent_run_id, status=self.status)
        self.ended = True

    def _end_failed(self) -> None:
        """Close the parent run FAILED when :meth:`_close` could not: the storage or the
        lock beside it failed (a read-only folder, a database gone). It needs neither, only
        MLflow; the reconciliation waits for the next start of the study."""
        if self.parent_run_id and not self.ended:
            self.client.set_terminated(self.parent_run_id, status="FAILED")
            self.ended = True

    # -- called from hooks ---------------------------------------------------------------
    def trial_started(self, number: int) -> None:
        self.inflight.add(number)
        self.mine.add(number)

    def trial_finished(self, report: TrialReport) -> None:
        """Queue the write of a finished trial."""
        with self.pending_lock:
            self.pending.append(report)
            self.inflight.add(report.number)
            schedule, self.flush_scheduled = not self.flush_scheduled, True
        if schedule:
            self.writer.submit(self._locked(self._flush_trials))

    def study_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.writer.submit(self._locked(lambda: self._log_study_metrics(dict(metrics), step)))

    def close(self, status: str = "FINISHED") -> None:
        """End the study's tracking: the queued trials are written, then the reconciliation
        and the review, and the parent run ends in ``status`` (FINISHED or FAILED; FAILED
        also when the storage failed so that this could not be done, see :meth:`_end_failed`).
        Waits as long as the writer makes progress; after :data:`STALL_SECONDS` without any
        it stops waiting and :attr:`lost` says what was not written."""
        self.status = status
        self.writer.submit(self._locked(self._close))
        self.writer.submit(self._end_failed)  # runs after it; without the storage's lock
        if self.writer.drain():
            self.writer.close()
        else:
            with self.pending_lock:
                unwritten = len(self.inflight | {r.number for r in self.pending})
            self.lost = (f"MLflow at {mask_text(self.uri)} made no progress for "
                         f"{STALL_SECONDS:g} s; {unwritten} trial run(s) and the study's "
                         "review not written (the next start of the study writes them from "
                         "the storage)")
            self.writer.errors.append(self.lost)


# Trackers still open, so that interpreter exit drains their writes (a study used through
# ask/tell may never call finish()). Only for that: hooks find a study's tracker in the study.
_OPEN: weakref.WeakSet[StudyTracker] = weakref.WeakSet()
_LOCK = threading.Lock()


def tracker_for(study: Any) -> StudyTracker | None:
    return study.plugin_state.get(PLUGIN, {}).get("tracker")


@hookimpl
def frugalnas_check_config(config: Any, host: Any) -> None:
    options = config.plugin_options.get(PLUGIN, {})
    for key in options:
        if key not in OPTIONS:
            raise ConfigError(f"unknown option {key!r} for plugin {PLUGIN!r}; valid options: "
                              f"{', '.join(OPTIONS)}")
    if options.get("hypervolume_reference") is not None:
        if len(config.objectives) < 2:
            raise ConfigError("mlflow hypervolume_reference is for studies with several "
                              f"objectives; this study has one ({config.objectives[0]!r})")
        parse_reference(options["hypervolume_reference"], len(config.objectives))
    ui_url = options.get("ui_url")
    if ui_url is not None and (not isinstance(ui_url, str)
                               or not ui_url.startswith(("http://", "https://"))):
        raise ConfigError(f"invalid mlflow ui_url {mask_text(repr(ui_url))}; expected the "
                          "MLflow UI's address, such as http://127.0.0.1:5000")
    units = options.get("units")
    if units is not None and (not isinstance(units, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in units.items())):
        raise ConfigError(f"invalid mlflow units {units!r}; expected {{name: unit}}, such as "
                          '{"latency_ms_pixel3": "ms"}')
    uri = options.get("tracking_uri")
    if uri is not None and not isinstance(uri, str):
        raise ConfigError(f"invalid mlflow tracking_uri {mask_text(repr(uri))}; expected a URI such as "
                          "sqlite:///mlflow.db or http://127.0.0.1:5000")
    # Before the first trial: a bad or unreachable URI is one line now, not a hang later.
    check_tracking_uri(tracking_uri_of(config))


@hookimpl
def frugalnas_option_roles() -> OptionRoles:
    # Each worker names the tracking store as its machine reaches it (localhost or an
    # address, credentials of its own); every spelling of one store is the same study.
    return OptionRoles(run=("tracking_uri",))


@hookimpl
def frugalnas_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tracking-uri", help="MLflow tracking URI (default: "
                        "MLFLOW_TRACKING_URI, else sqlite:///mlflow.db)")
    parser.add_argument("--no-tracking", action="store_true",
                        help="do not log to MLflow (same as -p no:mlflow)")


@hookimpl
def frugalnas_run_settings(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    if getattr(args, "tracking_uri", None) and getattr(args, "no_tracking", False):
        raise ConfigError(f"--tracking-uri {mask_text(args.tracking_uri)} and --no-tracking "
                          "contradict each other; give one of them")
    if getattr(args, "tracking_uri", None):
        settings.setdefault("plugin_options", {}).setdefault(PLUGIN, {})["tracking_uri"] = \
            args.tracking_uri
    if getattr(args, "no_tracking", False):
        settings["disable_plugins"] = sorted({*settings.get("disable_plugins", []), PLUGIN})


@hookimpl
def frugalnas_results_location(study: Any) -> str | None:
    uri = tracking_uri_of(study.config)
    flag = "" if uri == DEFAULT_TRACKING_URI else f" --tracking-uri {mask_text(uri)}"
    return (f"MLflow experiment {study.name!r} in {mask_text(uri)}, one run per trial; review it "
            f"with: frugalnas ui{flag} --study-name {study.name}")


@hookimpl
def frugalnas_model_exported(study: Any, exported: Any) -> dict[str, Any]:
    """An exported network becomes an MLflow model in the study's experiment, linked to its
    trial's run (and registered under ``exported.register``)."""
    from frugalnas.tracking.mlflow.models import log_model

    return log_model(study, exported)


@hookimpl
def frugalnas_trial_links(study: Any, base_url: str) -> dict[int, str]:
    from frugalnas.tracking.mlflow.models import trial_run_links

    return trial_run_links(study, base_url)


@hookimpl
def frugalnas_commands(subparsers: argparse._SubParsersAction, host: Any) -> None:
    ui = subparsers.add_parser(
        "ui", help="start the MLflow UI for the store in use, on a study's runs",
        description="Start the MLflow UI and print (or --open) the address of a study's "
        "experiment on its training-runs view: every trial a row, best first, with the "
        "objective, architecture, state and cost columns shown.")
    ui.add_argument("--tracking-uri")
    ui.add_argument("--study-name", "--experiment", dest="experiment", metavar="NAME",
                    help="the study (MLflow experiment name or id) to open (default: the most "
                    "recently created frugalnas study in the store)")
    ui.add_argument("--open", action="store_true",
                    help="open the address in a web browser once the server answers")
    # dest is not "host": the command line keeps its plugin host in args.host
    ui.add_argument("--host", dest="bind_host", default="127.0.0.1",
                    help="address to bind (default 127.0.0.1)")
    ui.add_argument("--port", type=int, default=5000)
    ui.add_argument("--workers", type=int, default=1,
                    help="server processes (default 1: starts fast; MLflow's own default is 4)")
    ui.set_defaults(func=cmd_ui)


#: Experiment tag prefix under which the MLflow UI looks up a shared view of the runs table
#: (the URL parameter ``viewStateShareKey`` names it; MLflow 3's "share view" feature).
SHARED_VIEW_TAG = "mlflow.sharedViewState."


def find_study_experiment(client: Any, name: str | None) -> Any | None:
    """The experiment of study ``name`` (an experiment name or id); without a name, the most
    recently created experiment of a frugalnas study (tag ``frugalnas.study``), else ``None``.
    :class:`ConfigError` naming the study and the studies there are when it is missing."""
    if name:
        exp = client.get_experiment_by_name(name)
        if exp is None and name.isdigit():
            try:
                exp = client.get_experiment(name)
            except Exception:
                exp = None
        if exp is None:
            known = [e.name for e in client.search_experiments(max_results=50)
                     if TAG_STUDY in e.tags]
            raise ConfigError(f"no MLflow experiment for study {name!r} in this store; studies "
                              f"there: {', '.join(sorted(known)) or 'none'}")
        return exp
    studies = [e for e in client.search_experiments(max_results=1000) if TAG_STUDY in e.tags]
    if not studies:
        return None
    return max(studies, key=lambda e: (e.creation_time or 0, int(e.experiment_id)
                                       if str(e.experiment_id).isdigit() else 0))


#: Width (px) of each column of the runs view; at 1,400 px, with MLflow's own Run Name and
#: Created columns, the objective, the genotype, params, FLOPs, latency and cost all show.
VIEW_WIDTHS = {"objective": 110, "architecture": 330, "metric": 96}


def study_runs_view(client: Any, experiment: Any) -> tuple[str, dict[str, Any]]:
    """A shared view of the experiment's runs table for the MLflow UI: trial runs as flat rows
    (no collapsed parent: sorted by the first objective, best first) with the columns a
    reviewer compares selected, in this order: the objectives, the architecture, params,
    FLOPs, the latency where the trials have one (measured ``latency_ms``, or a latency
    constraint's metric), the feasibility of a constrained study, the cost in seconds.
    Returns the share key and the view; :func:`publish_runs_view` stores it as an
    experiment tag."""
    import hashlib

    objectives, directions, constraints = ["value"], ["maximize"], {}
    parents = client.search_runs([experiment.experiment_id], max_results=1,
                                 filter_string=f"tags.`{TAG_ROLE}` = 'study'",
                                 order_by=["attributes.start_time DESC"])
    if parents:
        params = parents[0].data.params
        try:
            objectives = list(json.loads(params.get("objectives", '["value"]')))
            directions = list(json.loads(params.get("directions", '["maximize"]')))
            constraints = dict(json.loads(params.get("constraints", "{}") or "{}"))
        except ValueError:
            pass
    trials = client.search_runs([experiment.experiment_id], max_results=1,
                                filter_string=f"tags.`{TAG_ROLE}` = 'trial'")
    logged = set(trials[0].data.metrics) if trials else set()
    latency = [m for m in ("latency_ms", *constraints, *objectives)
               if m.startswith("latency") and m in logged and m not in objectives]
    objective_columns = [f"metrics.`objective_{name}`" for name in objectives]
    metric_columns = [f"metrics.`{m}`" for m in ("cost_params", "cost_flops",
                                                  *dict.fromkeys(latency))]
    if constraints:
        metric_columns.append("tags.`feasible`")
    metric_columns.append("metrics.`cost_seconds`")
    columns = [*objective_columns, "params.`architecture`", *metric_columns]
    widths = {c: VIEW_WIDTHS["objective"] for c in objective_columns}
    widths["params.`architecture`"] = VIEW_WIDTHS["architecture"]
    widths.update({c: VIEW_WIDTHS["metric"] for c in metric_columns})
    view = {"searchFilter": "", "orderByKey": f"metrics.`objective_{objectives[0]}`",
            "orderByAsc": directions[0] == "minimize", "lifecycleFilter": "Active",
            "datasetsFilter": [], "modelVersionFilter": "All Runs", "startTime": "ALL",
            "selectedColumns": columns, "columnOrder": columns, "columnWidths": widths,
            "runListHidden": False, "viewMaximized": False, "groupBy": None,
            "groupsExpanded": {}}
    digest = hashlib.sha1(json.dumps(view, sort_keys=True).encode()).hexdigest()[:16]
    return f"frugalnas-{digest}", view


def publish_runs_view(client: Any, experiment: Any) -> str:
    """Store :func:`study_runs_view` as an experiment tag; returns its share key."""
    key, view = study_runs_view(client, experiment)
    if experiment.tags.get(SHARED_VIEW_TAG + key) is None:
        client.set_experiment_tag(experiment.experiment_id, SHARED_VIEW_TAG + key,
                                  json.dumps(view))
    return key


def runs_view_url(base: str, experiment_id: str, share_key: str | None) -> str:
    """The MLflow UI address of an experiment's training-runs view: ``workflowType`` keeps
    MLflow 3 off its GenAI pages, ``viewStateShareKey`` applies the view stored by
    :func:`publish_runs_view`."""
    from urllib.parse import urlencode

    query = {"workflowType": "machine_learning", "compareRunsMode": "TABLE"}
    if share_key:
        query["viewStateShareKey"] = share_key
    return f"{base.rstrip('/')}/#/experiments/{experiment_id}/runs?{urlencode(query)}"


def cmd_ui(args: argparse.Namespace) -> int:
    from mlflow import MlflowClient

    uri = resolve_tracking_uri(args.tracking_uri)
    check_tracking_uri(uri)
    prepare_tracking_store(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment = find_study_experiment(client, getattr(args, "experiment", None))
    host = "127.0.0.1" if args.bind_host in ("0.0.0.0", "::", "") else args.bind_host
    base = f"http://{host}:{args.port}"
    url = base
    if experiment is not None:
        url = runs_view_url(base, experiment.experiment_id, publish_runs_view(client, experiment))
    cmd = [sys.executable, "-m", "mlflow", "ui", "--backend-store-uri", uri,
           "--host", args.bind_host, "--port", str(args.port), "--workers", str(args.workers)]
    root = artifact_root(uri)
    if root is not None:
        cmd += ["--default-artifact-root", root]
    if _has_ui_app():
        cmd += ["--app-name", UI_APP]
    print(f"MLflow UI for {mask_text(uri)} on {base}", flush=True)
    if experiment is not None:
        print(f"study {experiment.name!r}: {url}", flush=True)
    if getattr(args, "open", False):
        threading.Thread(target=_open_when_up, args=(base, url), daemon=True).start()
    return run_forwarding_signals(cmd)


#: The ``mlflow.app`` entry point of :mod:`frugalnas.tracking.mlflow.ui_app`.
UI_APP = "frugalnas"


def _has_ui_app() -> bool:
    """Whether frugalnas's MLflow server app is installed (a source tree run without
    ``pip install`` has no entry points; MLflow's plain app serves then)."""
    from importlib.metadata import entry_points

    return any(ep.name == UI_APP for ep in entry_points(group="mlflow.app"))


def _open_when_up(base: str, url: str, wait: float = 120.0) -> None:
    import urllib.request
    import webbrowser

    end = time.monotonic() + wait
    while time.monotonic() < end:
        try:
            with urllib.request.urlopen(f"{base}/health", timeout=2):
                webbrowser.open(url)
                return
        except OSError:
            time.sleep(0.5)


#: Signals on which ``frugalnas ui`` stops the server it started.
FORWARDED = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


def run_forwarding_signals(cmd: list[str], grace: float = 15.0) -> int:
    """Run ``cmd`` in its own process group and stop the whole group (the MLflow CLI and the
    server processes it starts) with SIGTERM when this process receives SIGTERM, SIGINT
    (Ctrl-C) or SIGHUP: SIGTERM is the signal the server's children stop on quietly, where
    SIGINT has each of them print a traceback. Waits for the command and returns its exit
    status (128 + N for a signal N, as a shell reports it). Whatever of the group is left
    ``grace`` seconds after the command exits, or after a signal, is killed."""
    proc = subprocess.Popen(cmd, start_new_session=True)
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        _kill_group(proc.pid, signal.SIGTERM)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    deadline: float | None = None
    try:
        while True:
            try:
                rc = proc.wait(timeout=0.5 if received else None)
                break
            except subprocess.TimeoutExpired:
                deadline = deadline or time.monotonic() + grace
                if time.monotonic() > deadline:
                    _kill_group(proc.pid, signal.SIGKILL)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
        _reap_group(proc.pid, grace)
    return 128 - rc if rc < 0 else rc


def _kill_group(pgid: int, sig: int) -> bool:
    try:
        os.killpg(pgid, sig)
        return True
    except (ProcessLookupError, PermissionError):
        return False


def _reap_group(pgid: int, grace: float) -> None:
    """Wait until no process of group ``pgid`` is left: SIGTERM, then SIGKILL after ``grace``."""
    if not _kill_group(pgid, 0):
        return
    _kill_group(pgid, signal.SIGTERM)
    end = time.monotonic() + grace
    while time.monotonic() < end:
        if not _kill_group(pgid, 0):
            return
        time.sleep(0.1)
    _kill_group(pgid, signal.SIGKILL)


@hookimpl
def frugalnas_study_started(study: Any) -> None:
    with _LOCK:
        state = study.plugin_state.setdefault(PLUGIN, {})
        if state.get("tracker") is None:
            state["tracker"] = StudyTracker(study)
            _OPEN.add(state["tracker"])


@hookimpl
def frugalnas_trial_started(study: Any, trial: Any, architecture: Any) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.trial_started(trial.number)


@hookimpl
def frugalnas_trial_finished(study: Any, report: TrialReport) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.trial_finished(report)


@hookimpl
def frugalnas_study_metrics(study: Any, metrics: dict[str, float], step: int) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.study_metrics(metrics, step)


@hookimpl
def frugalnas_study_finished(study: Any) -> None:
    with _LOCK:
        state = study.plugin_state.get(PLUGIN, {})
        tracker = state.pop("tracker", None)
    if tracker is not None:
        # the session ends while an exception leaves the study (a storage failure, a
        # callback's error): the parent run says so; an interrupt (Ctrl-C, SIGTERM) is a stop
        # the user asked for, and the study goes on at the next start
        ending = sys.exc_info()[0]
        status = ("FINISHED" if ending is None or issubclass(ending, KeyboardInterrupt)
                  else "FAILED")
        tracker.close(status)
        _OPEN.discard(tracker)
        state.update(errors=list(tracker.writer.errors), parent_run_id=tracker.parent_run_id,
                     experiment_id=tracker.experiment_id, study_id=tracker.uid,
                     reconciled=dict(tracker.reconciled), counters=dict(tracker.counters))
        if tracker.writer.failure is not None:
            raise tracker.writer.failure
        if tracker.lost:
            raise OperationalFailure(f"MLflow logging errors: {tracker.lost}")
        if tracker.writer.errors:  # some writes failed: the runs are missing until the next start
            raise OperationalFailure(
                f"MLflow logging errors: {len(tracker.writer.errors)} write(s) to "
                f"{mask_text(tracker.uri)} failed, their runs are missing until the next start of "
                f"the study writes them from the storage: {'; '.join(tracker.writer.errors[:2])}")


@atexit.register
def _close_all() -> None:
    for tracker in list(_OPEN):
        tracker.close()
