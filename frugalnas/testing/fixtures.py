"""The pytest fixtures frugalnas exports (through the ``pytest11`` entry point, so a plugin's
test suite gets them without an import) and :func:`fresh_mlflow_uri`."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

import frugalnas
from frugalnas.host.plugins import PluginHost

_TEMPLATE: dict[str, Path] = {}


def fresh_mlflow_uri(path: str | Path) -> str:
    """A sqlite MLflow tracking URI at ``path``, copied from an empty store built once per
    process: creating MLflow's tables takes seconds, copying the file milliseconds."""
    import shutil
    import tempfile

    if "db" not in _TEMPLATE:
        from mlflow import MlflowClient

        db = Path(tempfile.mkdtemp(prefix="frugalnas-mlflow-")) / "template.db"
        MlflowClient(tracking_uri=f"sqlite:///{db}").search_experiments()
        _TEMPLATE["db"] = db
    path = Path(path)
    shutil.copyfile(_TEMPLATE["db"], path)
    return f"sqlite:///{path}"


def pytest_configure(config: pytest.Config) -> None:
    """Register the ``slow`` mark that :func:`frugalnas.testing.parametrize_with_checks` puts
    on slow components' cases."""
    config.addinivalue_line("markers", "slow: a slow test (frugalnas conformance cases of slow "
                            "components among them)")


@pytest.fixture
def frugalnas_host(request: pytest.FixtureRequest):
    """A fresh :class:`frugalnas.PluginHost` with every installed plugin loaded. Parametrize
    indirectly with ``{"plugins": [...], "disable_plugins": [...]}`` to change what loads."""
    params: dict[str, Any] = getattr(request, "param", {}) or {}
    return PluginHost(params.get("plugins", ()), params.get("disable_plugins", ()))


@pytest.fixture
def frugalnas_study_factory(tmp_path) -> Iterator[Any]:
    """Call it like ``frugalnas.create_study`` to get a study whose optuna storage and MLflow
    store are sqlite files in a temporary folder (unless the ``mlflow`` plugin is disabled, or
    its ``tracking_uri`` given in ``plugin_options``)."""
    def make(**kwargs: Any) -> frugalnas.Study:
        kwargs.setdefault("storage", f"sqlite:///{tmp_path / 'optuna.db'}")
        if "mlflow" not in kwargs.get("disable_plugins", ()):
            options = {k: dict(v) for k, v in kwargs.get("plugin_options", {}).items()}
            mlflow = options.setdefault("mlflow", {})
            if "tracking_uri" not in mlflow:
                mlflow["tracking_uri"] = fresh_mlflow_uri(tmp_path / "mlflow.db")
            kwargs["plugin_options"] = options
        kwargs.setdefault("study_name", f"test-{len(list(tmp_path.iterdir()))}")
        return frugalnas.create_study(**kwargs)

    yield make
