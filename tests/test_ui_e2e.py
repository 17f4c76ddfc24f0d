"""The MLflow UI started by ``frugalnas ui``, checked end to end in headless Chromium.

A finished 5-trial study is opened in the UI; Chromium renders MLflow's single-page app and
the test reads the rendered DOM: the experiment's runs, the trial runs (compare view) and the
parent run's best-so-far artifact; a screenshot of that artifact is kept as a test artifact.
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
import urllib.parse
import urllib.request
from pathlib import Path

import pytest
from mlflow import MlflowClient

import frugalnas
from frugalnas.core.cli import build_parser
from frugalnas.core.plugins import PluginHost
from frugalnas.testing import fresh_mlflow_uri

REPO = Path(__file__).resolve().parents[1]
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


def _dom(tmp_path: Path, url: str) -> str:
    """The visible text of the page Chromium rendered (tags dropped, whitespace collapsed)."""
    html = _chromium(tmp_path, url, "--dump-dom")
    text = re.sub(r"<script.*?</script>|<style.*?</style>", " ", html, flags=re.S)
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", text))


@pytest.mark.slow
@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (apt-get install chromium)")
def test_mlflow_ui_shows_study_trials_and_best_so_far(tmp_path):
    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    study = frugalnas.create_study(space="nb201", estimator="nb201-table", study_name="ui-study",
                                   storage=f"sqlite:///{tmp_path / 'optuna.db'}", plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(n_trials=5)
    exp_id = study.plugin_state["mlflow"]["experiment_id"]
    parent = study.plugin_state["mlflow"]["parent_run_id"]
    client = MlflowClient(tracking_uri=uri)
    trial_runs = {r.info.run_name: r.info.run_id for r in client.search_runs([exp_id])
                  if r.data.tags.get("frugalnas.role") == "trial"}
    assert sorted(trial_runs) == [f"trial {i}" for i in range(5)]

    port = _free_port()
    base = f"http://127.0.0.1:{port}"
    log = open(tmp_path / "ui.log", "w")
    server = subprocess.Popen([sys.executable, "-m", "frugalnas.core.cli", "ui", "--tracking-uri", uri,
                               "--port", str(port)], stdout=log, stderr=subprocess.STDOUT,
                              cwd=tmp_path, start_new_session=True)
    try:
        end = time.monotonic() + 120
        while True:
            try:
                if _get(f"{base}/health").strip() == b"OK":
                    break
            except OSError:
                pass
            assert server.poll() is None, (tmp_path / "ui.log").read_text()[-2000:]
            assert time.monotonic() < end, "the UI did not come up in 120 s"
            time.sleep(0.5)
        assert _listen_addresses(port) == {"127.0.0.1"}, _listen_addresses(port)

        listed = json.loads(_get(f"{base}/api/2.0/mlflow/artifacts/list?run_id={parent}"))
        assert "best_so_far.png" in {f["path"] for f in listed["files"]}

        runs_page = _dom(tmp_path, f"{base}/#/experiments/{exp_id}/runs")
        assert "ui-study" in runs_page and "study ui-study" in runs_page
        assert "6 matching runs" in runs_page  # the parent run and its 5 trial runs

        ids = urllib.parse.quote(json.dumps(list(trial_runs.values())))
        compare = _dom(tmp_path, f"{base}/#/compare-runs?runs={ids}&experiments=%5B%22{exp_id}%22%5D")
        for name in trial_runs:
            assert name in compare, f"{name} missing from the compare view"
        assert "Comparing 5 Runs" in compare

        artifact_url = f"{base}/#/experiments/{exp_id}/runs/{parent}/artifacts/best_so_far.png"
        artifacts = _dom(tmp_path, artifact_url)
        assert "best_so_far.png" in artifacts and "study_config.json" in artifacts
        shot = tmp_path / "ui.png"
        _chromium(tmp_path, artifact_url, f"--screenshot={shot}", "--window-size=1400,900")
        assert shot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n" and shot.stat().st_size > 20_000
        (REPO / "test-artifacts").mkdir(exist_ok=True)
        shutil.copyfile(shot, REPO / "test-artifacts" / "ui.png")
    finally:
        _stop_group(server)


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
