import json

import mlflow
import optuna
import pytest
from mlflow import MlflowClient

import frugalnas
from frugalnas.testing import fresh_mlflow_uri


def runs_of(uri, name):
    client = MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(name)
    return client, client.search_runs([exp.experiment_id], max_results=1000)


def test_parent_and_nested_trial_runs(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="tracked", plugin_options={"mlflow": {"tracking_uri": uri}}, seed=1)
    study.optimize(n_trials=4)
    assert study.plugin_state["mlflow"]["errors"] == []
    client, runs = runs_of(uri, "tracked")
    parents = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"]
    trials = [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"]
    assert len(parents) == 1 and len(trials) == 4
    parent = parents[0]
    assert parent.data.params["space"] == "nb201"
    assert "best_so_far.png" in [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert parent.data.metrics["best_value"] == pytest.approx(study.best_value)
    curve = client.get_metric_history(parent.info.run_id, "best_so_far")
    assert [m.step for m in sorted(curve, key=lambda m: m.step)] == [0, 1, 2, 3]
    values = [m.value for m in sorted(curve, key=lambda m: m.step)]
    assert values == sorted(values) and values[-1] == pytest.approx(study.best_value)
    assert client.get_experiment(parent.info.experiment_id).tags["mlflow.experimentKind"] == \
        "custom_model_development"
    for run in trials:
        assert run.data.tags["mlflow.parentRunId"] == parent.info.run_id
        assert run.data.tags["strategy"] == "random" and run.data.tags["state"] == "COMPLETE"
        assert run.info.status == "FINISHED"
        assert set(run.data.params) >= {"edge_1_0", "edge_3_2", "architecture"}
        assert {"value", "cost_seconds", "cost_epochs", "objective_value"} <= set(run.data.metrics)
        names = [a.path for a in client.list_artifacts(run.info.run_id)]
        assert "architecture.json" in names and "cell.png" in names
    by_number = {int(r.data.tags["frugalnas.trial_number"]): r for r in trials}
    for t in study.trials:
        run = by_number[t.number]
        assert run.data.params["architecture"] == str(t.architecture)
        assert run.data.metrics["value"] == pytest.approx(t.value)
        local = client.download_artifacts(run.info.run_id, "architecture.json")
        assert frugalnas.Architecture.from_dict(json.load(open(local))) == t.architecture


def test_failed_trial_run_is_marked_failed(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="fails", plugin_options={"mlflow": {"tracking_uri": uri}},
                                   estimator="train", dataset="digits",
                                   space_options={"N": 1, "C": 2},
                                   estimator_options={"epochs": 1, "lr": 1e30, "batch_size": 256})
    study.optimize(n_trials=1)
    _, runs = runs_of(uri, "fails")
    trial = [r for r in runs if r.data.tags.get("frugalnas.role") == "trial"][0]
    assert trial.info.status == "FAILED"
    assert "non-finite" in trial.data.tags["fail_reason"]


def test_resumed_study_reuses_parent_run(stores):
    storage, uri = stores
    frugalnas.create_study(storage=storage, study_name="again", plugin_options={"mlflow": {"tracking_uri": uri}}).optimize(2)
    frugalnas.load_study(study_name="again", storage=storage).optimize(2)
    _, runs = runs_of(uri, "again")
    assert sum(r.data.tags.get("frugalnas.role") == "study" for r in runs) == 1
    assert sum(r.data.tags.get("frugalnas.role") == "trial" for r in runs) == 4


def test_study_metrics_and_pareto_front(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="mo", plugin_options={"mlflow": {"tracking_uri": uri}},
                                   directions=["maximize", "maximize"],
                                   objectives=["value", "test_accuracy_cifar100"])
    study.optimize(n_trials=6)
    study.start()
    study.log_metrics({"surrogate_kendall_tau": 0.5}, step=3)
    study.finish()
    client, runs = runs_of(uri, "mo")
    parent = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"][0]
    names = [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert "pareto_front.png" in names and "pareto_front.json" in names
    hist = client.get_metric_history(parent.info.run_id, "surrogate_kendall_tau")
    assert [(m.step, m.value) for m in hist] == [(3, 0.5)]


def test_env_var_sets_the_default_store(tmp_path, monkeypatch):
    uri = fresh_mlflow_uri(tmp_path / "env.db")
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    frugalnas.create_study(study_name="from-env").optimize(1)
    _, runs = runs_of(uri, "from-env")
    assert len(runs) == 2


# -- the tracking URI is checked before the first trial ------------------------------------
def _run_cli(capsys, *args):
    from frugalnas.cli.main import main

    rc = main(["run", "--space", "nb201", "--estimator", "nb201-table", "--n-trials", "1",
               "-q", *args])
    return rc, capsys.readouterr().err.strip().splitlines()


@pytest.mark.parametrize("uri, fragment", [
    ("mlflow.db", "it has no scheme; valid URIs look like sqlite:///mlflow.db"),
    ("sqlite:///no/such/folder/mlflow.db", "the folder 'no/such/folder' of the sqlite store "
                                           "does not exist"),
    ("sqlite://", "a sqlite store is sqlite:///RELATIVE/PATH.db"),
])
def test_a_bad_tracking_uri_is_one_line_before_any_trial(tmp_path, capsys, uri, fragment):
    rc, err = _run_cli(capsys, "--tracking-uri", uri, "--storage",
                       f"sqlite:///{tmp_path / 'optuna.db'}", "--study-name", "bad")
    assert rc == 2 and len(err) == 1, err
    assert err[0].startswith("frugalnas: error: ") and repr(uri) in err[0] and fragment in err[0]
    assert not (tmp_path / "no").exists(), "the tracking store's folder was created"
    assert optuna.get_all_study_summaries(f"sqlite:///{tmp_path / 'optuna.db'}") == []


def test_an_unreachable_tracking_server_is_one_line_within_seconds(capsys):
    import socket
    import time

    from frugalnas.testing import fresh_mlflow_uri  # noqa: F401 (keeps imports warm)

    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))
        port = closed.getsockname()[1]
    start = time.monotonic()
    rc, err = _run_cli(capsys, "--tracking-uri", f"http://127.0.0.1:{port}/")
    assert rc == 2 and len(err) == 1, err
    assert f"MLflow tracking server http://127.0.0.1:{port}/ is not reachable" in err[0]
    assert time.monotonic() - start < 15

    # A server that accepts connections and never answers: the probe gives up after 5 s.
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(8)
        uri = f"http://127.0.0.1:{silent.getsockname()[1]}"
        start = time.monotonic()
        rc, err = _run_cli(capsys, "--tracking-uri", uri)
        took = time.monotonic() - start
    assert rc == 2 and len(err) == 1 and f"{uri} is not reachable within 5 s" in err[0], err
    assert took < 20, took


@pytest.mark.slow
@pytest.mark.parametrize("name", ["SIGTERM", "SIGINT"])
def test_ui_stops_its_server_quietly_on_sigterm_and_ctrl_c(tmp_path, name):
    import os
    import signal
    import subprocess
    import sys
    import time
    import urllib.request

    from ops_support.servers import free_port

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    port = free_port()
    err = open(tmp_path / "stderr.txt", "w+")
    proc = subprocess.Popen([sys.executable, "-m", "frugalnas.cli.main", "ui", "--tracking-uri",
                             uri, "--port", str(port)], stdout=subprocess.DEVNULL, stderr=err)
    end = time.monotonic() + 180
    while True:
        assert proc.poll() is None, f"frugalnas ui exited with {proc.returncode}"
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2):
                break
        except OSError:
            assert time.monotonic() < end, "the MLflow UI did not start"
            time.sleep(0.3)

    def server_pids():
        pids = []
        for pid in os.listdir("/proc"):
            if pid.isdigit() and int(pid) != proc.pid:
                try:
                    cmd = open(f"/proc/{pid}/cmdline", "rb").read().split(b"\0")
                except OSError:
                    continue
                if str(port).encode() in cmd or f"127.0.0.1:{port}".encode() in cmd:
                    pids.append(int(pid))
        return pids

    assert server_pids(), "no server process found"
    sig = getattr(signal, name)
    proc.send_signal(sig)  # Ctrl-C: SIGINT to frugalnas, the server has a session of its own
    assert proc.wait(timeout=60) in (0, 128 + sig)
    with pytest.raises(OSError):
        urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
    left = [p for p in server_pids() if not open(f"/proc/{p}/stat").read().split()[2] == "Z"]
    assert left == [], f"server processes left after {name}: {left}"
    err.seek(0)
    assert "Traceback" not in err.read()  # the server's children stopped quietly


