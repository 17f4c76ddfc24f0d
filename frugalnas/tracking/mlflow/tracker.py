"""Built-in plugin "mlflow": every study an MLflow experiment, every trial a nested run.

The study gets a parent run (config as params, study-level metrics, best-so-far curve and,
for two objectives, the Pareto front); each trial a child run with the genotype as params,
the estimator's metrics and cost as metrics, strategy/estimator/backend/state as tags, and two
artifacts (``architecture.json`` and ``cell.png``). A trial's run is written when the trial
ends (three store writes), with the trial's start time. All MLflow calls run on one background
writer thread per study, so logging does not sit on the trial's critical path; the writer is
drained when the study finishes and at interpreter exit. Block it with ``-p no:mlflow`` or
``tracking=False``.
"""

from __future__ import annotations

import atexit
import json
import os
import queue
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from frugalnas.tracking.mlflow.drawing import draw_best_so_far, draw_cell, draw_pareto
from frugalnas.core.plugins import hookimpl

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
TAG_STUDY = "frugalnas.study"
TAG_ROLE = "frugalnas.role"
TAG_TRIAL = "frugalnas.trial_number"


def resolve_tracking_uri(option: str | None) -> str:
    """The ``tracking_uri`` option, else ``MLFLOW_TRACKING_URI``, else a sqlite file here."""
    return option or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI


def _artifact_root(uri: str) -> str | None:
    if uri.startswith("sqlite:///"):
        db = Path(uri[len("sqlite:///"):]).resolve()
        return (db.parent / "mlartifacts").as_uri()
    return None


class _Writer:
    """Runs MLflow calls in order on a daemon thread; errors are kept, not raised."""

    def __init__(self) -> None:
        self.jobs: queue.Queue = queue.Queue()
        self.errors: list[str] = []
        self.thread = threading.Thread(target=self._loop, name="frugalnas-mlflow", daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                job()
            except Exception as exc:  # logging must never kill a study
                self.errors.append(f"{type(exc).__name__}: {exc}")
            finally:
                self.jobs.task_done()

    def submit(self, fn: Any) -> None:
        self.jobs.put(fn)

    def drain(self) -> None:
        self.jobs.join()

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=60)


