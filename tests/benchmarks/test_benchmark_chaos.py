"""The chaos benchmark runs a small round on sqlite, under a hog, and finds it exact."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "chaos.py"


@pytest.mark.slow
def test_a_small_sqlite_round_under_a_hog_is_exact():
    proc = subprocess.run([sys.executable, str(SCRIPT), "--sqlite-rounds", "1",
                           "--postgres-rounds", "0", "--workers", "3", "--trials", "6",
                           "--hog", "1"], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    assert "sqlite round  1/1: exact" in proc.stdout
    assert proc.stdout.rstrip().endswith("sqlite: exact 1/1")

