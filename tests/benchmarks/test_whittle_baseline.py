"""The whittle baseline (``benchmarks/whittle_baseline.py``): the conversion of a frugalnas parent to
LitGPT's format and back, and (slow, with whittle's own environment) the whole run on a small
parent: LitGPT and whittle hold the parent exactly, whittle trains and searches, and the chosen
sub-network comes back as a frugalnas checkpoint that scores as whittle scored it."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

import whittle_baseline as baseline
from frugalnas.datasets.text import SAMPLE
from frugalnas.nn.transformer import ElasticGPT

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = ROOT / "benchmarks" / "whittle_baseline.py"
WHITTLE_PYTHON = Path(os.environ.get("WHITTLE_PYTHON", baseline.WHITTLE_PYTHON))
#: Three layers and three heads at least: whittle 0.6.0's random search starts from the middle of
#: each range, ``(upper - lower) // 2``, which is 0 (out of range) for a range 1..2; and MLP
#: units four times the width, as whittle's search space of MLP ratios 1 to 4 expects.
SMALL = dict(vocab_size=256, max_width=48, max_depth=3, max_heads=3, head_dim=16,
             max_mlp_hidden=192, context=128, positions="rotary")


def _parent(**changes: object) -> ElasticGPT:
    torch.manual_seed(0)
    model = ElasticGPT(**{**SMALL, **changes}).eval()
    with torch.no_grad():   # non-trivial norms, so that a swapped weight would show
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(0.1 * torch.randn_like(p))
    return model


def test_the_litgpt_state_dict_converts_back_to_the_same_network():
    parent = _parent()
    lit = baseline.litgpt_config(parent.config)
    assert lit["n_query_groups"] == lit["n_head"] == 3 and lit["rotary_percentage"] == 1.0
    assert not lit["parallel_residual"] and lit["padded_vocab_size"] == 256
    state = baseline.to_litgpt(parent)
    assert state["transformer.h.0.attn.qkv.weight"].shape == (3 * 48, 48)
    back = baseline.from_litgpt(lit, state, parent)
    tokens = torch.randint(0, 256, (2, 128))
    with torch.no_grad():
        assert torch.equal(back(tokens), parent(tokens))
    assert back.non_embedding_params() == parent.non_embedding_params()


def test_a_parent_litgpt_cannot_hold_is_refused_with_the_reason():
    with pytest.raises(SystemExit, match="positions 'learned'"):
        baseline.litgpt_config(_parent(positions="learned").config)
    with pytest.raises(SystemExit, match="gated MLP"):
        baseline.litgpt_config(_parent(gated=True, activation="silu").config)


@pytest.mark.slow
def test_whittle_compresses_a_small_parent_end_to_end(tmp_path: Path):
    if not WHITTLE_PYTHON.exists():
        pytest.skip(f"no whittle environment at {WHITTLE_PYTHON}: set it up as "
                    "benchmarks/whittle_baseline.py's docstring says (or set $WHITTLE_PYTHON)")
    checkpoints = baseline._checkpoints()
    parent = _parent()
    checkpoints.save_checkpoint(parent, tmp_path / "parent", {"text": {"tokenizer": "bytes"}})
    results = tmp_path / "whittle.json"
    run = subprocess.run(
        [sys.executable, str(SCRIPT), "--parent", str(tmp_path / "parent"), "--corpus",
         str(SAMPLE), "--work", str(tmp_path / "work"), "--results", str(results),
         "--whittle-python", str(WHITTLE_PYTHON), "--tokens", "4096", "--seeds", "0",
         "--budgets", "0.5", "--search-samples", "8", "--search-valid", "8"],
        cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stdout[-3000:] + run.stderr[-3000:]
    # the parent's logits in LitGPT and in whittle's super-network (checked by the script)
    assert run.stdout.count("logits within") == 2
    rows = json.loads(results.read_text())
    parent_params = parent.non_embedding_params()
    assert rows["parent_params"] == parent_params
    (row,) = rows["runs"]
    assert row["budget"] == 0.5 and row["seed"] == 0 and row["scored_by"] == "frugalnas"
    assert 0 < row["params"] <= 0.5 * parent_params and math.isfinite(row["loss"])
    assert f"whittle params=0.5 seed 0: {row['loss']:.4f} ({row['shape']}, " in run.stdout
    # the chosen sub-network is a frugalnas checkpoint that scores as reported
    child, _ = checkpoints.read_checkpoint(tmp_path / "work" / "seed0" / "params0.5" / "frugalnas")
    assert child.non_embedding_params() == row["params"]
    data = baseline.corpus(SAMPLE, 128)
    assert baseline.valid_loss(child, data) == pytest.approx(row["loss"], abs=1e-6)
