"""Hugging Face parents (frugalnas.compression.huggingface): tiny GPT-2 and Llama models created
locally with random weights, read into an ElasticGPT with the same logits, and sub-networks
written back that transformers loads, in a process without frugalnas, with the same logits."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
import torch

transformers = pytest.importorskip("transformers")

from frugalnas.compression.huggingface import (  # noqa: E402
    SUPPORTED, HFSource, check_writable, elastic_config, read_config, read_pretrained,
    write_pretrained)
from frugalnas.export.huggingface import quiet_transformers  # noqa: E402
from frugalnas.nn.transformer import BlockChoice, SubnetConfig  # noqa: E402
from frugalnas.ports.errors import ConfigError  # noqa: E402

VOCAB = 300
GPT2_BASE = dict(vocab_size=VOCAB, n_embd=64, n_layer=3, n_head=4, n_positions=32,
                 bos_token_id=None, eos_token_id=None)
LLAMA_BASE = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=3,
                  num_attention_heads=4, num_key_value_heads=2, intermediate_size=128,
                  max_position_embeddings=64, rope_theta=5000.0, bos_token_id=None,
                  eos_token_id=None)
PARENTS: dict[str, tuple[str, dict[str, Any]]] = {
    "gpt2-tied": ("GPT2LMHeadModel", {**GPT2_BASE, "activation_function": "gelu_new"}),
    "gpt2-untied": ("GPT2LMHeadModel", {**GPT2_BASE, "tie_word_embeddings": False,
                                        "activation_function": "relu", "n_inner": 96}),
    "llama-gqa": ("LlamaForCausalLM", {**LLAMA_BASE, "tie_word_embeddings": True}),
    "llama-head-dim": ("LlamaForCausalLM", {**LLAMA_BASE, "head_dim": 24,
                                            "attention_bias": True, "mlp_bias": True}),
}
# sub-network, and the layer order that picks which blocks it keeps
SUBNETS: dict[str, tuple[SubnetConfig, tuple[int, ...]]] = {
    "gpt2-tied": (SubnetConfig(48, 2, (BlockChoice(3, 100),) * 2), (2, 0, 1)),   # drops 1
    "gpt2-untied": (SubnetConfig(32, 3, (BlockChoice(2, 96),) * 3), (0, 1, 2)),
    "llama-gqa": (SubnetConfig(40, 2, (BlockChoice(2, 96),) * 2), (1, 2, 0)),    # drops 0
    "llama-head-dim": (SubnetConfig(64, 2, (BlockChoice(2, 50),) * 2), (0, 2, 1)),
}
TOKENIZER_FILES = ("tokenizer.json", "special_tokens_map.json")


def _tokenizer(folder: Path) -> None:
    """A byte-level BPE trained here (no download), and a special-tokens map."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel()
    tok.train_from_iterator(["to be or not to be, that is the question"] * 20,
                            trainers.BpeTrainer(vocab_size=VOCAB, show_progress=False))
    tok.save(str(folder / "tokenizer.json"))
    (folder / "special_tokens_map.json").write_text(json.dumps({}), encoding="utf-8")


def _create(folder: Path, architecture: str, options: dict[str, Any]) -> torch.Tensor:
    """Save a random model of ``architecture`` (every weight perturbed, so norms and biases are
    not their initial constants) in ``folder``; its logits on TOKENS."""
    cls = getattr(transformers, architecture)
    with torch.random.fork_rng(devices=[]), quiet_transformers():
        torch.manual_seed(len(str(folder)))
        model = cls(cls.config_class(**options)).eval()
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p) * 0.1)
            logits = model(TOKENS).logits
        model.save_pretrained(str(folder))
    _tokenizer(folder)
    return logits


TOKENS = torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(0))


@pytest.fixture(scope="module")
def parents(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, torch.Tensor]]:
    root = tmp_path_factory.mktemp("parents")
    return {name: (root / name, _create(root / name, arch, options))
            for name, (arch, options) in PARENTS.items()}


@pytest.mark.parametrize("name", list(PARENTS))
def test_read_pretrained_gives_the_same_logits(parents: dict[str, Any], name: str) -> None:
    folder, want = parents[name]
    model, source = read_pretrained(folder)
    assert source.architecture == PARENTS[name][0] and source.folder == folder
    assert model.config == elastic_config(source)
    assert (model.head.weight is model.tok.weight) == model.config.tie_weights
    with torch.no_grad():
        got = model(TOKENS)
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)


