"""The compression race on a tiny parent: every method runs, the figures are written and
reprinted, and a second run finds every (budget, seed) in its results."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "compress.py"


@pytest.mark.slow
def test_a_tiny_race_runs_every_method_and_resumes(tmp_path: Path) -> None:
    args = [sys.executable, str(SCRIPT), "--parent", str(tmp_path / "parent"), "--out",
            str(tmp_path / "runs"), "--results", str(tmp_path / "results.json"),
            "--train-steps", "10", "--budgets", "0.5", "--latency-budgets", "0.6",
            "--seeds", "0", "--tokens", "2000", "--trials", "6"]
    first = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stdout[-3000:] + first.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    (row,) = results["runs"]
    assert {"frugalnas", "supernet0.5", "minitron", "scratch"} <= set(row)
    assert row["supernet0.5_tokens"] == 1000   # half the tokens train the supernet
    assert row["frugalnas_params"] <= 0.5 * results["parent_params"]
    assert row["supernet0.5_params"] <= 0.5 * results["parent_params"]
    assert row["minitron_params"] <= 0.5 * results["parent_params"]
    (latency,) = results["latency_runs"]
    assert latency["latency_ms"]["child"] > 0 and "meets_budget" in latency
    assert "params=0.5 (1 seeds): frugalnas" in first.stdout and "supernet0.5 " in first.stdout
    again = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert again.returncode == 0
    assert "params=0.5 seed 0" not in again.stdout        # nothing run again
    assert "params=0.5 (1 seeds): frugalnas" in again.stdout