def test_a_tracking_server_that_goes_away_never_holds_the_study_up(stores, monkeypatch):
    """The server answers the check, then fails every call (MLflow retries each for minutes):
    the trials run, the study's end gives up on MLflow after STALL_SECONDS without progress
    and says so; the storage keeps everything for the next reconciliation."""
    import http.server
    import threading
    import time

    from frugalnas.tracking.mlflow import tracker

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self):
            self.send_response(200 if self.path.endswith("/health") else 503)
            self.end_headers()
            self.wfile.write(b"OK")

        do_POST = do_GET

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    monkeypatch.setattr(tracker, "STALL_SECONDS", 2.0)
    storage, _ = stores
    try:
        start = time.monotonic()
        study = frugalnas.create_study(
            storage=storage, study_name="gone",
            plugin_options={"mlflow": {"tracking_uri": f"http://127.0.0.1:{server.server_port}"}})
        study.optimize(n_trials=3)
        assert time.monotonic() - start < 30
    finally:
        server.shutdown()
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    errors = study.plugin_state["mlflow"]["errors"]
    assert any("made no progress for 2 s" in e for e in errors), errors
    # the lost writes are the command's closing line (exit 2), never a silent success
    [failure] = study.plugin_errors
    assert failure.operational and "3 trial run(s) and the study's review not written" in \
        failure.error, failure.error


