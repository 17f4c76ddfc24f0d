"""Helpers and pytest fixtures for testing frugalnas plugins (loaded by pytest through the
``pytest11`` entry point, so plugin authors get them without any import)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest


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
        kwargs.setdefault("tracking_uri", f"sqlite:///{tmp_path / 'mlflow.db'}")
        kwargs.setdefault("study_name", f"test-{len(list(tmp_path.iterdir()))}")
        return frugalnas.create_study(**kwargs)

    yield make