class StudyTracker:
    """MLflow state of one study: client, experiment, parent run, trial runs."""

    def __init__(self, study: Any):
        from mlflow import MlflowClient

        self.study = study
        self.uri = resolve_tracking_uri(study.config.tracking_uri)
        self.client = MlflowClient(tracking_uri=self.uri)
        self.writer = _Writer()
        self.started_ms: dict[int, int] = {}
        self.artifact_dirs: dict[str, Path] = {}
        self.trial_values: list[tuple[int, float]] = []
        self.experiment_id = ""
        self.parent_run_id = ""
        self.writer.submit(self._open)

    # -- runs on the writer thread -------------------------------------------------------
    def _open(self) -> None:
        name = self.study.name
        exp = self.client.get_experiment_by_name(name)
        if exp is None:
            try:
                self.experiment_id = self.client.create_experiment(
                    name, artifact_location=_artifact_root(self.uri),
                    # open on the runs view (MLflow 3 otherwise guesses a GenAI experiment)
                    tags={TAG_STUDY: name, "mlflow.experimentKind": "custom_model_development"})
            except Exception:  # another worker created it first
                self.experiment_id = self.client.get_experiment_by_name(name).experiment_id
        else:
            self.experiment_id = exp.experiment_id
        found = self.client.search_runs(
            [self.experiment_id], filter_string=f"tags.`{TAG_ROLE}` = 'study'", max_results=1)
        if found:
            self.parent_run_id = found[0].info.run_id
            self._remember_artifact_dir(found[0])
            if found[0].info.status != "RUNNING":
                self.client.update_run(self.parent_run_id, status="RUNNING")
        else:
            run = self.client.create_run(self.experiment_id, run_name=f"study {name}",
                                         tags={TAG_STUDY: name, TAG_ROLE: "study"})
            self.parent_run_id = run.info.run_id
            self._remember_artifact_dir(run)
            self._log_config()

    def _log_config(self) -> None:
        from mlflow.entities import Param

        cfg = json.loads(self.study.config.to_json())
        params = [Param(k, json.dumps(v) if isinstance(v, (dict, list)) else str(v))
                  for k, v in sorted(cfg.items())]
        self.client.log_batch(self.parent_run_id, params=params)
        self._write_artifact(self.parent_run_id, "study_config.json", json.dumps(cfg, indent=2))

    def _trial_tags(self, number: int) -> dict[str, str]:
        cfg = self.study.config
        return {TAG_STUDY: self.study.name, TAG_ROLE: "trial", TAG_TRIAL: str(number),
                "mlflow.parentRunId": self.parent_run_id, "strategy": cfg.strategy,
                "estimator": cfg.estimator, "backend": cfg.backend,
                "space": cfg.space}

    def _find_trial_run(self, number: int) -> str | None:
        """The run of trial ``number`` if one was logged already (a stale trial's run)."""
        found = self.client.search_runs(
            [self.experiment_id], max_results=1,
            filter_string=f"tags.`{TAG_TRIAL}` = '{number}' and tags.`{TAG_ROLE}` = 'trial'")
        if not found:
            return None
        self._remember_artifact_dir(found[0])
        return found[0].info.run_id

    def _finish_trial(self, number: int, arch: Any, state: str, values: list[float] | None,
                      result: Any, error: str | None, started_ms: int | None) -> None:
        """Create the trial's run complete with params, metrics, tags and artifacts: three
        store writes per trial (create, one batch, terminate)."""
        from mlflow.entities import Metric, Param, RunTag

        now = int(time.time() * 1000)
        stale = bool(error and error.startswith("stale trial"))
        run_id = self._find_trial_run(number) if stale else None
        if run_id is None:
            run = self.client.create_run(self.experiment_id, run_name=f"trial {number}",
                                         start_time=started_ms or now, tags=self._trial_tags(number))
            run_id = run.info.run_id
            self._remember_artifact_dir(run)
            params = [Param(k, str(v)) for k, v in arch.decisions.items()]
            params.append(Param("architecture", str(arch)[:6000]))
        else:
            params = []
        metrics: dict[str, float] = {}
        if result is not None:
            metrics.update(result.all_metrics())
        for name, v in zip(self.study.config.objectives, values or []):
            metrics[f"objective_{name}"] = float(v)
        tags = [RunTag("state", state)]
        if error:
            tags.append(RunTag("fail_reason", error[:4000]))
        self.client.log_batch(run_id, params=params,
                              metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()],
                              tags=tags)
        self._write_artifact(run_id, "architecture.json", json.dumps(arch.to_dict(), indent=2))
        space = self.study.space
        self._write_artifact(run_id, "cell.png", draw_cell(str(arch), space.cell_graph(arch), arch.decisions))
        for fname, content in (result.artifacts.items() if result is not None else ()):
            self._write_artifact(run_id, fname, content)
        status = {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}.get(state, "KILLED")
        self.client.set_terminated(run_id, status="KILLED" if stale else status, end_time=now)
        if values and len(values) == 1:
            self.trial_values.append((number, float(values[0])))

    def _write_artifact(self, run_id: str, name: str, content: str | bytes) -> None:
        """Write an artifact file: straight into a local artifact folder (no MLflow round trip
        to look the run up), or through the client for remote stores."""
        data = content.encode() if isinstance(content, str) else content
        root = self.artifact_dirs.get(run_id)
        if root is not None:
            path = root / name
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_bytes(data)
            return
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / Path(name).name
            path.write_bytes(data)
            parent = str(Path(name).parent)
            self.client.log_artifact(run_id, str(path), artifact_path=None if parent == "." else parent)

    def _remember_artifact_dir(self, run: Any) -> None:
        uri = run.info.artifact_uri or ""
        if uri.startswith("file://"):
            from urllib.parse import unquote, urlparse

            self.artifact_dirs[run.info.run_id] = Path(unquote(urlparse(uri).path))
        elif uri and "://" not in uri:
            self.artifact_dirs[run.info.run_id] = Path(uri)

    def _log_study_metrics(self, metrics: dict[str, float], step: int) -> None:
        from mlflow.entities import Metric

        now = int(time.time() * 1000)
        self.client.log_batch(self.parent_run_id,
                              metrics=[Metric(k, float(v), now, int(step)) for k, v in metrics.items()])

    def _log_trial_values(self) -> None:
        """This session's trial values, and the best so far at each of them over every
        completed trial in the storage (so several workers agree), as step metrics on the
        parent run, batched here rather than one call per trial."""
        from mlflow.entities import Metric
        from optuna.trial import TrialState

        if not self.trial_values:
            return
        maximize = self.study.directions[0] == "maximize"
        done = sorted((t.number, t.value) for t in self.study.optuna_study.get_trials(
            deepcopy=False, states=(TrialState.COMPLETE,)))
        now, metrics, best, i = int(time.time() * 1000), [], None, 0
        for number, value in sorted(self.trial_values):
            while i < len(done) and done[i][0] <= number:
                v = done[i][1]
                best = v if best is None else (max(best, v) if maximize else min(best, v))
                i += 1
            metrics.append(Metric("trial_value", value, now, number))
            if best is not None:
                metrics.append(Metric("best_so_far", best, now, number))
        for k in range(0, len(metrics), 900):
            self.client.log_batch(self.parent_run_id, metrics=metrics[k:k + 900])
        self.trial_values.clear()

    def _close(self) -> None:
        from optuna.trial import TrialState

        self._log_trial_values()
        ostudy = self.study.optuna_study
        done = ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
        dirs = self.study.directions
        if done and len(dirs) == 1:
            png = draw_best_so_far([t.number for t in done], [t.value for t in done],
                                   dirs[0] == "maximize", f"study {self.study.name}")
            self._write_artifact(self.parent_run_id, "best_so_far.png", png)
            best = ostudy.best_trial
            self.client.log_metric(self.parent_run_id, "best_value", float(best.value))
            self.client.set_tag(self.parent_run_id, "best_architecture",
                                best.user_attrs.get("architecture", ""))
        elif done and len(dirs) == 2:
            front = [t.values for t in ostudy.best_trials]
            png = draw_pareto([t.values for t in done], front, self.study.config.objectives,
                              f"study {self.study.name}: Pareto front")
            self._write_artifact(self.parent_run_id, "pareto_front.png", png)
            front_json = [{"number": t.number, "values": t.values,
                           "architecture": t.user_attrs.get("architecture")} for t in ostudy.best_trials]
            self._write_artifact(self.parent_run_id, "pareto_front.json", json.dumps(front_json, indent=2))
        self.client.log_metric(self.parent_run_id, "n_complete_trials", float(len(done)))
        self.client.set_terminated(self.parent_run_id, status="FINISHED")

    # -- called from hooks ---------------------------------------------------------------
    def trial_started(self, number: int) -> None:
        self.started_ms[number] = int(time.time() * 1000)

    def trial_finished(self, number: int, *args: Any) -> None:
        started = self.started_ms.pop(number, None)
        self.writer.submit(lambda: self._finish_trial(number, *args, started))

    def study_metrics(self, metrics: dict[str, float], step: int) -> None:
        self.writer.submit(lambda: self._log_study_metrics(dict(metrics), step))

    def close(self) -> None:
        self.writer.submit(self._close)
        self.writer.drain()
        self.writer.close()


