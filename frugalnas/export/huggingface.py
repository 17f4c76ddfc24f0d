"""The ``huggingface`` export format: a language model of the ``gpt`` space as a Hugging Face
``transformers`` GPT-2 folder (``save_pretrained`` layout: ``config.json``,
``model.safetensors``, ``generation_config.json``; with the dataset's tokenizer), loaded back
with ``AutoModelForCausalLM.from_pretrained`` and checked against the trained module.

A :class:`~frugalnas.nn.transformer.DenseGPT` is a GPT-2 when it has learned positions,
LayerNorm, causal multi-head attention (as many key/value heads as query heads) whose heads
fill the width (``heads x head_dim == width``), and every layer alike (the same heads and MLP
units); :func:`gpt2_shape` refuses anything else in one line naming what differs, before any
training (:func:`check_huggingface`). The weights map one to one
(:mod:`frugalnas.export.hf_names`).

The tokens: a BPE tokenizer of the ``text`` dataset is copied in as ``tokenizer.json`` (with
``tokenizer_config.json``, so that ``AutoTokenizer.from_pretrained`` reads it); for byte
tokens ``README.md`` says that a token is a UTF-8 byte.
"""

from __future__ import annotations

import contextlib
import importlib.util
import json
import shutil
import time
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch import nn

from frugalnas.export.hf_names import GPT2, to_hf_state
from frugalnas.nn.transformer import DenseGPT
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.trial_architecture import architecture_of
from frugalnas.ports.version import __version__
from frugalnas.export.formats import FormatResult, quiet, verify
from frugalnas.export.options import ExportError

#: The folder the format writes, inside the export's folder.
FOLDER = "huggingface"
#: How to get the package the format needs.
INSTALL = 'pip install "frugalnas[hf]"'
#: DenseMLP's activation -> GPT-2's ``activation_function`` (``gelu_new`` is the tanh
#: approximation, GPT-2's own).
ACTIVATIONS = {"gelu": "gelu", "gelu_tanh": "gelu_new", "relu": "relu", "silu": "silu"}
#: The task a GPT-2 folder serves.
LANGUAGE_MODELLING = "language-modelling"


@dataclass(frozen=True)
class GPT2Shape:
    """The GPT-2 configuration of a :class:`~frugalnas.nn.transformer.DenseGPT`."""

    vocab_size: int
    n_positions: int
    n_embd: int
    n_layer: int
    n_head: int
    n_inner: int
    activation_function: str
    layer_norm_epsilon: float

    def config(self) -> Any:
        """The ``transformers.GPT2Config``: no dropout, untied head, no special tokens."""
        transformers: Any = importlib.import_module("transformers")
        return transformers.GPT2Config(
            **asdict(self), resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0,
            summary_first_dropout=0.0, tie_word_embeddings=False, scale_attn_weights=True,
            scale_attn_by_inverse_layer_idx=False, reorder_and_upcast_attn=False,
            bos_token_id=None, eos_token_id=None, pad_token_id=None,
            architectures=["GPT2LMHeadModel"])


def require_transformers(purpose: str = "the huggingface export format") -> None:
    """A one-line :class:`ConfigError` when the ``transformers`` package that ``purpose``
    needs is missing."""
    if importlib.util.find_spec("transformers") is None:
        raise ConfigError(f"{purpose} needs the transformers package, which is not "
                          f"installed; {INSTALL}")


def check_task(task_name: str, dataset: str) -> None:
    """Refuses the format for data of another task than language modelling."""
    if task_name != LANGUAGE_MODELLING:
        raise ConfigError(f"the huggingface export format writes GPT-2 language models; "
                          f"dataset {dataset!r} is {task_name} data (use the formats "
                          "torchscript, export or onnx)")


def _count(n: int, what: str) -> str:
    return f"{n} {what}{'' if n == 1 else 's'}"


def _heads(attn: Any) -> tuple[int, int]:
    d = int(attn.head_dim)
    return int(attn.q.out_features) // d, int(attn.k.out_features) // d


