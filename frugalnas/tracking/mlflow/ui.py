"""``frugalnas ui``: the MLflow UI for the store in use, opened on a study's runs table (a
shared view with the objective, architecture, state and cost columns), with the server's
process group stopped quietly on SIGTERM, SIGINT and SIGHUP."""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any

from frugalnas.ports.errors import ConfigError
from frugalnas.ports.secrets import mask_text
from frugalnas.tracking.mlflow.checks import check_tracking_uri

from frugalnas.tracking.mlflow.store import (TAG_ROLE, TAG_STUDY, artifact_root,
                                             prepare_tracking_store, resolve_tracking_uri)


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
    # The store's URI (which may hold a password) goes to the server in its environment, not
    # on a command line that every user of the machine can read.
    env = {**os.environ, "MLFLOW_BACKEND_STORE_URI": uri}
    cmd = [sys.executable, "-m", "mlflow", "ui",
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
    return run_forwarding_signals(cmd, env=env)


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


def run_forwarding_signals(cmd: list[str], grace: float = 15.0,
                           env: dict[str, str] | None = None) -> int:
    """Run ``cmd`` in its own process group and stop the whole group (the MLflow CLI and the
    server processes it starts) with SIGTERM when this process receives SIGTERM, SIGINT
    (Ctrl-C) or SIGHUP: SIGTERM is the signal the server's children stop on quietly, where
    SIGINT has each of them print a traceback. Waits for the command and returns its exit
    status (128 + N for a signal N, as a shell reports it). Whatever of the group is left
    ``grace`` seconds after the command exits, or after a signal, is killed. ``env``: the
    command's environment (default: this process's)."""
    proc = subprocess.Popen(cmd, start_new_session=True, env=env)
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
