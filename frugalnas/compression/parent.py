"""The model a compression starts from: a frugalnas checkpoint folder or a Hugging Face
``save_pretrained`` folder, read into an :class:`~frugalnas.nn.transformer.ElasticGPT`, with
what is needed to read text as it was trained on (its tokenizer) and to write the child back
in the same format."""

from __future__ import annotations

import importlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch

from frugalnas.compression.checkpoint import CONFIG_FILE, is_checkpoint, read_checkpoint, \
    save_checkpoint
from frugalnas.compression.huggingface import HFSource, read_pretrained, write_pretrained
from frugalnas.export.formats import verify
from frugalnas.export.huggingface import quiet_transformers
from frugalnas.datasets.bpe import TOKENIZER_FILE, TOKENIZER_OPTIONS
from frugalnas.nn.transformer import ElasticGPT
from frugalnas.ports.errors import ConfigError

#: The longest blocks of text a compression reads unless told otherwise.
DEFAULT_CONTEXT = 256


@dataclass
class Parent:
    """A parent network, where it came from (``source``: ``format`` ``"frugalnas"`` or
    ``"huggingface"``, its folder and, for the latter, its architecture and config) and the
    options of the ``text`` dataset that reads text as it was trained on (``text``)."""

    model: ElasticGPT
    source: dict[str, Any]
    text: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def from_about(cls, model: ElasticGPT, about: dict[str, Any]) -> Parent:
        """The parent a checkpoint written with :meth:`about` describes."""
        return cls(model, dict(about["source"]), dict(about["text"]))

    def about(self, **extra: Any) -> dict[str, Any]:
        return {"source": self.source, "text": self.text, **extra}

    @property
    def tied_width(self) -> bool:
        """Whether the width must follow the heads (GPT-2 splits its width into heads)."""
        return self.source.get("architecture") == "GPT2LMHeadModel"

    def text_options(self) -> dict[str, Any]:
        """The ``text`` dataset's options (without the seed, which a study gives)."""
        return {k: v for k, v in self.text.items() if k != "seed"}

    def describe(self) -> str:
        c = self.model.config
        kind = self.source.get("architecture", "frugalnas checkpoint")
        return (f"{kind} ({c.max_depth} layers, width {c.max_width}, {c.max_heads} heads, "
                f"{c.max_mlp_hidden} MLP units, "
                f"{self.model.non_embedding_params():,} non-embedding parameters)")

    def write(self, child: ElasticGPT, folder: Path, tokens: torch.Tensor) -> float:
        """Write ``child`` in the parent's format, read it back as a user would (with
        ``transformers`` for a Hugging Face folder) and return the largest difference of its
        logits on ``tokens`` from the child's (an :class:`ExportError` beyond the exporters'
        tolerance)."""
        with torch.no_grad():
            want = child.eval()(tokens)
        if self.source["format"] == "huggingface":
            hf = HFSource(Path(self.source["folder"]), self.source["architecture"],
                          self.source["config"])
            write_pretrained(child, child.largest(), hf, folder)
            transformers: Any = importlib.import_module("transformers")
            with quiet_transformers(), torch.no_grad():
                loaded = transformers.AutoModelForCausalLM.from_pretrained(str(folder))
                got = loaded.eval()(tokens).logits
            return verify(f"Hugging Face ({self.source['architecture']})", got, want)
        save_checkpoint(child, folder, {"text": self.text})
        with torch.no_grad():
            got = read_checkpoint(folder)[0](tokens)
        return verify("frugalnas checkpoint", got, want)


def load_parent(model: str | Path, data: str | Path, context: int | None,
                seed: int) -> Parent:
    """Read the parent in ``model`` and settle how to read ``data`` for it; a one-line
    :class:`ConfigError` for a folder of neither format, or a model without a way to
    tokenize text as it was trained on."""
    folder = Path(model).expanduser()
    if is_checkpoint(folder):
        network, about = read_checkpoint(folder)
        source: dict[str, Any] = {"format": "frugalnas", "folder": str(folder)}
        text = dict(about.get("text") or {})
    elif (folder / "config.json").is_file():
        network, hf = read_pretrained(folder)
        source = {"format": "huggingface", "folder": str(folder),
                  "architecture": hf.architecture, "config": hf.config}
        text = {}
    else:
        raise ConfigError(f"model {str(folder)!r} is neither a frugalnas checkpoint folder "
                          f"({CONFIG_FILE}) nor a Hugging Face save_pretrained folder "
                          "(config.json)")
    text = {**text, **_tokens(folder, network, text), "path": str(data), "seed": seed,
            "context": min(network.context, context or text.get("context") or DEFAULT_CONTEXT)}
    return Parent(network.eval(), source, text)


def _tokens(folder: Path, network: ElasticGPT, known: dict[str, Any]) -> dict[str, Any]:
    """How the parent reads text: its own record, a tokenizer file beside it, or bytes for a
    vocabulary of 256."""
    if known.get("tokenizer"):
        return {}
    vocab = network.config.vocab_size
    if (folder / TOKENIZER_FILE).is_file():
        options = folder / TOKENIZER_OPTIONS
        recorded = json.loads(options.read_text()).get("vocab_size") if options.is_file() \
            else max(vocab, 256)
        return {"tokenizer": "bpe", "tokenizer_dir": str(folder), "vocab_size": recorded}
    if vocab == 256:
        return {"tokenizer": "bytes"}
    raise ConfigError(f"model {str(folder)!r} has a vocabulary of {vocab} tokens and no "
                      f"{TOKENIZER_FILE}: put the tokenizer it was trained with beside it "
                      "(a byte-level model has 256 tokens)")