def _layer_norm(norm: nn.Module, where: str) -> float:
    if not isinstance(norm, nn.LayerNorm):
        raise ConfigError(f"{where} is {type(norm).__name__}: a GPT-2 folder needs LayerNorm "
                          "(gpt space option norm='layernorm')")
    if norm.weight is None or len(norm.normalized_shape) != 1:
        raise ConfigError(f"{where} is a LayerNorm without a per-feature scale: a GPT-2 folder "
                          "needs one")
    return float(norm.eps)


def gpt2_shape(model: nn.Module) -> GPT2Shape:
    """The GPT-2 shape of ``model``, or a one-line :class:`ConfigError` naming what a GPT-2
    cannot hold (only the module's types and shapes are read: a network on the meta device
    will do)."""
    if not isinstance(model, DenseGPT):
        raise ConfigError(f"the huggingface export format writes GPT-2 folders of the gpt "
                          f"space's networks (DenseGPT); got a {type(model).__name__}")
    blocks = list(model.blocks)
    if not blocks:
        raise ConfigError("the network has no layer: a GPT-2 folder needs at least one")
    if model.pos is None:
        raise ConfigError("the network has rotary positions: a GPT-2 folder needs learned "
                          "positions (gpt space option positions='learned')")
    width = int(model.tok.embedding_dim)
    vocab = int(model.tok.num_embeddings)
    head = model.head
    if head.bias is not None or tuple(head.weight.shape) != (vocab, width):
        raise ConfigError(f"the language-model head is {tuple(head.weight.shape)}"
                          f"{' with a bias' if head.bias is not None else ''}: a GPT-2 folder "
                          f"needs a ({vocab}, {width}) head without bias")
    eps = _layer_norm(model.norm, "the final norm")
    first = blocks[0]
    heads0, _ = _heads(first.attn)
    hidden0 = int(first.mlp.fc.out_features)
    activation0 = str(first.mlp.activation)
    for i, block in enumerate(blocks):
        for name in ("norm1", "norm2"):
            if _layer_norm(getattr(block, name), f"{name} of layer {i}") != eps:
                raise ConfigError(f"{name} of layer {i} has epsilon {getattr(block, name).eps}"
                                  f", the final norm {eps}: a GPT-2 folder has one "
                                  "layer_norm_epsilon")
        attn, mlp = block.attn, block.mlp
        heads, kv_heads = _heads(attn)
        if not attn.causal:
            raise ConfigError(f"layer {i} attends both ways: a GPT-2 folder needs causal "
                              "attention")
        if attn.rotary:
            raise ConfigError(f"layer {i} has rotary positions: a GPT-2 folder needs learned "
                              "positions")
        if kv_heads != heads:
            raise ConfigError(f"layer {i} has grouped-query attention ({kv_heads} key/value "
                              f"heads for {heads} query heads): a GPT-2 folder needs as many "
                              "of each")
        if heads != heads0:
            raise ConfigError(f"layer {i} has {_count(heads, 'head')}, layer 0 has {heads0}: a "
                              "GPT-2 folder needs every layer alike")
        if int(mlp.fc.out_features) != hidden0:
            raise ConfigError(f"layer {i} has {mlp.fc.out_features} MLP units, layer 0 has "
                              f"{hidden0}: a GPT-2 folder needs every layer alike")
        if mlp.activation != activation0:
            raise ConfigError(f"layer {i} uses activation {mlp.activation!r}, layer 0 "
                              f"{activation0!r}: a GPT-2 folder needs every layer alike")
    if heads0 * int(first.attn.head_dim) != width:
        raise ConfigError(f"heads x head_dim = {heads0} x {first.attn.head_dim} = "
                          f"{heads0 * int(first.attn.head_dim)} != width {width}: GPT-2 splits "
                          "the width into its heads (choose heads = width / head_dim)")
    if activation0 not in ACTIVATIONS:
        raise ConfigError(f"activation {activation0!r} has no GPT-2 counterpart; valid: "
                          f"{', '.join(ACTIVATIONS)}")
    return GPT2Shape(vocab_size=vocab, n_positions=int(model.pos.num_embeddings), n_embd=width,
                     n_layer=len(blocks), n_head=heads0, n_inner=hidden0,
                     activation_function=ACTIVATIONS[activation0], layer_norm_epsilon=eps)


