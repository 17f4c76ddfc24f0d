"""MLflow follows the optuna storage.

The storage is the record of truth: a worker can die (SIGKILL, power loss) after optuna
recorded its trial and before its MLflow writes reached the store, or between two of them.
:func:`reconcile` makes the study's MLflow experiment agree with the storage: exactly one
nested trial run per finished (COMPLETE, PRUNED or FAIL) trial, with its parameters,
metrics, tags and artifacts, in the final state the storage says; a RUNNING trial is left to
its worker. It runs under the study's MLflow lock (one writer at a time, across machines when
the storage is a database server), when a study or worker starts and when it ends.

What the storage holds and MLflow shows after a reconciliation: the architecture (params,
``architecture.json``, ``cell.png``), the estimator's metrics and the cost (``METRICS_ATTR``,
``COST_ATTR``), the objective values, ``state`` and ``fail_reason``. Artifacts an estimator
or backend attached to a trial are not in the storage; they are in MLflow only if the worker
that ran the trial wrote them.

A run is made from a :class:`~frugalnas.ports.trial_report.TrialReport` in one place,
:func:`trial_run`: the report the study hands the plugin when a trial ends, or the one
:func:`report_of` builds from the storage for a trial no process wrote.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from optuna.trial import FrozenTrial

from frugalnas.ports import optuna_compat
from frugalnas.ports.capabilities import CellGraph, capability
from frugalnas.ports.keys import INTERRUPTED_PREFIX
from frugalnas.ports.secrets import mask_text
from frugalnas.ports.trial_constraints import feasible_flag
from frugalnas.ports.trial_report import TrialReport
from frugalnas.tracking.mlflow.drawing import draw_cell
from frugalnas.tracking.mlflow.store import TAG_ROLE, TAG_STUDY_ID, TAG_TRIAL

#: MLflow's longest parameter value; a longer architecture string is also written whole as
#: the artifact ``architecture.txt``.
MAX_PARAM_LENGTH = 6000

STALE_PREFIX = "stale trial"
#: fail_reason of a FAIL trial whose reason the storage does not have.
NO_REASON = ("stale trial or interrupted worker: the storage has no failure reason (the "
             "worker stopped before recording one)")


def run_status(state: str, error: str | None) -> str:
    """MLflow's final run status for a trial state (KILLED for a dead worker's trial and for
    one stopped by a signal)."""
    if state == "FAIL" and (not error or error.startswith((STALE_PREFIX, INTERRUPTED_PREFIX))
                            or error == NO_REASON):
        return "KILLED"
    return {"COMPLETE": "FINISHED", "PRUNED": "FINISHED", "FAIL": "FAILED"}.get(state, "KILLED")


@dataclass
class TrialRun:
    """Everything a trial's MLflow run holds."""

    number: int
    state: str
    status: str
    params: dict[str, str] = field(default_factory=dict)
    metrics: dict[str, float] = field(default_factory=dict)
    tags: dict[str, str] = field(default_factory=dict)
    artifacts: dict[str, str | bytes] = field(default_factory=dict)
    start_ms: int | None = None
    end_ms: int | None = None
    #: Per-step values (``intermediate_<objective>`` -> [(step, value)]): what the estimator
    #: reported after each epoch, logged as metric histories.
    steps: dict[str, list[tuple[int, float]]] = field(default_factory=dict)


def architecture_param(text: str) -> str:
    """The ``architecture`` parameter: the whole string, or, beyond MLflow's limit, its start
    with a pointer to ``architecture.txt`` (which then holds it whole)."""
    if len(text) <= MAX_PARAM_LENGTH:
        return text
    marker = " ... (whole string in architecture.txt)"
    return text[:MAX_PARAM_LENGTH - len(marker)] + marker


def _arch_params(arch: Any) -> dict[str, str]:
    params = {k: architecture_param(str(v)) for k, v in arch.decisions.items()}
    params["architecture"] = architecture_param(str(arch))
    return params


def _arch_artifacts(tracker: Any, arch: Any) -> dict[str, str | bytes]:
    graph = capability(tracker.study.space, CellGraph)
    text = str(arch)
    out: dict[str, str | bytes] = {
        "architecture.json": json.dumps(arch.to_dict(), indent=2),
        "cell.png": draw_cell(text, graph.cell_graph(arch) if graph else [], arch.decisions)}
    if len(text) > MAX_PARAM_LENGTH:
        out["architecture.txt"] = text
    return out


