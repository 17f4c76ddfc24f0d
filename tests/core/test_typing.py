"""The ports, the host, the engine and the example plugin pass ``mypy --strict`` (the settings are
``[tool.mypy]`` in pyproject.toml)."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CHECKED = ("frugalnas/ports", "frugalnas/host", "frugalnas/engine", "frugalnas/distribution",
           "frugalnas/cli",
           "examples/plugin_hello/frugalnas_hello")


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("mypy") is None,
                    reason="mypy is not installed (it is in the dev extra: pip install -e '.[dev]')")
def test_core_and_the_example_plugin_pass_mypy_strict():
    # A first run without a .mypy_cache takes about a minute; later runs reuse it.
    proc = subprocess.run([sys.executable, "-m", "mypy", "--config-file", "pyproject.toml",
                           *CHECKED], cwd=REPO, capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, (f"mypy exited {proc.returncode}:\n{proc.stdout}"
                                  f"{proc.stderr}")
