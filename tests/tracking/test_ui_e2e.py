"""The MLflow UI started by ``frugalnas ui``, checked end to end in headless Chromium.

A finished 5-trial study is opened at the address ``frugalnas ui`` prints; Chromium renders
MLflow's single-page app and the test reads the rendered DOM: the trial rows, their
architectures and objective values, best first. The screenshot is kept as a test artifact
under ``FRUGALNAS_TEST_ARTIFACTS`` (default tests/artifacts/).
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

import frugalnas
from frugalnas.cli.main import build_parser
from frugalnas.host.plugins import PluginHost
from frugalnas.testing import fresh_mlflow_uri

REPO = Path(__file__).resolve().parents[2]
CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
CHROMIUM_FLAGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run",
                  "--disable-background-networking", "--disable-component-update", "--disable-sync",
                  "--virtual-time-budget=15000"]


def test_ui_binds_localhost_by_default():
    parser = build_parser(PluginHost())
    assert parser.parse_args(["ui"]).bind_host == "127.0.0.1"
    assert parser.parse_args(["ui", "--host", "0.0.0.0"]).bind_host == "0.0.0.0"
    blocked = build_parser(PluginHost(disable_plugins=["mlflow"]))
    with pytest.raises(SystemExit):  # the command belongs to the mlflow plugin
        blocked.parse_args(["ui"])


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _listen_addresses(port: int) -> set[str]:
    """Local addresses with a listening TCP socket on ``port`` (from /proc/net/tcp*)."""
    found = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        if not os.path.exists(table):
            continue
        for line in Path(table).read_text().splitlines()[1:]:
            local, state = line.split()[1], line.split()[3]
            addr, hexport = local.split(":")
            if state != "0A" or int(hexport, 16) != port:
                continue
            if len(addr) == 8:
                found.add(socket.inet_ntop(socket.AF_INET, bytes.fromhex(addr)[::-1]))
            else:
                raw = b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8))
                found.add(socket.inet_ntop(socket.AF_INET6, raw))
    return found


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return resp.read()


def _chromium(tmp_path: Path, url: str, *extra: str) -> str:
    out = subprocess.run([CHROMIUM, *CHROMIUM_FLAGS, f"--user-data-dir={tmp_path / 'chromium'}",
                          *extra, url], capture_output=True, text=True, timeout=90)
    return out.stdout


def _dom(tmp_path: Path, url: str, *extra: str) -> str:
    """The visible text of the page Chromium rendered (tags dropped, whitespace collapsed);
    ``extra`` flags (a ``--screenshot=PATH``) act on the same rendering."""
    html = _chromium(tmp_path, url, "--dump-dom", "--window-size=1400,900", *extra)
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))


def _artifact_dir() -> Path:
    """Where screenshots are kept: ``FRUGALNAS_TEST_ARTIFACTS``, else tests/artifacts/ (git
    ignores it)."""
    path = Path(os.environ.get("FRUGALNAS_TEST_ARTIFACTS") or REPO / "tests" / "artifacts")
    path.mkdir(parents=True, exist_ok=True)
    return path


def _start_ui(tmp_path: Path, uri: str, *extra: str) -> tuple[subprocess.Popen, str, str]:
    """``frugalnas ui`` as a real process on a free port; returns it, the server's base URL
    and the study address it printed, once the server answers."""
    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log_path = tmp_path / "ui.log"
    log = open(log_path, "w")
    server = subprocess.Popen([sys.executable, "-m", "frugalnas.cli.main", "ui", "--tracking-uri",
                               uri, "--port", str(port), *extra], stdout=log,
                              stderr=subprocess.STDOUT, cwd=tmp_path, start_new_session=True)
    end = time.monotonic() + 120
    while True:
        try:
            if _get(f"{base}/health").strip() == b"OK":
                break
        except OSError:
            pass
        if server.poll() is not None:
            raise AssertionError(log_path.read_text()[-2000:])
        if time.monotonic() > end:
            _stop_group(server)
            raise AssertionError("the UI did not come up in 120 s")
        time.sleep(0.5)
    printed = re.search(r"^study '[^']*': (http://\S+)$", log_path.read_text(), re.M)
    assert printed, log_path.read_text()[-2000:]
    return server, base, printed.group(1)


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_frugalnas_ui_opens_the_study_on_its_trial_rows(tmp_path):
    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    study = frugalnas.create_study(space="nb201", estimator="nb201-table", study_name="ui-study",
                                   storage=f"sqlite:///{tmp_path / 'optuna.db'}", seed=5,
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(n_trials=5)
    # a second, older-looking study in the same store: --study-name picks ui-study, not it
    other = frugalnas.create_study(estimator="nb201-table", study_name="other", seed=6,
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    other.optimize(n_trials=2)
    exp_id = study.plugin_state["mlflow"]["experiment_id"]
    parent = study.plugin_state["mlflow"]["parent_run_id"]

    server, base, url = _start_ui(tmp_path, uri, "--study-name", "ui-study")
    try:
        assert _listen_addresses(int(base.rsplit(":", 1)[1])) == {"127.0.0.1"}
        # the training-runs view of the study's experiment, not MLflow 3's GenAI overview
        assert url.startswith(f"{base}/#/experiments/{exp_id}/runs?")
        assert "workflowType=machine_learning" in url and "viewStateShareKey=" in url
        listed = json.loads(_get(f"{base}/api/2.0/mlflow/artifacts/list?run_id={parent}"))
        assert {"best_so_far.png", "leaderboard.html"} <= {f["path"] for f in listed["files"]}

        shot = tmp_path / "ui.png"  # one Chromium run renders the page, dumps and shoots it
        page = _dom(tmp_path, url, f"--screenshot={shot}")
        assert "Detect Issues" not in page
        assert "Ask questions about your" not in page  # MLflow 3's chat panel stays closed
        assert "6 matching runs" in page  # the parent run and its 5 trial runs, as rows
        # at 1,400 px the grid renders (only) the columns in view: all a reviewer compares
        for column in ("objective_value", "architecture", "cost_params", "cost_flops",
                       "cost_seconds"):
            assert column in page, (column, page[-3000:])
        for t in study.completed_trials():  # trial rows with their architecture and value
            assert f"trial {t.number}" in page, f"trial {t.number} missing"
            assert str(t.architecture) in page, f"architecture of trial {t.number} missing"
            assert repr(float(t.value)) in page, f"value of trial {t.number} missing"
        best = page.index(f"trial {study.best_trial.number}")
        assert all(best <= page.index(f"trial {t.number}") for t in study.completed_trials())

        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        shutil.copyfile(shot, _artifact_dir() / "ui_study_runs.png")
    finally:
        _stop_group(server)


def test_ui_names_a_missing_study_in_one_line(tmp_path, capsys):
    from frugalnas.cli.main import main

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    study = frugalnas.create_study(estimator="nb201-table", study_name="there",
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(n_trials=1)
    rc = main(["ui", "--tracking-uri", uri, "--study-name", "missing", "--port", "1"])
    err = capsys.readouterr().err
    assert rc != 0 and "no MLflow experiment for study 'missing'" in err and "there" in err
    assert "Traceback" not in err


def test_runs_view_url_and_shared_view(tmp_path):
    from frugalnas.tracking.mlflow.ui import (SHARED_VIEW_TAG, find_study_experiment,
                                              publish_runs_view, runs_view_url,
                                              study_runs_view)

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    for name in ("first", "second"):
        frugalnas.create_study(estimator="nb201-table", study_name=name,
                               objectives=["value", "latency_ms_pixel3"],
                               directions=["maximize", "minimize"],
                               plugin_options={"mlflow": {"tracking_uri": uri}}).optimize(n_trials=2)
    client = MlflowClient(tracking_uri=uri)
    exp = find_study_experiment(client, None)
    assert exp.name == "second"  # the most recent study
    assert find_study_experiment(client, "first").name == "first"
    assert find_study_experiment(client, exp.experiment_id).name == "second"
    key = publish_runs_view(client, exp)
    view = json.loads(client.get_experiment(exp.experiment_id).tags[SHARED_VIEW_TAG + key])
    assert view["orderByKey"] == "metrics.`objective_value`" and view["orderByAsc"] is False
    assert view["selectedColumns"] == ["metrics.`objective_value`",
                                       "metrics.`objective_latency_ms_pixel3`",
                                       "params.`architecture`", "metrics.`cost_params`",
                                       "metrics.`cost_flops`", "metrics.`cost_seconds`"]
    constrained = frugalnas.create_study(estimator="nb201-table", study_name="third",
                                         constraints={"latency_ms_pixel3": 10.0},
                                         plugin_options={"mlflow": {"tracking_uri": uri}})
    constrained.optimize(n_trials=2)
    _, view = study_runs_view(client, find_study_experiment(client, "third"))
    assert view["selectedColumns"][1:] == ["params.`architecture`", "metrics.`cost_params`",
                                           "metrics.`cost_flops`", "metrics.`latency_ms_pixel3`",
                                           "tags.`feasible`", "metrics.`cost_seconds`"]
    url = runs_view_url("http://127.0.0.1:5000", exp.experiment_id, key)
    assert url == (f"http://127.0.0.1:5000/#/experiments/{exp.experiment_id}/runs?"
                   f"workflowType=machine_learning&compareRunsMode=TABLE&viewStateShareKey={key}")


def _stop_group(proc: subprocess.Popen) -> None:
    """Stop the UI and the MLflow server processes it started (one process group)."""
    os.killpg(proc.pid, signal.SIGTERM)
    try:
        proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        pass
    try:
        time.sleep(1)
        os.killpg(proc.pid, signal.SIGKILL)  # children that outlived SIGTERM
    except ProcessLookupError:
        pass
    proc.wait(timeout=20)