def feasible_tag(value: Any) -> str | None:
    """``"true"``/``"false"`` for a trial's feasibility, ``None`` without one."""
    flag = feasible_flag(value)
    return None if flag is None else ("true" if flag else "false")


def intermediate_series(objectives: list[str], vectors: Mapping[int, Sequence[float]]
                        ) -> dict[str, list[tuple[int, float]]]:
    """Metric histories (``intermediate_<objective>`` -> [(step, value)]) from a trial's
    per-step objective vectors (:attr:`TrialReport.intermediate`)."""
    series: dict[str, list[tuple[int, float]]] = {}
    for step, vector in sorted(vectors.items()):
        for name, v in zip(objectives, vector):
            series.setdefault(f"intermediate_{name}", []).append((int(step), float(v)))
    return series


def _ms(moment: datetime.datetime | None) -> int | None:
    return int(moment.timestamp() * 1000) if moment else None


def report_of(tracker: Any, frozen: FrozenTrial) -> TrialReport:
    """The :class:`TrialReport` of a finished trial as the storage records it (the same one
    the study hands the plugins for a stale trial)."""
    study = tracker.study
    return TrialReport.from_frozen(frozen, study.space, study.config.objectives)


def trial_run(tracker: Any, report: TrialReport) -> TrialRun:
    """The run of a finished trial: the one mapping from a :class:`TrialReport` to MLflow,
    for a trial this process just ran (with the estimator's artifacts) as for one the
    reconciliation reads from the storage (:func:`report_of`)."""
    objectives = list(tracker.study.config.objectives)
    state = report.state.name
    error = report.error
    if state == "FAIL" and not error:
        error = NO_REASON
    metrics: dict[str, float] = dict(report.metrics)
    if report.cost is not None:
        metrics.update(report.cost.to_metrics())
    for name, v in zip(objectives, report.values or ()):
        metrics[f"objective_{name}"] = float(v)
    tags = {**tracker.trial_tags(report.number), "state": state}
    if error:
        tags["fail_reason"] = mask_text(error)[:4000]
    if (flag := feasible_tag(report.feasible)) is not None:
        tags["feasible"] = flag
    run = TrialRun(report.number, state, run_status(state, error), metrics=metrics, tags=tags,
                   start_ms=_ms(report.started), end_ms=_ms(report.finished),
                   steps=intermediate_series(objectives, report.intermediate))
    if report.architecture is not None:
        run.params = _arch_params(report.architecture)
        run.artifacts = _arch_artifacts(tracker, report.architecture)
    elif report.architecture_text:
        text = report.architecture_text
        run.params = {"architecture": architecture_param(text)}
        if len(text) > MAX_PARAM_LENGTH:
            run.artifacts["architecture.txt"] = text
    run.artifacts.update(report.artifacts)
    return run


def _keep(runs: list[Any]) -> Any:
    """Of several runs for one trial, the one to keep: a finished one, else the oldest."""
    return sorted(runs, key=lambda r: (r.info.status == "RUNNING", r.info.start_time or 0,
                                       r.info.run_id))[0]


