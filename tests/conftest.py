import os
from pathlib import Path

import optuna
import pytest

from frugalnas.testing import fresh_mlflow_uri

REPO = Path(__file__).resolve().parents[1]
SHARED_CSV = REPO.parent / "shared" / "data" / "nats_bench.csv"

os.environ.setdefault("FRUGALNAS_PROGRESS", "0")
optuna.logging.set_verbosity(optuna.logging.WARNING)


@pytest.fixture(autouse=True)
def _isolated_mlflow(tmp_path, monkeypatch):
    """Any study that tracks without an explicit URI writes to this test's own store."""
    monkeypatch.setenv("MLFLOW_TRACKING_URI", fresh_mlflow_uri(tmp_path / "default-mlflow.db"))
    monkeypatch.chdir(tmp_path)


@pytest.fixture
def stores(tmp_path):
    """(optuna storage URL, MLflow tracking URI), both sqlite files in tmp_path."""
    return f"sqlite:///{tmp_path / 'optuna.db'}", fresh_mlflow_uri(tmp_path / "mlflow.db")
