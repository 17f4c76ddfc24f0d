"""benchmarks/ground_truth.py and benchmarks/weight_sharing_ranking.py on the mobilenet space:
real stand-alone trainings (a few steps each) and a real supernet, in temporary caches."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

REPO = Path(__file__).resolve().parents[2]


def run(script: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "benchmarks" / script), *args],
                          capture_output=True, text=True, timeout=300, cwd=REPO)


@pytest.mark.slow
def test_ground_truth_trains_mobilenet_networks_and_resumes(tmp_path):
    cache = tmp_path / "gt.jsonl"
    args = ("--name", "mobilenet-tiny", "--space", "mobilenet", "--width", "0.35", "--resize",
            "0", "--cells", "2", "--seeds", "0", "--epochs", "0.05", "--workers", "1",
            "--cache", str(cache))
    first = run("ground_truth.py", *args)
    assert first.returncode == 0, first.stderr
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    assert len(rows) == 2 and len({r["arch"] for r in rows}) == 2
    assert all(r["arch"].startswith("mobilenet:") and r["seed"] == 0 for r in rows)
    assert all(0.0 <= r["valid"] <= 100.0 and 0.0 <= r["test"] <= 100.0 for r in rows)
    assert "2 to train" in first.stdout
    # Resumed: nothing is trained again and the cache is unchanged.
    again = run("ground_truth.py", *args)
    assert again.returncode == 0, again.stderr
    assert "2 done, 0 to train" in again.stdout
    assert [json.loads(line) for line in cache.read_text().splitlines()] == rows


@pytest.mark.parametrize("option, value, message", [
    ("--width", "9", "invalid width_mult 9.0; valid range: [0.05, 4.0]"),
    ("--dataset-options", '{"clutter": -2}', "invalid clutter -2 for dataset 'cluttered-mnist'; "
                                             "expected an integer >= 0"),
    ("--dataset-options", '{"clutters": 2}', "unknown option 'clutters' for dataset "
                                             "'cluttered-mnist'; valid options: clutter, "),
    ("--resolutions", "4,16", "invalid resolutions [4, 16]; valid: a list of input sides of "
                              "at least 8 pixels, e.g. [16, 20, 24, 28]")])
def test_ground_truth_refuses_a_bad_space_option_without_writing(tmp_path, option, value,
                                                                 message):
    cache = tmp_path / "sub" / "gt.jsonl"
    out = run("ground_truth.py", "--name", "x", "--space", "mobilenet", "--dataset",
              "cluttered-mnist", option, value, "--cache", str(cache))
    assert out.returncode == 2
    assert len(out.stderr.strip().splitlines()) == 1
    assert out.stderr.startswith(f"frugalnas: error: {message}")
    assert not cache.parent.exists()


@pytest.mark.slow
def test_weight_sharing_ranking_scores_every_mobilenet_variant(tmp_path):
    # A partial reference of three networks and two seeds (values as ground_truth.py writes).
    archs = ["mobilenet:k3e3|k3e3|k3e3|k3e3|k3e3|k3e3",
             "mobilenet:k5e4s,k3e6|k7e6|k3e3,k5e4|k3e3|k7e6s|k3e4",
             "mobilenet:k7e6s,k7e6s|k7e6s,k7e6s,k7e6s|k7e6s|k7e6s|k7e6s|k7e6s"]
    partial = tmp_path / "mobilenet-tiny.jsonl"
    partial.write_text("".join(json.dumps({"arch": a, "seed": s, "valid": 90.0 + i + s,
                                           "test": 89.0 + i, "seconds": 1.0}) + "\n"
                               for i, a in enumerate(archs) for s in (0, 1)))
    scores = tmp_path / "scores.json"
    out = run("weight_sharing_ranking.py", "--space", "mobilenet", "--partial", str(partial),
              "--epochs", "0", "--proxies", "", "--bn-batches", "1", "--threads", "1",
              "--cache", str(scores))
    assert out.returncode == 0, out.stderr
    assert "3 cells x 2 seeds; seed-vs-seed tau 1.000" in out.stdout
    for variant in ("per-operation", "progressive-shrinking", "sandwich",
                    "progressive-shrinking sandwich"):
        assert f"  {variant} " in out.stdout
    entries = json.loads(scores.read_text())
    assert len(entries) == 4
    assert all(len(e["scores"]) == 3 and all(0.0 <= v <= 100.0 for v in e["scores"])
               for e in entries.values())
    assert all('{"width_mult": 0.35}' in key for key in entries)


@pytest.mark.slow  # the script imports torch and scipy before it parses arguments
def test_weight_sharing_ranking_refuses_a_variant_the_space_lacks(tmp_path):
    out = run("weight_sharing_ranking.py", "--space", "mobilenet", "--variants", "few-shot K=2",
              "--partial", str(tmp_path / "none.jsonl"), "--cache", str(tmp_path / "s.json"))
    assert out.returncode == 2
    assert "unknown --variants ['few-shot K=2'] for space mobilenet; valid: per-operation, " \
           "progressive-shrinking" in out.stderr
    assert not (tmp_path / "s.json").exists()


@pytest.mark.slow  # imports torch, optuna and scipy
def test_the_shipped_mobilenet_ground_truth_loads_with_its_command_and_ceiling():
    from frugalnas.spaces.mobilenet.space import MobileNetSpace
    from frugalnas_lab.ground_truth import load_ground_truth, shipped_names

    assert "mobilenet-mnist5k" in shipped_names()
    gt = load_ground_truth("mobilenet-mnist5k")
    assert gt.space == "mobilenet" and gt.space_options == {"width_mult": 0.35}
    assert gt.seeds == [0, 1, 2, 3] and gt.valid.shape == (50, 4) and gt.test.shape == (50, 4)
    assert gt.command.startswith("python benchmarks/ground_truth.py --name mobilenet-mnist5k "
                                 "--space mobilenet --width 0.35 --resize 0")
    space = MobileNetSpace(width_mult=0.35)
    assert len({str(space.parse(a)) for a in gt.architectures}) == 50
    assert 80.0 < gt.mean_valid.mean() < 100.0
    assert 0.2 < gt.tau_ceiling() < 0.6


@pytest.mark.slow
def test_a_reference_and_its_supernet_ranking_on_another_dataset(tmp_path):
    cache, options = tmp_path / "gt.jsonl", '{"size": 28, "clutter": 2}'
    out = run("ground_truth.py", "--name", "clut", "--space", "mobilenet", "--dataset",
              "cluttered-mnist", "--dataset-options", options, "--resize", "0", "--cells", "3",
              "--seeds", "0,1", "--epochs", "0.02", "--workers", "1", "--cache", str(cache))
    assert out.returncode == 0, out.stderr
    rows = [json.loads(line) for line in cache.read_text().splitlines()]
    assert len(rows) == 6 and all(0.0 <= r["valid"] <= 100.0 for r in rows)
    assert "cells with every seed: 3" in out.stdout
    scores = tmp_path / "scores.json"
    ranked = run("weight_sharing_ranking.py", "--space", "mobilenet", "--partial", str(cache),
                 "--dataset", "cluttered-mnist", "--dataset-options", options, "--epochs", "0",
                 "--variants", "per-operation", "--proxies", "", "--bn-batches", "1",
                 "--threads", "1", "--cache", str(scores))
    assert ranked.returncode == 0, ranked.stderr
    assert "3 cells x 2 seeds" in ranked.stdout and "  per-operation " in ranked.stdout
    (key,) = json.loads(scores.read_text())
    assert 'data cluttered-mnist {"clutter": 2, "size": 28}' in key

    # A reference file records its space, data and input side: given it alone, the ranking
    # trains and scores on the same (the scores of the run above are found under their key).
    from frugalnas_lab.ground_truth import GroundTruth

    archs = list(dict.fromkeys(r["arch"] for r in rows))  # the order the partial file has
    valid = np.array([[next(r["valid"] for r in rows if r["arch"] == a and r["seed"] == s)
                       for s in (0, 1)] for a in archs])
    reference = tmp_path / "clut.json"
    reference.write_text(json.dumps(GroundTruth(
        "clut", "mobilenet", {"width_mult": 0.35}, "cluttered-mnist", 0.02, [0, 1], archs,
        valid, valid, dataset_options=json.loads(options)).to_json()))
    again = run("weight_sharing_ranking.py", "--ground-truth", str(reference), "--epochs", "0",
                "--variants", "per-operation", "--proxies", "", "--bn-batches", "1",
                "--threads", "1", "--cache", str(scores))
    assert again.returncode == 0, again.stderr
    assert "ground truth clut: 3 cells x 2 seeds" in again.stdout
    assert "per-operation              tau" in again.stdout and "(cached;" in again.stdout
    assert list(json.loads(scores.read_text())) == [key]
    wrong = run("weight_sharing_ranking.py", "--ground-truth", str(reference), "--space",
                "nb201", "--cache", str(scores))
    assert wrong.returncode == 2
    assert "--space nb201 does not match the reference 'clut', whose networks are of space " \
           "'mobilenet'" in wrong.stderr


@pytest.mark.slow  # imports torch, optuna and scipy
def test_the_shipped_cluttered_reference_is_harder_and_spreads_the_networks():
    from frugalnas_lab.ground_truth import load_ground_truth

    gt = load_ground_truth("mobilenet-cluttered")
    assert (gt.dataset, gt.dataset_options) == ("cluttered-mnist", {"size": 28, "clutter": 6})
    assert gt.seeds == [0, 1, 2, 3] and gt.valid.shape == (50, 4)
    assert "--dataset cluttered-mnist --dataset-options" in gt.command
    plain = load_ground_truth("mobilenet-mnist5k")
    assert gt.architectures == plain.architectures  # the same 50 networks
    assert gt.mean_valid.mean() < plain.mean_valid.mean() - 10
    assert np.ptp(gt.mean_valid) > 3 * np.ptp(plain.mean_valid)


@pytest.mark.slow  # imports torch, optuna and scipy
def test_the_shipped_reference_with_a_searched_resolution_ranks_resolutions_apart():
    from frugalnas.spaces.mobilenet.space import MobileNetSpace
    from frugalnas_lab.ground_truth import load_ground_truth

    gt = load_ground_truth("mobilenet-cluttered-res")
    assert gt.space_options == {"width_mult": 0.35, "resolutions": [12, 16, 20, 24, 28]}
    assert (gt.dataset, gt.dataset_options) == ("cluttered-mnist", {"size": 28, "clutter": 6})
    assert len(gt.seeds) >= 2 and gt.valid.shape == (50, len(gt.seeds))
    assert "--resolutions 12,16,20,24,28" in gt.command
    space = MobileNetSpace(**gt.space_options)
    sides = np.array([space.resolution_of(space.parse(a)) for a in gt.architectures])
    assert set(sides) == {12, 16, 20, 24, 28}
    # The input side is what spreads these networks: 12x12 inputs lose most of a digit.
    assert gt.mean_valid[sides == 12].mean() < gt.mean_valid[sides >= 20].mean() - 20
    assert gt.tau_ceiling() > 0.5