# -- review at a glance: leaderboard, plots with units, hypervolume, feasibility ----------------
def _parent(client, runs):
    return [r for r in runs if r.data.tags.get("frugalnas.role") == "study"][0]


def _artifact_text(client, run_id, path):
    with open(client.download_artifacts(run_id, path)) as fh:
        return fh.read()


def test_two_objective_study_logs_hypervolume_per_trial_and_a_leaderboard(stores):
    from frugalnas.multiobjective.hypervolume import hypervolume

    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="hv", seed=3,
                                   plugin_options={"mlflow": {"tracking_uri": uri}},
                                   objectives=["value", "latency_ms_pixel3"],
                                   directions=["maximize", "minimize"])
    study.optimize(n_trials=12)
    assert study.plugin_state["mlflow"]["errors"] == []
    client, runs = runs_of(uri, "hv")
    parent = _parent(client, runs)
    done = sorted(study.completed_trials(), key=lambda t: t.number)
    # the default reference: worst value per objective, 10% of the range further out
    ref = json.loads(parent.data.params["hypervolume_reference"])
    acc = [t.values[0] for t in done]
    lat = [t.values[1] for t in done]
    assert ref == pytest.approx([min(acc) - 0.1 * (max(acc) - min(acc)),
                                 max(lat) + 0.1 * (max(lat) - min(lat))])
    assert study.optuna_study.user_attrs["frugalnas_mlflow_hypervolume_reference"] == \
        pytest.approx(ref)
    hist = sorted(client.get_metric_history(parent.info.run_id, "hypervolume"),
                  key=lambda m: m.step)
    assert [m.step for m in hist] == [t.number for t in done]
    for m in hist:
        upto = [t.values for t in done if t.number <= m.step]
        assert m.value == pytest.approx(hypervolume(upto, ref, ["maximize", "minimize"]))
    assert [m.value for m in hist] == sorted(m.value for m in hist) and hist[-1].value > 0
    names = [a.path for a in client.list_artifacts(parent.info.run_id)]
    assert {"leaderboard.html", "pareto_front.png", "pareto_front.json"} <= set(names)
    html = _artifact_text(client, parent.info.run_id, "leaderboard.html")
    trial_runs = {int(r.data.tags["frugalnas.trial_number"]): r for r in runs
                  if r.data.tags.get("frugalnas.role") == "trial"}
    for t in done:  # every architecture whole, with a link to its run
        assert str(t.architecture) in html
        assert (f"http://127.0.0.1:5000/#/experiments/{parent.info.experiment_id}/runs/"
                f"{trial_runs[t.number].info.run_id}") in html
    assert "latency_ms_pixel3 \u2193" in html and html.count('class="pareto"') == \
        len(study.optuna_study.best_trials)
    front = json.loads(_artifact_text(client, parent.info.run_id, "pareto_front.json"))
    assert {f["number"] for f in front} == {t.number for t in study.optuna_study.best_trials}
    assert set(front[0]["values"]) == {"value", "latency_ms_pixel3"}


def test_hypervolume_reference_option_and_its_errors(stores):
    from frugalnas.ports.errors import ConfigError

    storage, uri = stores
    opts = {"tracking_uri": uri, "hypervolume_reference": [0, 100]}
    study = frugalnas.create_study(storage=storage, study_name="hvref", seed=1,
                                   plugin_options={"mlflow": opts},
                                   objectives=["value", "latency_ms_pixel3"],
                                   directions=["maximize", "minimize"])
    study.optimize(n_trials=3)  # fewer trials than the default needs: the option applies at once
    client, runs = runs_of(uri, "hvref")
    parent = _parent(client, runs)
    assert json.loads(parent.data.params["hypervolume_reference"]) == [0.0, 100.0]
    assert len(client.get_metric_history(parent.info.run_id, "hypervolume")) == 3
    for bad, words in ((["a", 1], "invalid mlflow hypervolume_reference ['a', 1]"),
                       ([1.0], "expected 2 finite number(s)"),
                       ([0, float("inf")], "invalid mlflow hypervolume_reference")):
        with pytest.raises(ConfigError, match=None) as info:
            frugalnas.create_study(objectives=["value", "latency_ms_pixel3"],
                                   directions=["maximize", "minimize"],
                                   plugin_options={"mlflow": {"tracking_uri": uri,
                                                              "hypervolume_reference": bad}})
        assert words in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="several objectives"):
        frugalnas.create_study(plugin_options={"mlflow": {"tracking_uri": uri,
                                                          "hypervolume_reference": [0]}})
    with pytest.raises(ConfigError, match="invalid mlflow ui_url 'localhost:5000'"):
        frugalnas.create_study(plugin_options={"mlflow": {"tracking_uri": uri,
                                                          "ui_url": "localhost:5000"}})


