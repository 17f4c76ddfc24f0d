"""A Hugging Face model in, a Hugging Face model out: a Llama-family model and a GPT-2 created
locally with ``transformers`` (random weights, a BPE tokenizer trained here, a short training
on the Shakespeare sample), compressed by ``frugalnas compress``; the written folder loads in a
process without frugalnas and gives the logits of the child frugalnas distilled."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from frugalnas.compression.checkpoint import read_checkpoint  # noqa: E402
from frugalnas.compression.pipeline import compress  # noqa: E402
from frugalnas.datasets.text import SAMPLE, TextSource  # noqa: E402
from frugalnas.export.huggingface import quiet_transformers  # noqa: E402

CONTEXT, VOCAB = 32, 320
MODELS: dict[str, tuple[str, dict[str, Any]]] = {
    "llama": ("LlamaForCausalLM", dict(
        hidden_size=64, num_hidden_layers=3, num_attention_heads=4, num_key_value_heads=2,
        intermediate_size=128, max_position_embeddings=64, tie_word_embeddings=False)),
    "gpt2": ("GPT2LMHeadModel", dict(n_embd=64, n_layer=3, n_head=4, n_positions=64)),
}


def _trained(folder: Path, architecture: str, options: dict[str, Any]) -> Path:
    """A model of ``architecture`` with the sample's BPE tokenizer, trained 30 steps."""
    folder.mkdir(parents=True)
    data = TextSource.open(None, context=CONTEXT, tokenizer="bpe", vocab_size=VOCAB,
                           tokenizer_dir=str(folder))
    (folder / "frugalnas-text.json").unlink()   # as a user's folder: only tokenizer.json
    config_class = getattr(transformers, architecture.replace("ForCausalLM", "Config")
                           .replace("LMHeadModel", "Config"))
    torch.manual_seed(0)
    with quiet_transformers():
        model = getattr(transformers, architecture)(config_class(
            vocab_size=data.num_classes, bos_token_id=None, eos_token_id=None, **options))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    for _, (x, y) in zip(range(30), data.batches("train", 16, seed=0)):
        loss = torch.nn.functional.cross_entropy(model(x).logits.flatten(0, 1), y.flatten())
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    model.save_pretrained(str(folder))
    return folder


@pytest.fixture(scope="module", params=list(MODELS))
def hf_parent(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> tuple[str, Path]:
    architecture, options = MODELS[request.param]
    return request.param, _trained(tmp_path_factory.mktemp(request.param) / "model",
                                   architecture, options)


LOAD = """
import sys, torch
from transformers import AutoModelForCausalLM, AutoTokenizer
model = AutoModelForCausalLM.from_pretrained(sys.argv[1]).eval()
tokenizer = AutoTokenizer.from_pretrained(sys.argv[1])
ids = torch.tensor([tokenizer.encode("To be, or not to be, that is the question")])
with torch.no_grad():
    torch.save({"ids": ids, "logits": model(ids).logits}, sys.argv[2])
assert not any(name.startswith("frugalnas") for name in sys.modules)
"""


@pytest.mark.slow
def test_compress_a_hugging_face_model_into_one(hf_parent: tuple[str, Path],
                                                tmp_path: Path) -> None:
    name, parent = hf_parent
    out = tmp_path / "out"
    run = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "compress", str(parent), "--data",
         str(SAMPLE), "--budget", "params=0.5", "--out", str(out), "--trials", "4",
         "--tokens", str(6 * 16 * CONTEXT), "--context", str(CONTEXT), "--json"],
        capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stderr[-3000:]
    result = json.loads(run.stdout)
    assert result["child_params"] <= 0.5 * result["parent_params"]
    assert "compress: search:" in run.stderr and "compress: distillation:" in run.stderr
    config = json.loads((out / "model" / "config.json").read_text())
    assert config["architectures"] == [MODELS[name][0]]
    assert (out / "model" / "tokenizer.json").is_file()
    # a fresh process without frugalnas reads it and gives the distilled child's logits
    saved = tmp_path / "logits.pt"
    subprocess.run([sys.executable, "-c", LOAD, str(out / "model"), str(saved)], check=True,
                   timeout=300)
    got = torch.load(saved)
    child, _ = read_checkpoint(out / "child")
    with torch.no_grad():
        want = child(got["ids"])
    torch.testing.assert_close(got["logits"], want, atol=1e-4, rtol=1e-4)
    report = json.loads((out / "report.json").read_text())
    assert report["written_max_abs_diff"] < 1e-4
    if name == "gpt2":   # GPT-2 splits its width into its heads
        assert config["n_embd"] == config["n_head"] * 16


def test_a_model_of_another_architecture_is_refused_before_any_work(tmp_path: Path) -> None:
    folder = tmp_path / "model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": ["MambaForCausalLM"]}))
    run = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "compress", str(folder), "--data",
         str(SAMPLE), "--out", str(tmp_path / "out")], capture_output=True, text=True,
        timeout=120)
    assert run.returncode == 2
    assert "MambaForCausalLM" in run.stderr and "LlamaForCausalLM" in run.stderr
    assert run.stderr.strip().count("\n") == 0
    assert not (tmp_path / "out" / "ordered").exists()
