"""Logging an exported network to MLflow: an MLflow 3 ``LoggedModel`` (``mlflow.pytorch``
flavour, with signature and input example) in the study's experiment, linked to the trial's
run (found by its tags), with the test accuracy as a model metric; optionally a version in
the model registry. The ``mlflow`` plugin does it in its ``frugalnas_model_exported`` hook
(``frugalnas export`` calls the hook and knows nothing of MLflow), and answers
``frugalnas_trial_links`` (``frugalnas report --mlflow-url``) with :func:`trial_run_links`."""

from __future__ import annotations

import contextlib
import logging
import os
import sys
import time
from collections.abc import Iterator
from typing import Any

from frugalnas.ports.exported import ExportedNetwork
from frugalnas.ports.secrets import mask_text
from frugalnas.ports.version import __version__
from frugalnas.tracking.mlflow.store import (TAG_ROLE, TAG_STUDY, TAG_STUDY_ID, TAG_TRIAL, UID_ATTR,
                                             ensure_experiment, prepare_tracking_store,
                                             runtime_uri, tracking_uri_of)


def tracking_uri(study: Any) -> str:
    """The tracking URI of the study (its ``mlflow`` plugin options, else the default)."""
    return tracking_uri_of(study.config)


@contextlib.contextmanager
def _global_uri(uri: str) -> Iterator[None]:
    """``mlflow.pytorch.log_model`` logs to the process-wide tracking URI: point it at the
    study's store for the call, then restore it."""
    import mlflow

    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    bar = os.environ.get("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = "false"
    quiet = [logging.getLogger(n) for n in ("mlflow", "alembic")]
    levels = [lg.level for lg in quiet]
    for lg in quiet:
        lg.setLevel(logging.ERROR)
    try:
        yield
    finally:
        mlflow.set_tracking_uri(previous)
        if bar is None:
            os.environ.pop("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", None)
        else:
            os.environ["MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR"] = bar
        for lg, level in zip(quiet, levels):
            lg.setLevel(level)


def trial_run(client: Any, study: Any, experiment_id: str, number: int) -> Any | None:
    """The MLflow run of trial ``number`` (tags ``frugalnas.study_id``, ``frugalnas.role`` and
    ``frugalnas.trial_number``), or ``None``."""
    uid = study.optuna_study.user_attrs.get(UID_ATTR)
    flt = f"tags.`{TAG_ROLE}` = 'trial' and tags.`{TAG_TRIAL}` = '{int(number)}'"
    flt += f" and tags.`{TAG_STUDY_ID}` = '{uid}'" if uid else \
        f" and tags.`{TAG_STUDY}` = '{study.name}'"
    runs = client.search_runs([experiment_id], filter_string=flt, max_results=10)
    runs = sorted(runs, key=lambda r: (r.info.status == "RUNNING", r.info.start_time or 0))
    return runs[0] if runs else None


def trial_run_links(study: Any, base_url: str) -> dict[int, str]:
    """Trial number -> URL of its run in the MLflow UI at ``base_url`` (for
    :func:`~frugalnas.leaderboard.leaderboard_html`)."""
    from mlflow import MlflowClient

    client = MlflowClient(tracking_uri=tracking_uri(study))
    exp = client.get_experiment_by_name(study.name)
    uid = study.optuna_study.user_attrs.get(UID_ATTR)
    if exp is None or not uid:
        return {}
    links: dict[int, str] = {}
    base = mask_text(base_url).rstrip("/")
    token = None
    while True:
        page = client.search_runs([exp.experiment_id], max_results=1000, page_token=token,
                                  filter_string=f"tags.`{TAG_STUDY_ID}` = '{uid}' and "
                                                f"tags.`{TAG_ROLE}` = 'trial'")
        for run in page:
            try:
                links[int(run.data.tags[TAG_TRIAL])] = (
                    f"{base}/#/experiments/{exp.experiment_id}/runs/{run.info.run_id}")
            except (KeyError, ValueError):
                continue
        token = page.token
        if not token:
            return links


def log_model(study: Any, exported: ExportedNetwork) -> dict[str, Any]:
    """Log the exported network as an MLflow model; returns ``{tracking_uri, experiment_id,
    run_id, model_id, model_uri, registered_model, registered_version}``."""
    import mlflow
    import mlflow.pytorch
    import numpy as np
    import torch
    from mlflow import MlflowClient
    from mlflow.entities import Metric
    from mlflow.models import infer_signature

    number, register = exported.trial, exported.register
    uri = runtime_uri(exported.tracking_uri) if exported.tracking_uri else tracking_uri(study)
    prepare_tracking_store(uri)
    client = MlflowClient(tracking_uri=uri)
    experiment_id = ensure_experiment(client, study.name, uri)
    run = trial_run(client, study, experiment_id, number)
    run_id = run.info.run_id if run is not None else None
    if run is None:
        print(f"frugalnas: warning: trial {number} of study {study.name!r} has no MLflow run "
              f"in {mask_text(uri)}; the model is logged to experiment {study.name!r} without "
              "a link to it", file=sys.stderr)
    model, example = exported.model.eval(), exported.example
    with torch.no_grad():
        output = model(example).numpy()
    # float32 images; a language model's int64 token ids kept as they are
    x = example.numpy().astype(np.float32 if example.is_floating_point() else np.int64)
    signature = infer_signature(x, output)
    logged = client.create_logged_model(
        experiment_id=experiment_id, name=f"trial-{number}", source_run_id=run_id,
        tags={TAG_STUDY: study.name, TAG_TRIAL: str(number), "frugalnas.role": "export"},
        params={k: str(v)[:6000] for k, v in {**exported.params,
                                              "architecture": exported.architecture}.items()},
        model_type="frugalnas-export")
    requirements = [f"torch=={torch.__version__.split('+')[0]}",
                    f"frugalnas=={__version__}", f"numpy=={np.__version__}"]
    with _global_uri(uri):
        info = mlflow.pytorch.log_model(
            model, name=f"trial-{number}", model_id=logged.model_id, run_id=run_id,
            signature=signature, input_example=x, pip_requirements=requirements,
            extra_files=[str(p) for p in exported.files], registered_model_name=register,
            await_registration_for=60 if register else 0)
    if run_id is not None:
        now = int(time.time() * 1000)
        client.log_batch(run_id, metrics=[Metric(k, float(v), now, 0, model_id=logged.model_id)
                                          for k, v in exported.metrics.items()])
    current = client.get_logged_model(logged.model_id)
    if str(getattr(current.status, "name", current.status)).upper().endswith("PENDING"):
        client.finalize_logged_model(logged.model_id, "READY")
    out = {"tracking_uri": mask_text(uri), "experiment_id": experiment_id, "run_id": run_id,
           "model_id": logged.model_id, "model_uri": info.model_uri,
           "registered_model": None, "registered_version": None}
    if register:
        out["registered_model"] = register
        out["registered_version"] = int(info.registered_model_version) \
            if info.registered_model_version is not None else None
    return out