def write(tracker: Any, run: TrialRun, existing: list[Any], *, fill_only: bool = False) -> str:
    """Write ``run`` into MLflow: create it, or complete the run already there (its duplicates
    are deleted). ``fill_only`` (reconciliation): only add what the run lacks, keep its
    metrics and artifacts. Returns the run id."""
    from mlflow.entities import Metric, Param, RunTag

    client = tracker.client
    now = int(time.time() * 1000)
    if existing:
        keep = _keep(existing)
        for other in existing:
            if other.info.run_id != keep.info.run_id:
                client.delete_run(other.info.run_id)
        run_id = keep.info.run_id
        tracker.remember_artifact_dir(keep)
        have_params = keep.data.params
        params = [Param(k, v) for k, v in run.params.items() if k not in have_params]
        metrics = {k: v for k, v in run.metrics.items()
                   if not fill_only or k not in keep.data.metrics}
        partial = keep.info.status == "RUNNING"
        had_reason = "fail_reason" in keep.data.tags
        have_metrics = keep.data.metrics
    else:
        created = client.create_run(tracker.experiment_id, run_name=f"trial {run.number}",
                                    start_time=run.start_ms or now, tags=run.tags)
        run_id = created.info.run_id
        tracker.remember_artifact_dir(created)
        params = [Param(k, v) for k, v in run.params.items()]
        metrics = run.metrics
        partial, had_reason, have_metrics = True, False, {}
    # a new run got its tags with create_run: one write fewer
    tags = [RunTag(k, v) for k, v in run.tags.items()] if existing else []
    if run.state != "FAIL" and had_reason:
        client.delete_tag(run_id, "fail_reason")
    history = [Metric(k, v, now, step) for k, series in run.steps.items()
               if not fill_only or k not in have_metrics
               for step, v in series]
    client.log_batch(run_id, params=params,
                     metrics=[Metric(k, float(v), now, 0) for k, v in metrics.items()] + history[:900],
                     tags=tags)
    for k in range(900, len(history), 900):
        client.log_batch(run_id, metrics=history[k:k + 900])
    if partial or not fill_only:
        for name, content in run.artifacts.items():
            tracker.write_artifact(run_id, name, content)
    client.set_terminated(run_id, status=run.status, end_time=run.end_ms or now)
    return run_id


#: Most runs one call of :func:`create_runs` writes in one database transaction.
CREATE_BATCH = 100


def sql_store(client: Any) -> Any | None:
    """The SQL store behind ``client`` (sqlite, PostgreSQL, MySQL), where :func:`create_runs`
    writes a batch of runs in one transaction; ``None`` for any other store (a tracking
    server), whose runs are created one by one through the client."""
    try:
        from mlflow.store.tracking.sqlalchemy_store import SqlAlchemyStore

        store = client._tracking_client.store
    except (ImportError, AttributeError):  # an MLflow without them: the client's calls
        return None
    return store if isinstance(store, SqlAlchemyStore) else None


def create_runs(tracker: Any, runs: Sequence[TrialRun]) -> list[str]:
    """Create the runs of trials that have none yet, complete and in their final state;
    returns their ids in order. On a SQL store, each :data:`CREATE_BATCH` of runs is one
    transaction (artifacts first: a process killed in between leaves no run, and the next
    reconciliation writes it again); elsewhere each run is created, filled with one
    ``log_batch`` and terminated (:func:`write`), :data:`WRITE_THREADS` runs at a time."""
    if not runs:
        return []
    store = sql_store(tracker.client)
    if store is None:
        return _write_concurrently(tracker, runs)
    ids = []
    for k in range(0, len(runs), CREATE_BATCH):
        ids += _insert_runs(tracker, store, runs[k:k + CREATE_BATCH])
        tracker.counters["create_batches"] += 1
        tracker.writer.progressed(len(runs[k:k + CREATE_BATCH]))
    return ids


#: Runs written at the same time to a store without batches (a tracking server: each run
#: is a few requests, and their round trips overlap).
WRITE_THREADS = 8


def _write_concurrently(tracker: Any, runs: Sequence[TrialRun]) -> list[str]:
    from concurrent.futures import ThreadPoolExecutor

    def one(run: TrialRun) -> str:
        run_id = write(tracker, run, [])
        tracker.writer.progressed()
        return run_id

    tracker.counters["create_batches"] += len(runs)
    if len(runs) == 1:
        return [one(runs[0])]
    with ThreadPoolExecutor(max_workers=min(WRITE_THREADS, len(runs)),
                            thread_name_prefix=tracker.writer.thread.name) as pool:
        futures = [pool.submit(one, run) for run in runs]
    return [f.result() for f in futures]  # the first failure raises, once all are done


def time_ordered_id() -> str:
    """A new run id: a version 7 UUID (RFC 9562: 48 bits of Unix milliseconds, then random
    bits) as 32 hex digits. MLflow's SQL tables key tags, params and latest metrics by
    (key, run id); ids that grow with time are inserted next to each other, so the pages a
    batch of new runs touches, and its commit, do not grow with the store (random ids spread
    each batch over the whole index, 1.5x slower per run after 10,000 runs)."""
    ms = time.time_ns() // 1_000_000 & ((1 << 48) - 1)
    rand = int.from_bytes(os.urandom(10), "big")  # 80 random bits, 74 of them used
    value = (ms << 80) | (0x7 << 76) | ((rand >> 62) & 0xFFF) << 64 | (0b10 << 62) \
        | (rand & ((1 << 62) - 1))
    return f"{value:032x}"