def test_elastic_config_of_each_family(parents: dict[str, Any]) -> None:
    gpt2 = elastic_config(read_config(parents["gpt2-tied"][0]))
    assert (gpt2.positions, gpt2.norm, gpt2.activation, gpt2.tie_weights) == \
        ("learned", "layernorm", "gelu_tanh", True)
    assert (gpt2.head_dim, gpt2.max_mlp_hidden, gpt2.context) == (16, 256, 32)
    assert elastic_config(read_config(parents["gpt2-untied"][0])).max_mlp_hidden == 96
    llama = elastic_config(read_config(parents["llama-head-dim"][0]))
    assert (llama.positions, llama.norm, llama.gated, llama.activation, llama.bias) == \
        ("rotary", "rmsnorm", True, "silu", True)
    assert (llama.head_dim, llama.kv_heads, llama.rope_base, llama.context) == \
        (24, 2, 5000.0, 64)


LOADER = """
import sys, torch
from transformers import AutoModelForCausalLM
torch.set_num_threads(1)   # sums in one order, as the logits it is compared with
tokens, out = torch.load(sys.argv[1]), {}
for folder in sys.argv[3:]:
    model = AutoModelForCausalLM.from_pretrained(folder).eval()
    with torch.no_grad():
        out[folder] = (type(model).__name__, model(tokens).logits)
assert not any(m.split(".")[0] == "frugalnas" for m in sys.modules)
torch.save(out, sys.argv[2])
"""


@pytest.fixture(scope="module")
def written(parents: dict[str, Any], tmp_path_factory: pytest.TempPathFactory
            ) -> dict[str, tuple[Path, torch.Tensor, tuple[str, torch.Tensor]]]:
    """Every sub-network written, its ElasticGPT logits, and what a fresh process without
    frugalnas loads from its folder."""
    root = tmp_path_factory.mktemp("written")
    expected = {}
    threads = torch.get_num_threads()
    torch.set_num_threads(1)   # one summation order on both sides of the comparison
    try:
        for name, (config, order) in SUBNETS.items():
            model, source = read_pretrained(parents[name][0])
            model.set_layer_order(order)
            folder = write_pretrained(model, config, source, root / name)
            with torch.no_grad():
                expected[name] = (folder, model(TOKENS, config))
    finally:
        torch.set_num_threads(threads)
    torch.save(TOKENS, root / "tokens.pt")
    subprocess.run([sys.executable, "-c", LOADER, str(root / "tokens.pt"), str(root / "out.pt"),
                    *(str(folder) for folder, _ in expected.values())],
                   check=True, cwd=root, capture_output=True, timeout=120)
    loaded = torch.load(root / "out.pt")
    return {name: (folder, want, loaded[str(folder)])
            for name, (folder, want) in expected.items()}


@pytest.mark.parametrize("name", list(SUBNETS))
def test_written_subnetwork_loads_without_frugalnas(written: dict[str, Any], name: str) -> None:
    folder, want, (loaded_class, got) = written[name]
    assert loaded_class == PARENTS[name][0]
    torch.testing.assert_close(got, want, atol=1e-5, rtol=0)
    assert (folder / "model.safetensors").is_file()


def test_written_config_has_the_new_sizes(parents: dict[str, Any],
                                          written: dict[str, Any]) -> None:
    gpt2 = json.loads((written["gpt2-tied"][0] / "config.json").read_text())
    assert (gpt2["n_embd"], gpt2["n_layer"], gpt2["n_head"], gpt2["n_inner"]) == (48, 2, 3, 100)
    assert gpt2["tie_word_embeddings"] is True and gpt2["n_positions"] == 32
    llama = json.loads((written["llama-gqa"][0] / "config.json").read_text())
    assert (llama["hidden_size"], llama["num_hidden_layers"], llama["num_attention_heads"],
            llama["num_key_value_heads"], llama["head_dim"], llama["intermediate_size"]) == \
        (40, 2, 2, 1, 16, 96)
    assert read_config(written["llama-head-dim"][0]).config["head_dim"] == 24
    for name in SUBNETS:
        for file in TOKENIZER_FILES:
            assert (written[name][0] / file).read_bytes() == \
                (parents[name][0] / file).read_bytes()


# -- refusals ---------------------------------------------------------------------------------
def _one_line(exc: pytest.ExceptionInfo[ConfigError], *names: str) -> str:
    message = str(exc.value)
    assert "\n" not in message
    for name in names:
        assert name in message, (name, message)
    return message


def _edited(parents: dict[str, Any], name: str, tmp_path: Path, **edits: Any) -> Path:
    config = json.loads((parents[name][0] / "config.json").read_text())
    config.update(edits)
    (tmp_path / "config.json").write_text(json.dumps(config))
    return tmp_path


