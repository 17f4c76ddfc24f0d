"""Helpers and pytest fixtures for testing frugalnas plugins (loaded by pytest through the
``pytest11`` entry point, so plugin authors get them without any import)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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


@pytest.fixture
def frugalnas_host(request: pytest.FixtureRequest):
    """A fresh :class:`frugalnas.PluginHost` with every installed plugin loaded. Parametrize
    indirectly with ``{"plugins": [...], "disable_plugins": [...]}`` to change what loads."""
    from frugalnas.core.plugins import PluginHost

    params: dict[str, Any] = getattr(request, "param", {}) or {}
    return PluginHost(params.get("plugins", ()), params.get("disable_plugins", ()))


@pytest.fixture
def frugalnas_study_factory(tmp_path) -> Iterator[Any]:
    """Call it like ``frugalnas.create_study`` to get a study whose optuna storage and MLflow
    store are sqlite files in a temporary folder."""
    import frugalnas

    def make(**kwargs: Any) -> frugalnas.Study:
        kwargs.setdefault("storage", f"sqlite:///{tmp_path / 'optuna.db'}")
        if "tracking_uri" not in kwargs and kwargs.get("tracking", True):
            kwargs["tracking_uri"] = fresh_mlflow_uri(tmp_path / "mlflow.db")
        kwargs.setdefault("study_name", f"test-{len(list(tmp_path.iterdir()))}")
        return frugalnas.create_study(**kwargs)

    yield make