def _insert_runs(tracker: Any, store: Any, runs: Sequence[TrialRun]) -> list[str]:
    """Insert ``runs`` (complete, in their final state) into a SQL store in one transaction,
    as MLflow's ``create_run``, ``log_batch`` and ``set_terminated`` would write them."""
    from mlflow.entities import LifecycleStage, Metric, Param, RunTag, SourceType
    from mlflow.store.tracking.dbmodels.models import (SqlLatestMetric, SqlMetric, SqlParam,
                                                       SqlRun, SqlTag)
    from mlflow.utils.mlflow_tags import MLFLOW_RUN_NAME
    from mlflow.utils.uri import append_to_uri_path
    from mlflow.utils.validation import _validate_batch_log_data

    location = store.get_experiment(tracker.experiment_id).artifact_location
    now = int(time.time() * 1000)
    rows: dict[Any, list[dict[str, Any]]] = {SqlRun: [], SqlTag: [], SqlParam: [],
                                             SqlMetric: [], SqlLatestMetric: []}
    ids = []
    for run in runs:
        run_id = time_ordered_id()
        name = f"trial {run.number}"
        tags = {**run.tags, MLFLOW_RUN_NAME: name}
        metrics = [Metric(k, float(v), now, 0) for k, v in run.metrics.items()]
        metrics += [Metric(k, float(v), now, step) for k, series in run.steps.items()
                    for step, v in series]
        _validate_batch_log_data(metrics, [Param(k, v) for k, v in run.params.items()],
                                 [RunTag(k, v) for k, v in tags.items()])
        artifact_uri = append_to_uri_path(location, run_id, "artifacts")
        tracker.remember_artifact_uri(run_id, artifact_uri)
        for art, content in run.artifacts.items():
            tracker.write_artifact(run_id, art, content)
        rows[SqlRun].append(dict(
            name=name, artifact_uri=artifact_uri, run_uuid=run_id,
            experiment_id=int(tracker.experiment_id),
            source_type=SourceType.to_string(SourceType.UNKNOWN), source_name="",
            entry_point_name="", user_id="unknown", status=run.status,
            start_time=run.start_ms or now, end_time=run.end_ms or now, deleted_time=None,
            source_version="", lifecycle_stage=LifecycleStage.ACTIVE))
        rows[SqlTag] += [dict(key=k, value=v, run_uuid=run_id) for k, v in tags.items()]
        rows[SqlParam] += [dict(key=k, value=v, run_uuid=run_id) for k, v in run.params.items()]
        latest: dict[str, Metric] = {}
        for m in dict.fromkeys(metrics):
            rows[SqlMetric].append(dict(key=m.key, timestamp=m.timestamp, step=m.step,
                                        run_uuid=run_id, **_sanitized(store, m.value)))
            have = latest.get(m.key)
            if have is None or (m.step, m.timestamp, m.value) >= (have.step, have.timestamp,
                                                                  have.value):
                latest[m.key] = m
        rows[SqlLatestMetric] += [dict(key=m.key, timestamp=m.timestamp, step=m.step,
                                       run_uuid=run_id, **_sanitized(store, m.value))
                                  for m in latest.values()]
        ids.append(run_id)
    with store.ManagedSessionMaker() as session:
        for model, values in rows.items():  # runs first: the others refer to them
            if values:
                session.execute(model.__table__.insert(), values)
    return ids


def _sanitized(store: Any, value: float) -> dict[str, Any]:
    is_nan, stored = store.sanitize_metric_value(float(value))
    return {"value": stored, "is_nan": is_nan}


def trial_runs(tracker: Any, number: int | None = None, since_ms: int | None = None) -> list[Any]:
    """The study's trial runs (of trial ``number`` only, when given; started at or after
    ``since_ms``, when given)."""
    flt = (f"tags.`{TAG_STUDY_ID}` = '{tracker.uid}' and tags.`{TAG_ROLE}` = 'trial'")
    if number is not None:
        flt += f" and tags.`{TAG_TRIAL}` = '{number}'"
    if since_ms is not None:
        flt += f" and attributes.start_time >= {int(since_ms)}"
    out, token = [], None
    while True:
        page = tracker.client.search_runs([tracker.experiment_id], filter_string=flt,
                                          max_results=1000, page_token=token)
        out.extend(page)
        token = page.token
        if not token:
            return out


