"""benchmarks/sievo.py runs end to end at a tiny size and prints every figure it promises."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

SCRIPT = Path(__file__).resolve().parents[2] / "benchmarks" / "sievo.py"
TINY = ["--population", "3", "--offspring", "2", "--generations", "1", "--batches", "4", "--warmup", "0",
        "--rea-epochs", "0.05", "--retrain-epochs", "0.05", "--tau-epochs", "0.05",
        "--tau-candidates", "4", "--tau-seeds", "3", "--search-seeds", "2",
        "--retrain-seeds", "1", "--jobs", "2", "--valid-limit", "40", "--baselines", "rea"]


@pytest.mark.slow
def test_sievo_benchmark_runs_every_part_and_caches_the_reference(tmp_path):
    cache = tmp_path / "ref.json"
    out = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--tau-cache", str(cache)],
                         capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    text = out.stdout
    assert "over 2 search seeds, REA train-each: compute ratio rea/si" in text
    assert "inherited (search store)" in text and "inherited (untrained store)" in text
    assert "one seed against the mean of the other 2" in text
    assert "for a perfect estimator" in text and "for one more stand-alone training" in text
    assert "ablation: attention off" in text
    entries = json.loads(cache.read_text())
    # 4 tau candidates x 3 seeds, plus the retrained winners; and one REA search per seed
    assert sum(k.startswith("digits|0.05|") for k in entries) >= 12
    rea = [v for k, v in entries.items() if k.startswith("rea|digits|")]
    assert len(rea) == 2 and all(v[0].startswith("dag:") and v[2] > 0 for v in rea)

    # a second run finds the reference in the cache and trains nothing for it
    again = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--tau-cache", str(cache),
                            "--parts", "reference"], capture_output=True, text=True, timeout=600,
                           cwd=tmp_path)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "stand-alone training:" not in again.stdout
    assert "seed-to-seed tau of the reference" in again.stdout

    # the search part reuses the cached REA searches (and their retrained winners), and sets
    # SPOS and DARTS beside them
    search = subprocess.run([sys.executable, str(SCRIPT), *TINY, "--tau-cache", str(cache),
                             "--parts", "search", "--baselines", "rea,spos,darts",
                             "--search-seeds", "1", "--result", "last-pool",
                             "--final-proxies", "synflow,params"],
                            capture_output=True, text=True, timeout=600, cwd=tmp_path)
    assert search.returncode == 0, search.stderr[-3000:]
    assert search.stdout.count("from " + str(cache) + " (measured earlier)") == 1
    for name in ("REA train-each: compute ratio rea/si", "SPOS + REA: compute ratio spos/si",
                 "DARTS: compute ratio darts/si"):
        assert name in search.stdout
    assert "seed 0: si-evolution's result chosen from its last pool of 5 by inherited " \
        "accuracy and synflow,params" in search.stdout
    assert "seed 0 darts best: dag:" in search.stdout and "seed 0 spos best: dag:" in search.stdout


@pytest.mark.slow
def test_device_script_rehearses_every_step_at_a_tiny_size(tmp_path):
    """benchmarks/sievo_device.sh, meant for a GPU session, runs through on CPU when
    SIEVO_EXTRA shrinks every call: reference, the tau run of one warm-up (SIEVO_WARMUPS; the
    device run does three) and the two searches of one seed (SIEVO_SEARCH_SEEDS; the device
    run does four seeds the same way)."""
    script = SCRIPT.parent / "sievo_device.sh"
    extra = " ".join(["--dataset", "digits", *TINY, "--warmup", "2", "--jobs", "1",
                      "--tau-seeds", "2", "--retrain-seeds", "1", "--search-seeds", "1"])
    out = subprocess.run(["bash", str(script), str(tmp_path / "dev")], capture_output=True,
                         text=True, timeout=900, env={**os.environ, "SIEVO_EXTRA": extra, "JOBS": "1",
                                                      "SIEVO_SEARCH_SEEDS": "0",
                                                      "SIEVO_WARMUPS": "200"})
    assert out.returncode == 0, (out.stdout[-2000:], out.stderr[-3000:])
    dev = tmp_path / "dev"
    assert "seed-to-seed tau of the reference" in (dev / "reference.log").read_text()
    assert "inherited (search store)" in (dev / "tau_warmup200.log").read_text()
    assert not (dev / "tau_warmup0.log").exists()
    for seed in (0,):
        for name in (f"search{seed}", f"search_large{seed}"):
            assert "compute ratio rea/si" in (dev / f"{name}.log").read_text()
            assert any(k.startswith("rea|digits|") for k in json.loads((dev / f"{name}.json").read_text()))
