"""Installs examples/plugin_hello with pip and uses it like a third-party plugin."""

import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import frugalnas
from frugalnas.host.plugins import PluginHost

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "plugin_hello"


@pytest.fixture(scope="module")
def installed_example():
    pip = [sys.executable, "-m", "pip", "--disable-pip-version-check", "-q"]
    subprocess.run(pip + ["install", "--no-deps", "--no-build-isolation", str(EXAMPLE)],
                   check=True, capture_output=True, timeout=300)
    importlib.invalidate_caches()
    yield
    subprocess.run(pip + ["uninstall", "-y", "frugalnas-hello"], check=True, capture_output=True)


@pytest.mark.slow
def test_installed_plugin_is_listed_and_usable(installed_example, tmp_path, stores):
    out = subprocess.run([sys.executable, "-m", "frugalnas.cli.main", "plugins", "--json"],
                         capture_output=True, text=True, check=True, cwd=tmp_path).stdout
    data = json.loads(out)
    hello = [p for p in data["plugins"] if p["name"] == "hello"][0]
    assert hello["distribution"] == "frugalnas-hello" and hello["version"] == "0.1.0"
    assert hello["source"] == "entrypoint"
    assert "hello-mlp" in {c["name"] for c in data["components"]["search_spaces"]}
    assert "hello-logit-spread" in {c["name"] for c in data["components"]["proxies"]}
    climb = [c for c in data["components"]["strategies"] if c["name"] == "hello-climb"][0]
    assert climb["plugin"] == "hello"
    assert {"name": "explore", "required": False, "default": 0.1} in climb["options"]
    assert {"name": "n_init", "required": False, "default": 4} in climb["options"]
    # ArchSampler's common options reach the plugin's strategy without being restated
    assert {"name": "bridge_infeasible", "required": False, "default": True} in climb["options"]

    storage, uri = stores
    study = frugalnas.create_study(space="hello-mlp", estimator="hello-logit-spread",
                                   dataset="digits", storage=storage, study_name="hello",
                                   plugin_options={"mlflow": {"tracking_uri": uri}}, seed=0)
    study.optimize(n_trials=3)
    assert len(study.completed_trials()) == 3
    assert study.best_trial.architecture.space == "hello-mlp"

    # the plugin's own tests use the fixtures frugalnas exports to pytest
    proc = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider",
                           str(EXAMPLE / "tests")], capture_output=True, text=True, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr


def test_autoload_can_be_switched_off(installed_example, monkeypatch):
    monkeypatch.setenv("FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD", "1")
    assert not PluginHost().has_plugin("hello")
    assert PluginHost(["hello"]).has_plugin("hello")  # -p NAME still loads it
    monkeypatch.delenv("FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD")
    assert PluginHost().has_plugin("hello")
    assert not PluginHost(["no:hello"]).has_plugin("hello")
    monkeypatch.setenv("FRUGALNAS_PLUGINS_ALLOW", "someone-else")
    assert not PluginHost().has_plugin("hello")
    monkeypatch.setenv("FRUGALNAS_PLUGINS_ALLOW", "hello")
    assert PluginHost().has_plugin("hello")
