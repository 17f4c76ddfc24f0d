"""benchmarks/device.sh --rehearse runs every part of the device run end to end on the CPU and
writes device.json and device.log under $OUT."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "device.sh"
PARTS = ("out_of_core", "virtual_nodes", "train_throughput", "proxies_supernet", "sievo",
         "mobilenet")
SHIPPED_PARTS = PARTS[:5]   # the shipped H200 run predates the mobilenet part
OOC_MODELS = ("resnet50_like", "vgg16_like", "nb201_deep")


def cuda_only(reason: str) -> bool:
    return "CUDA" in reason or "GPU" in reason


def positive(value: Any) -> bool:
    return isinstance(value, (int, float)) and value > 0


@pytest.mark.slow
def test_device_rehearsal_measures_every_part(tmp_path: Path) -> None:
    out = tmp_path / "out"
    env = {**os.environ, "OUT": str(out), "PYTHON": sys.executable,
           "WHEELS": str(tmp_path / "no-wheels")}
    proc = subprocess.run(["bash", str(SCRIPT), "--rehearse"], env=env, cwd=tmp_path,
                          capture_output=True, text=True, timeout=170)
    log = out / "device.log"
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + (
        log.read_text()[-4000:] if log.exists() else "")
    assert log.exists() and "== mobilenet" in log.read_text()
    report = json.loads((out / "device.json").read_text())
    assert report["mode"] == "rehearse" and report["wall_seconds"] < report["total_box_seconds"]
    assert report["environment"]["modules"]["torch"] is True
    assert tuple(report["parts"]) == PARTS

    for name, part in report["parts"].items():
        assert part["status"] == "ok", (name, part.get("reason"), part.get("errors"))
        assert part["errors"] == [] and part["figures"], name
        env_info = part["environment"]
        assert env_info["torch"] and env_info["device_name"].startswith("cpu"), name
        assert part["sizes"] and part["goal"]["text"] and "target" in part["goal"], name
        # a rehearsal may leave out only what needs CUDA, and says why
        for step in part["skipped_steps"]:
            assert cuda_only(step["reason"]), (name, step)
        for key, figure in part["figures"].items():
            if isinstance(figure, dict) and "skipped" in figure:
                assert cuda_only(figure["skipped"]), (name, key, figure)

    ooc = report["parts"]["out_of_core"]["figures"]
    for model in OOC_MODELS:
        fig = ooc[model]
        for mode in ("plan", "swap", "recompute", "in-core@fit", "in-core@batch_uncapped"):
            assert positive(fig["modes"][mode]["images_per_s"]), (model, mode)
        assert fig["batch_fit_in_core"] < fig["batch"] and fig["budget_bytes"] < fig["incore_saved_bytes"]
        assert positive(fig["ratio_plan_vs_best_single"]) and fig["plan_budget_met"] is True, model
        assert fig["modes"]["plan"]["saved_peak_bytes"] <= fig["budget_bytes"], model
    assert ooc["vgg16_like"]["modes"]["plan"]["planner"] == "exact"
    assert ooc["resnet50_like"]["modes"]["plan"]["planner"] == "greedy"

    vn = report["parts"]["virtual_nodes"]["figures"]
    assert vn["nproc_1_vs_2"]["bitwise_equal"] is True and vn["nproc_1_vs_2"]["process_group"] == "gloo"
    assert vn["gpu_vs_cpu"]["within_tolerance"] is True and positive(vn["gpu_vs_cpu"]["tolerance"])
    assert all(positive(row["ratio"]) for row in vn["throughput"].values())

    tr = report["parts"]["train_throughput"]["figures"]
    assert positive(tr["estimator"]["images_per_s"])
    assert {"fp32", "amp_bf16", "channels_last", "amp_bf16_channels_last"} <= set(tr["plain_loop"])
    assert all(positive(v["images_per_s"]) for v in tr["plain_loop"].values())
    assert positive(tr["ratio_estimator_vs_plain_fp32"])

    px = report["parts"]["proxies_supernet"]["figures"]
    ens = px["rank_ensemble_selected"]
    assert ens["cells_scored"] == ens["cells_target"] and ens["failed_trials"] == 0
    assert positive(ens["cells_per_s"]) and positive(px["supernet_spos"]["steps_per_s"])

    sv = report["parts"]["sievo"]["figures"]["search"]
    assert sv["trials_completed"] == sv["trials_planned"] and sv["best_architecture"].startswith("dag:")

    mb = report["parts"]["mobilenet"]["figures"]
    assert mb["shared_vs_export"]["max_abs_logit_diff"] == 0.0   # bitwise on the CPU
    assert positive(mb["supernet_progressive"]["steps_per_s"])
    assert mb["search"]["trials_completed"] == mb["search"]["trials_planned"]
    assert mb["search"]["best_architecture"].startswith("mobilenet:")


def test_summary_reprints_the_shipped_gpu_run() -> None:
    """``device.py --summary`` reads a device.json back: every part of the shipped H200 run with
    its device, and the figures docs/benchmarks.md quotes."""
    shipped = ROOT / "benchmarks" / "results" / "device_h200" / "run1.json"
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device.py"), "--summary",
                           str(shipped)], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    for part in SHIPPED_PARTS:
        assert f"== {part}: ok on NVIDIA H200" in done.stdout
    for model in OOC_MODELS:
        assert f"  {model}: batch" in done.stdout
    assert "global batch 2048: native 60,295/s, V=8 35,099/s, ratio 0.582" in done.stdout


def test_summary_of_a_missing_file_is_one_line(tmp_path: Path) -> None:
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "device.py"), "--summary",
                           str(tmp_path / "nothing.json")], capture_output=True, text=True, timeout=60)
    assert done.returncode == 2
    assert "nothing.json: not a readable device.json" in done.stderr
    assert "Traceback" not in done.stderr