@pytest.mark.parametrize("name, edits, named", [
    ("gpt2-tied", {"architectures": ["MistralForCausalLM"]}, "MistralForCausalLM"),
    ("gpt2-tied", {"architectures": ["MadeUpLM"]}, "MadeUpLM"),
    ("gpt2-tied", {"architectures": []}, "architectures"),
    ("gpt2-tied", {"scale_attn_by_inverse_layer_idx": True}, "scale_attn_by_inverse_layer_idx"),
    ("gpt2-tied", {"reorder_and_upcast_attn": True}, "reorder_and_upcast_attn"),
    ("gpt2-tied", {"activation_function": "quick_gelu"}, "quick_gelu"),
    ("llama-gqa", {"hidden_act": "gelu"}, "'gelu'"),
    ("llama-gqa", {"rope_parameters": {"rope_type": "linear", "factor": 2.0,
                                       "rope_theta": 1e4}}, "'linear'"),
    ("llama-gqa", {"rope_parameters": None, "rope_scaling": {"type": "dynamic", "factor": 2}},
     "'dynamic'"),
    ("llama-gqa", {"num_attention_heads": 4, "num_key_value_heads": 3},
     "num_key_value_heads 3"),
    ("llama-gqa", {"attention_bias": True, "mlp_bias": False}, "mlp_bias=False"),
])
def test_read_config_refuses(parents: dict[str, Any], tmp_path: Path, name: str,
                             edits: dict[str, Any], named: str) -> None:
    folder = _edited(parents, name, tmp_path, **edits)
    with pytest.raises(ConfigError) as exc:
        read_config(folder)
    message = _one_line(exc, named)
    if "architecture" in message:
        assert all(s in message for s in SUPPORTED)


def test_read_config_takes_older_rope_settings(parents: dict[str, Any], tmp_path: Path) -> None:
    folder = _edited(parents, "llama-gqa", tmp_path, rope_parameters=None, rope_theta=123.0,
                     rope_scaling=None)
    assert elastic_config(read_config(folder)).rope_base == 123.0


def test_missing_config_json(tmp_path: Path) -> None:
    with pytest.raises(ConfigError) as exc:
        read_config(tmp_path)
    _one_line(exc, "config.json", str(tmp_path), *SUPPORTED)
    with pytest.raises(ConfigError) as exc:
        read_pretrained(tmp_path / "absent")
    _one_line(exc, "config.json")


@pytest.fixture(scope="module")
def supernets(parents: dict[str, Any]) -> dict[str, Any]:
    return {name: read_pretrained(parents[name][0]) for name in ("gpt2-tied", "llama-gqa")}


def test_check_writable_refuses(supernets: dict[str, Any], tmp_path: Path) -> None:
    gpt2, gpt2_source = supernets["gpt2-tied"]
    llama, llama_source = supernets["llama-gqa"]
    uneven = SubnetConfig(64, 2, (BlockChoice(4, 100), BlockChoice(4, 80)))
    with pytest.raises(ConfigError) as exc:
        check_writable(gpt2_source, gpt2, uneven)
    _one_line(exc, "layer 1", "80", "100")
    with pytest.raises(ConfigError) as exc:
        check_writable(gpt2_source, gpt2, SubnetConfig(40, 2, (BlockChoice(3, 100),) * 2))
    _one_line(exc, "width 40", "3 x 16", "48")
    with pytest.raises(ConfigError) as exc:
        check_writable(llama_source, llama, SubnetConfig(40, 2, (BlockChoice(3, 96),) * 2))
    _one_line(exc, "heads 3", "group size 2")
    with pytest.raises(ConfigError) as exc:
        check_writable(gpt2_source, llama, SubnetConfig(64, 2, (BlockChoice(4, 96),) * 2))
    _one_line(exc, "positions", "'rotary'", "'learned'")
    other = HFSource(llama_source.folder, llama_source.architecture,
                     {**llama_source.config, "hidden_size": 128, "rms_norm_eps": 1e-3})
    with pytest.raises(ConfigError) as exc:   # a smaller network, but another norm epsilon
        check_writable(other, llama, SubnetConfig(64, 2, (BlockChoice(4, 96),) * 2))
    _one_line(exc, "norm_eps", "0.001")
    smaller = HFSource(llama_source.folder, llama_source.architecture,
                       {**llama_source.config, "hidden_size": 128})
    check_writable(smaller, llama, SubnetConfig(64, 2, (BlockChoice(4, 96),) * 2))
    with pytest.raises(ConfigError) as exc:     # refused before anything is written
        write_pretrained(gpt2, uneven, gpt2_source, tmp_path / "out")
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError) as exc:
        write_pretrained(gpt2, gpt2.largest(), gpt2_source, gpt2_source.folder)
    _one_line(exc, "parent's folder")