def test_single_objective_review_names_the_objective_and_keeps_architectures_whole(stores):
    storage, uri = stores
    study = frugalnas.create_study(storage=storage, study_name="one", seed=2,
                                   plugin_options={"mlflow": {"tracking_uri": uri}})
    study.optimize(n_trials=5)
    client, runs = runs_of(uri, "one")
    parent = _parent(client, runs)
    best = str(study.best_trial.architecture)
    assert parent.data.tags["best_architecture"] == best
    assert parent.data.tags["best_trial"] == str(study.best_trial.number)
    assert _artifact_text(client, parent.info.run_id, "best_architecture.txt") == best
    names = {a.path for a in client.list_artifacts(parent.info.run_id)}
    assert {"leaderboard.html", "best_so_far.png"} <= names
    html = _artifact_text(client, parent.info.run_id, "leaderboard.html")
    assert html.count("<tr") == 6 and best in html
    # the plot's y axis: the objective and what it stands for, with its unit
    from frugalnas.tracking.mlflow.drawing import objective_label

    assert objective_label("value", "valid_accuracy_cifar10") == \
        "value = valid_accuracy_cifar10 (%)"
    assert objective_label("latency_ms_pixel3") == "latency_ms_pixel3 (ms)"
    assert objective_label("params") == "params (count)"
    assert objective_label("accuracy") == "accuracy (%)"
    assert objective_label("proxy_synflow", units={"proxy_synflow": "score"}) == \
        "proxy_synflow (score)"


def test_long_architecture_strings_are_kept_whole():
    from frugalnas.tracking.mlflow.reconcile import MAX_PARAM_LENGTH, architecture_param

    short = "dag:" + "x" * 100
    assert architecture_param(short) == short
    long = "dag:" + "y" * (MAX_PARAM_LENGTH + 500)
    param = architecture_param(long)
    assert len(param) <= MAX_PARAM_LENGTH and param.endswith("(whole string in architecture.txt)")


def test_trials_of_a_constrained_study_are_tagged_feasible(stores):
    import inspect

    storage, uri = stores
    if "constraints" not in inspect.signature(frugalnas.create_study).parameters and \
            "constraints" not in frugalnas.StudyConfig.__dataclass_fields__:
        pytest.skip("this checkout has no constrained studies")
    study = frugalnas.create_study(storage=storage, study_name="feas", seed=4,
                                   plugin_options={"mlflow": {"tracking_uri": uri}},
                                   constraints={"latency_ms_pixel3": 10.0})
    study.optimize(n_trials=8)
    client, runs = runs_of(uri, "feas")
    trial_runs = {int(r.data.tags["frugalnas.trial_number"]): r for r in runs
                  if r.data.tags.get("frugalnas.role") == "trial"}
    for t in study.completed_trials():
        feasible = t.user_attrs["metrics"]["latency_ms_pixel3"] <= 10.0
        assert trial_runs[t.number].data.tags["feasible"] == ("true" if feasible else "false")
    parent = _parent(client, runs)
    html = _artifact_text(client, parent.info.run_id, "leaderboard.html")
    assert "<th>feasible</th>" in html


def test_run_ids_written_to_a_sql_store_are_time_ordered_uuids():
    """Ids of runs inserted in batches are version 7 UUIDs: unique, and later ones sort
    after earlier ones (MLflow's tables key rows by run id, and ids that grow keep a batch's
    inserts together)."""
    import time
    import uuid

    from frugalnas.tracking.mlflow.reconcile import time_ordered_id

    first = [time_ordered_id() for _ in range(1000)]
    time.sleep(0.002)
    later = time_ordered_id()
    assert len(set(first)) == 1000
    assert all(len(i) == 32 and uuid.UUID(i).version == 7 for i in first + [later])
    assert later > max(first)
