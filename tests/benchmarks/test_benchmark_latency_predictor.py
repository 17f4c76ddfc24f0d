"""benchmarks/latency_predictor.py runs end to end at a tiny size and prints, side by side,
both tables' figures and the measurement's own repeatability."""

import re
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "latency_predictor.py"


@pytest.mark.slow
def test_latency_benchmark_prints_predictors_beside_the_repeatability(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--held-out", "5", "--calibration", "3",
                          "--repeats", "5", "--rounds", "2"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "2 rounds of 5 calls; calibration 3 networks" in text
    rows = {}
    for line in text.splitlines():
        found = re.match(r"(.+?)\s+(\d+)%\s+(-?[\d.]+|nan)\s+([\d.]+)%$", line)
        if found:
            rows[found[1].strip()] = (int(found[2]), found[3], float(found[4]))
    assert set(rows) == {"kernel table vs run 1", "kernel table vs run 2",
                         "layer table vs run 1", "layer table vs run 2",
                         "run 2 vs run 1 (ceiling)", "one round, twice"}
    assert all(0 <= within <= 100 and error >= 0 for within, _, error in rows.values())
    assert re.search(r"kernel table: per-call overhead 0\.\d+ ms, intercept", text)
    assert "per measurement (2 rounds, interleaved)" in text


@pytest.mark.slow
def test_latency_benchmark_predicts_language_models_with_the_kernel_table_alone(tmp_path):
    out = subprocess.run([sys.executable, str(SCRIPT), "--space", "gpt", "--sequence-length",
                          "16", "--held-out", "4", "--calibration", "3", "--repeats", "5",
                          "--rounds", "1"],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    assert "space gpt, onnxruntime, batch 1, 1 thread, input (16,)" in out.stdout
    assert "kernel table vs run 1" in out.stdout and "layer table" not in out.stdout