def needs_repair(run: Any, expected: TrialRun) -> bool:
    tags = run.data.tags
    return (run.info.status == "RUNNING" or run.info.status != expected.status
            or tags.get("state") != expected.state
            or tags.get("mlflow.parentRunId") != expected.tags["mlflow.parentRunId"]
            or (expected.state == "FAIL" and not tags.get("fail_reason")))


def unchecked_trials(trials: list[FrozenTrial],
                     known: dict[int, tuple[str, str]]) -> list[FrozenTrial]:
    """The finished trials of ``trials`` whose run this process has not written or checked
    in the state the storage now gives (``known``: trial number -> (state, run id))."""
    return [t for t in trials
            if t.state.is_finished() and known.get(t.number, ("",))[0] != t.state.name]


def reconcile(tracker: Any, skip: set[int] | frozenset[int] = frozenset(),
              trials: list[FrozenTrial] | None = None,
              known: dict[int, tuple[str, str]] | None = None,
              unsettled: dict[int, list[Any]] | None = None) -> dict[str, int]:
    """Make the study's trial runs agree with its storage; returns what it changed:
    ``created`` runs, ``repaired`` runs (closed, state fixed), ``removed`` duplicates.

    One search for the study's trial runs and one read of its trials (``trials``, when the
    caller has read them); on a study whose runs are all there and right, nothing is
    written; missing runs are created in batches (:func:`create_runs`). Trials in ``skip``
    (those this process has run and is about to write itself) are left alone. ``known``
    (trial number -> (state, run id)) receives every trial whose run is right afterwards, and
    ``unsettled`` the runs found for the trials left alone (skipped or not finished), so that
    their writer completes those runs without searching for them."""
    if trials is None:
        trials = optuna_compat.fresh_trials(tracker.study.optuna_study)
    by_number: dict[int, list[Any]] = {}
    for r in trial_runs(tracker):
        try:
            by_number.setdefault(int(r.data.tags[TAG_TRIAL]), []).append(r)
        except (KeyError, ValueError):
            continue
    changes = {"created": 0, "repaired": 0, "removed": 0}
    missing: list[FrozenTrial] = []
    for frozen in trials:
        if not frozen.state.is_finished() or frozen.number in skip:
            if unsettled is not None and frozen.number in by_number:
                unsettled[frozen.number] = by_number[frozen.number]
            continue
        runs = by_number.get(frozen.number, [])
        if len(runs) == 1:
            expected_state = frozen.state.name
            tags = runs[0].data.tags
            if (runs[0].info.status != "RUNNING" and tags.get("state") == expected_state
                    and tags.get("mlflow.parentRunId") == tracker.parent_run_id
                    and (expected_state != "FAIL" or tags.get("fail_reason"))):
                if known is not None:
                    known[frozen.number] = (expected_state, runs[0].info.run_id)
                continue  # the common case, decided without building the run
        if not runs:
            missing.append(frozen)
            continue
        expected = trial_run(tracker, report_of(tracker, frozen))
        if len(runs) > 1:
            changes["removed"] += len(runs) - 1
        keep = _keep(runs)
        if len(runs) > 1 or needs_repair(keep, expected):
            if keep.data.tags.get("state") == "FAIL" and expected.state == "FAIL":
                # keep the reason the worker wrote (it may be more precise than the storage's)
                expected.tags["fail_reason"] = keep.data.tags.get(
                    "fail_reason", expected.tags.get("fail_reason", NO_REASON))
                expected.status = keep.info.status if keep.info.status != "RUNNING" \
                    else expected.status
            run_id = write(tracker, expected, runs, fill_only=True)
            tracker.writer.progressed()
            changes["repaired"] += 1
        else:
            run_id = keep.info.run_id
        if known is not None:
            known[frozen.number] = (expected.state, run_id)
    for k in range(0, len(missing), CREATE_BATCH):
        batch = [trial_run(tracker, report_of(tracker, t)) for t in missing[k:k + CREATE_BATCH]]
        for run, run_id in zip(batch, create_runs(tracker, batch)):
            if known is not None:
                known[run.number] = (run.state, run_id)
        changes["created"] += len(batch)
    return changes
