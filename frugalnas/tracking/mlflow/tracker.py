"""StudyTracker: the MLflow state of one study (client, experiment, parent run, trial runs),
written through the study's writer under the study's MLflow lock. What the plugin logs, when,
and how the storage stays the record of truth is described in
:mod:`frugalnas.tracking.mlflow.plugin`."""

from __future__ import annotations

import json
import sys
import tempfile
import threading
import time
import uuid
from pathlib import Path
from typing import Any

from frugalnas.ports import optuna_compat
from frugalnas.ports.secrets import mask_text
from frugalnas.ports.trial_report import TrialReport
from frugalnas.distribution.locks import study_lock
from frugalnas.engine.storage_url import operational_failure
from frugalnas.leaderboard import leaderboard_html, recorded_sizes
from frugalnas.multiobjective.hypervolume import hypervolume
from frugalnas.tracking.mlflow.drawing import draw_best_so_far, draw_pareto, objective_label
from frugalnas.tracking.mlflow.reconcile import (MAX_PARAM_LENGTH, create_runs, reconcile,
                                                 trial_run, trial_runs, unchecked_trials, write)
from frugalnas.tracking.mlflow.review import TOP, StudyReview, entry_of_report, entry_of_trial
from frugalnas.tracking.mlflow.reference import (HV_MIN_TRIALS, HV_REFERENCE_ATTR,
                                                 default_reference, parse_reference)
from frugalnas.tracking.mlflow.store import (DEFAULT_UI_URL, PLUGIN, TAG_ROLE, TAG_STUDY,
                                             TAG_STUDY_ID, TAG_TRIAL, UID_ATTR, ensure_experiment,
                                             prepare_tracking_store, tracking_uri_of)
from frugalnas.tracking.mlflow.writer import Writer, quiet_writer_logs


#: Most trials one writer job writes (on a SQL store: in one transaction).
MAX_BATCH = 100
#: While trials finish, the leaderboard and plots are rewritten at most this often.
REVIEW_SECONDS = 30.0
#: A study's end waits for its MLflow writes while they make progress (a run written, a job
#: done); after this many seconds without any (a tracking server gone away) it stops waiting.
STALL_SECONDS = 120.0
#: Study user attribute: how many reconciliations created runs (any process). A writer that
#: sees it change searches MLflow once for the runs of the trials it is about to write, since
#: another process may have written them from the storage.
RECONCILED_ATTR = "frugalnas_mlflow_reconciliations"


class StudyTracker:
    """MLflow state of one study: client, experiment, parent run, trial runs.

    Every MLflow call runs on the writer thread, under the study's MLflow lock (shared by
    every process on the storage), so workers never create a second parent run or a second
    run for one trial, and a reconciliation never sees a run another worker is writing."""

    def __init__(self, study: Any):
        self.study = study
        self.uri = tracking_uri_of(study.config)
        self.client: Any = None
        self.lock = study_lock(study, "mlflow")
        self.writer = Writer(self.uri)
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
        if self.writer.drain(STALL_SECONDS):
            self.writer.close()
        else:
            with self.pending_lock:
                unwritten = len(self.inflight | {r.number for r in self.pending})
            self.lost = (f"MLflow at {mask_text(self.uri)} made no progress for "
                         f"{STALL_SECONDS:g} s; {unwritten} trial run(s) and the study's "
                         "review not written (the next start of the study writes them from "
                         "the storage)")
            self.writer.errors.append(self.lost)
