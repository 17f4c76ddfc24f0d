"""Where the MLflow plugin writes: its options and their defaults, the tracking URI of a study
(option, ``MLFLOW_TRACKING_URI`` or the default) as this process reaches it, the store made
ready, and the study's experiment."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

from frugalnas.ports.secrets import without_masked_password


PLUGIN = "mlflow"
OPTIONS = ("tracking_uri", "hypervolume_reference", "ui_url", "units")
DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
DEFAULT_UI_URL = "http://127.0.0.1:5000"
#: Study user attribute: the id that tags this study's MLflow runs (``frugalnas.study_id``), so
#: that two studies with one name (in-memory studies run twice) never share runs.
UID_ATTR = "frugalnas_mlflow_study_id"
#: The tags of a study's runs: the study's name and id, the run's role (the study's parent run
#: or a trial's run) and a trial run's number.
TAG_STUDY = "frugalnas.study"
TAG_STUDY_ID = "frugalnas.study_id"
TAG_ROLE = "frugalnas.role"
TAG_TRIAL = "frugalnas.trial_number"


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

    from frugalnas.distribution.locks import file_lock

    path = Path(uri[len("sqlite:///"):]).resolve()
    with file_lock(path.with_name(path.name + ".frugalnas.lock")):
        MlflowClient(tracking_uri=uri).search_experiments(max_results=1)



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
