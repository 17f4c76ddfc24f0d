"""benchmarks/vit_proxies.py runs end to end at a tiny size, scores every image proxy on
vision transformers or records why it is refused, and reprints from its results."""

import json
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "vit_proxies.py"


@pytest.mark.slow
def test_the_vit_proxy_benchmark_scores_or_names_each_refusal_and_reprints(tmp_path):
    args = [sys.executable, str(SCRIPT), "--networks", "3", "--epochs", "1", "--results",
            str(tmp_path / "results.json")]
    first = subprocess.run(args, capture_output=True, text=True, timeout=900)
    assert first.returncode == 0, first.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert "synflow" in results["scores"] and len(results["scores"]["synflow"]) == 3
    assert "ReLU activation patterns" in results["failed"]["naswot"]
    assert "3 vit networks on digits, 1 epochs" in first.stdout
    again = subprocess.run(args, capture_output=True, text=True, timeout=900)
    summary = first.stdout[first.stdout.index("3 vit networks"):]
    assert again.returncode == 0 and again.stdout == summary   # reprinted, nothing measured