_TRACKERS: dict[int, StudyTracker] = {}
_LOCK = threading.Lock()


def tracker_for(study: Any) -> StudyTracker | None:
    return _TRACKERS.get(id(study))


@hookimpl
def frugalnas_study_started(study: Any) -> None:
    with _LOCK:
        if id(study) not in _TRACKERS:
            _TRACKERS[id(study)] = StudyTracker(study)


@hookimpl
def frugalnas_trial_started(study: Any, trial: Any, architecture: Any) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.trial_started(trial.number)


@hookimpl
def frugalnas_trial_finished(study: Any, trial: Any, architecture: Any, state: str,
                             values: list[float] | None, result: Any, error: str | None) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.trial_finished(trial.number, architecture, state, values, result, error)


@hookimpl
def frugalnas_study_metrics(study: Any, metrics: dict[str, float], step: int) -> None:
    tracker = tracker_for(study)
    if tracker is not None:
        tracker.study_metrics(metrics, step)


@hookimpl
def frugalnas_study_finished(study: Any) -> None:
    with _LOCK:
        tracker = _TRACKERS.pop(id(study), None)
    if tracker is not None:
        tracker.close()
        study.tracking_state["errors"] = list(tracker.writer.errors)
        study.tracking_state["parent_run_id"] = tracker.parent_run_id
        study.tracking_state["experiment_id"] = tracker.experiment_id


@atexit.register
def _close_all() -> None:
    for key in list(_TRACKERS):
        tracker = _TRACKERS.pop(key, None)
        if tracker is not None:
            tracker.close()