def check_huggingface(study: Any, picks: Sequence[Any], data: Any, data_name: str) -> None:
    """Before any training: the huggingface format needs ``transformers``, language-modelling
    data and, for every chosen trial, a network GPT-2 can hold (built on the meta device,
    without weights or random numbers)."""
    require_transformers()
    check_task(data.task.name, data_name)
    for frozen in picks:
        arch = architecture_of(frozen, study.space)
        with torch.random.fork_rng(devices=[]):
            try:
                with torch.device("meta"):
                    network = study.space.build(arch, data.num_classes, data.input_shape)
            except ConfigError:
                raise
            except Exception:  # a space whose build needs real tensors: a CPU copy
                network = study.space.build(arch, data.num_classes, data.input_shape)
        try:
            gpt2_shape(network)
        except ConfigError as exc:
            raise ConfigError(f"trial {frozen.number} ({arch}) cannot be written in the "
                              f"huggingface format: {exc}") from None


def gpt2_state_dict(model: DenseGPT) -> dict[str, torch.Tensor]:
    """``model``'s weights under GPT-2's names (``GPT2LMHeadModel.state_dict``), with zeros
    for the biases a bias-free network lacks (GPT-2 has one on every layer but the head)."""
    state = dict(model.state_dict())
    for name, module in model.named_modules():
        if isinstance(module, nn.Linear) and module.bias is None and name != "head":
            state[f"{name}.bias"] = torch.zeros(module.out_features)
        elif isinstance(module, nn.LayerNorm) and module.bias is None:
            state[f"{name}.bias"] = torch.zeros(module.normalized_shape)
    return to_hf_state(state, GPT2)


@contextlib.contextmanager
def quiet_transformers() -> Iterator[None]:
    """No log lines and no progress bars from ``transformers`` (its loading bar)."""
    hf_logging: Any = importlib.import_module("transformers.utils.logging")
    verbosity, bars = hf_logging.get_verbosity(), hf_logging.is_progress_bar_enabled()
    hf_logging.set_verbosity_error()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        hf_logging.set_verbosity(verbosity)
        if bars:
            hf_logging.enable_progress_bar()


README = """\
# {title}

A GPT-2 language model exported by frugalnas {version} from study {study}, trial {trial}:
{n_layer} layer(s) of {n_embd} features, {n_head} heads, {n_inner} MLP units, {n_positions}
positions, a vocabulary of {vocab_size} tokens (`config.json`; weights in
`model.safetensors`). frugalnas is not needed to run it.

## Tokens

{tokens}

```python
import torch
from transformers import AutoModelForCausalLM

model = AutoModelForCausalLM.from_pretrained("path/to/this/folder").eval()
{encode}
with torch.no_grad():
    logits = model(ids).logits            # (1, tokens, {vocab_size}): next-token scores
next_id = int(logits[0, -1].argmax())
{decode}
```

Sequences may be up to {n_positions} tokens long (the model was trained on blocks of
{context} tokens).
"""

TOKENS = {
    "bytes": ("A token is one UTF-8 byte (ids 0-255): there is no tokenizer file and no special "
              "token.",
              'ids = torch.tensor([list("To be, or not".encode("utf-8"))])',
              'print(bytes(ids[0].tolist() + [next_id]).decode("utf-8", errors="replace"))'),
    "bpe": ("A token is a byte-level BPE token of `tokenizer.json` (trained by frugalnas on the "
            "training split; no special tokens); `AutoTokenizer.from_pretrained` reads it.",
            "from transformers import AutoTokenizer\n\n"
            'tokenizer = AutoTokenizer.from_pretrained("path/to/this/folder")\n'
            'ids = torch.tensor([tokenizer.encode("To be, or not")])',
            "print(tokenizer.decode(ids[0].tolist() + [next_id]))"),
    "other": ("A token is an id of the dataset the model was trained on (0 to the vocabulary "
              "size - 1); this folder holds no tokenizer.",
              "ids = torch.tensor([[1, 2, 3]])",
              "print(next_id)")}


def _tokenizer(data: Any, folder: Path, shape: GPT2Shape) -> dict[str, Any]:
    """Copy the dataset's BPE tokenizer into ``folder`` (with ``tokenizer_config.json`` when
    ``PreTrainedTokenizerFast`` can write it); what was written."""
    kind = getattr(data, "tokenizer", None)
    if kind == "bytes":
        return {"tokens": "bytes"}
    source: Any = getattr(data, "tokenizer_file", None)
    bpe: Any = getattr(data, "bpe", None)
    if kind != "bpe" or (source is None and bpe is None):
        return {"tokens": "other"}
    target = folder / "tokenizer.json"
    if source is not None and Path(source).is_file():
        shutil.copyfile(source, target)
    else:
        target.write_text(bpe.to_str(), encoding="utf-8")
    found: dict[str, Any] = {"tokens": "bpe", "tokenizer_config": False}
    try:
        transformers: Any = importlib.import_module("transformers")
        with quiet_transformers():
            fast = transformers.PreTrainedTokenizerFast(
                tokenizer_file=str(target), model_max_length=shape.n_positions)
            fast.save_pretrained(str(folder))
        config_file = folder / "tokenizer_config.json"
        if config_file.is_file():
            # the class every transformers release since 4 reads (5 writes its own name)
            config = json.loads(config_file.read_text(encoding="utf-8"))
            config["tokenizer_class"] = "PreTrainedTokenizerFast"
            config_file.write_text(json.dumps(config, indent=2) + "\n", encoding="utf-8")
        found["tokenizer_config"] = config_file.is_file()
    except Exception as exc:  # an older transformers that cannot read this tokenizer file
        found["tokenizer_config_error"] = f"{type(exc).__name__}: {exc}".splitlines()[0]
    return found


def _readme(folder: Path, shape: GPT2Shape, tokens: str, about: dict[str, Any]) -> None:
    text, encode, decode = TOKENS[tokens]
    (folder / "README.md").write_text(README.format(
        title=f"frugalnas GPT-2: {about.get('architecture', 'language model')}",
        version=__version__, study=f"`{about.get('study')}`", trial=about.get("trial"),
        context=about.get("context"), tokens=text, encode=encode, decode=decode,
        **asdict(shape)), encoding="utf-8")


def write_huggingface(model: nn.Module, data: Any, batch: torch.Tensor,
                      reference: torch.Tensor, out: Path,
                      about: dict[str, Any] | None = None) -> Any:
    """Write ``out/huggingface/`` (a GPT-2 folder of ``model`` with the dataset's
    tokenizer or a README on its tokens), load it with ``AutoModelForCausalLM`` and check
    its logits on ``batch`` against ``reference``; a :class:`~frugalnas.export.formats.
    FormatResult`."""
    require_transformers()
    transformers: Any = importlib.import_module("transformers")

    start = time.perf_counter()
    shape = gpt2_shape(model)   # refuses anything but a DenseGPT that GPT-2 holds
    assert isinstance(model, DenseGPT)
    folder = out / FOLDER
    if folder.exists():
        shutil.rmtree(folder)
    folder.mkdir(parents=True)
    with quiet(), quiet_transformers():
        hf = transformers.GPT2LMHeadModel(shape.config())
        try:
            hf.load_state_dict(gpt2_state_dict(model), strict=True)
        except RuntimeError as exc:
            raise ExportError(f"the GPT-2 model of transformers does not take the network's "
                              f"weights: {str(exc).splitlines()[0]}") from exc
        hf.save_pretrained(str(folder))
        del hf
        tokens = _tokenizer(data, folder, shape)
        _readme(folder, shape, tokens["tokens"], {"context": data.input_shape[0],
                                                  **(about or {})})
        loaded = transformers.AutoModelForCausalLM.from_pretrained(str(folder)).eval()
        with torch.no_grad():
            got = loaded(batch).logits
    diff = verify("Hugging Face (GPT-2)", got, reference)
    return FormatResult("huggingface", folder, diff, time.perf_counter() - start,
                        {"model": "GPT2LMHeadModel", "config": asdict(shape), **tokens,
                         "folder_files": sorted(p.name for p in folder.iterdir())})
