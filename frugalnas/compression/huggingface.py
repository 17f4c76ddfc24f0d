"""Hugging Face causal language models as compression parents: a ``transformers`` model saved
with ``save_pretrained`` (GPT-2 or Llama) becomes an :class:`~frugalnas.nn.transformer.
ElasticGPT` holding its weights (:func:`read_pretrained`: the same logits), and a sub-network of
that supernet goes back out as a ``save_pretrained`` folder of the parent's architecture, with
the parent's tokenizer files (:func:`write_pretrained`).

The weights map one to one (:mod:`frugalnas.export.hf_names`), and Llama's rotary embedding
(halves of each head rotated) is frugalnas's. A Hugging Face config
holds one size for every layer, so a written sub-network has every layer alike
(:func:`check_writable`).

:func:`read_config` reads only ``config.json`` and refuses, in one line, what the elastic
network cannot reproduce exactly (another architecture, scaled RoPE, GPT-2's per-layer
attention scaling, ...), before any weight is loaded.
"""

from __future__ import annotations

import importlib
import json
import shutil
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch

from frugalnas.export.hf_names import GPT2, LLAMA, from_hf_state, hf_key, to_hf_state
from frugalnas.export.huggingface import quiet_transformers, require_transformers
from frugalnas.nn.dense_transformer import ROPE_BASE
from frugalnas.nn.transformer import BlockChoice, ElasticGPT, GPTConfig, SubnetConfig
from frugalnas.ports.errors import ConfigError

__all__ = ["SUPPORTED", "TOKENIZER_FILES", "HFSource", "check_writable", "elastic_config",
           "read_config", "read_pretrained", "write_pretrained"]

#: The architecture classes (config.json ``architectures[0]``) this module reads and writes.
SUPPORTED: tuple[str, ...] = (GPT2, LLAMA)
#: The files of a parent's folder that a written sub-network gets copies of, when present.
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json",
                   "vocab.json", "merges.txt", "tokenizer.model", "added_tokens.json",
                   "chat_template.jinja", "generation_config.json")

#: The config values each class assumes when config.json leaves them out.
DEFAULTS: dict[str, dict[str, Any]] = {
    GPT2: {"vocab_size": 50257, "n_positions": 1024, "n_embd": 768, "n_layer": 12,
           "n_head": 12, "n_inner": None, "activation_function": "gelu_new",
           "layer_norm_epsilon": 1e-5, "tie_word_embeddings": True, "scale_attn_weights": True,
           "scale_attn_by_inverse_layer_idx": False, "reorder_and_upcast_attn": False,
           "add_cross_attention": False},
    LLAMA: {"vocab_size": 32000, "hidden_size": 4096, "intermediate_size": 11008,
            "num_hidden_layers": 32, "num_attention_heads": 32, "num_key_value_heads": None,
            "head_dim": None, "hidden_act": "silu", "max_position_embeddings": 2048,
            "rms_norm_eps": 1e-6, "tie_word_embeddings": False, "attention_bias": False,
            "mlp_bias": False}}
#: GPT-2's ``activation_function`` -> frugalnas's activation (``gelu_new`` and
#: ``gelu_pytorch_tanh`` are both the tanh approximation, ``swish`` is SiLU).
GPT2_ACTIVATIONS = {"gelu": "gelu", "gelu_new": "gelu_tanh", "gelu_pytorch_tanh": "gelu_tanh",
                    "relu": "relu", "silu": "silu", "swish": "silu"}



@dataclass(frozen=True)
class HFSource:
    """A parent model's origin: its folder, its architecture class name (config.json's
    ``architectures[0]``) and its config.json as a dict."""

    folder: Path
    architecture: str
    config: dict[str, Any]

    def get(self, key: str) -> Any:
        """``key`` of the config, or the architecture's default when config.json omits it."""
        return self.config[key] if key in self.config else DEFAULTS[self.architecture].get(key)


# -- reading config.json ---------------------------------------------------------------------------
def _supported() -> str:
    return f"supported: {', '.join(SUPPORTED)}"


def _load_json(folder: Path) -> dict[str, Any]:
    file = folder / "config.json"
    if not file.is_file():
        raise ConfigError(f"{folder} has no config.json: a Hugging Face model folder (written by "
                          f"save_pretrained) is needed; {_supported()}")
    try:
        config = json.loads(file.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ConfigError(f"{file} cannot be read as JSON: {exc}".splitlines()[0]) from None
    if not isinstance(config, dict):
        raise ConfigError(f"{file} holds a JSON {type(config).__name__}, not an object")
    return config


def _architecture(config: dict[str, Any], folder: Path) -> str:
    names = config.get("architectures")
    name = names[0] if isinstance(names, list) and names else None
    if name is None:
        raise ConfigError(f"config.json of {folder} names no architecture ('architectures' is "
                          f"missing or empty); {_supported()}")
    if name not in SUPPORTED:
        raise ConfigError(f"architecture {name!r} of {folder} is not supported; {_supported()}")
    return str(name)


def _refuse(source: HFSource, what: str, supported: str) -> None:
    raise ConfigError(f"{source.architecture} of {source.folder} has {what}, which frugalnas "
                      f"cannot reproduce; supported: {supported}")


def _check_gpt2(source: HFSource) -> None:
    for flag in ("scale_attn_by_inverse_layer_idx", "reorder_and_upcast_attn",
                 "add_cross_attention"):
        if source.get(flag):
            _refuse(source, f"{flag}=true", f"{flag}=false")
    if not source.get("scale_attn_weights"):
        _refuse(source, "scale_attn_weights=false", "scale_attn_weights=true")
    activation = source.get("activation_function")
    if activation not in GPT2_ACTIVATIONS:
        _refuse(source, f"activation_function {activation!r}",
                f"activation_function in {', '.join(GPT2_ACTIVATIONS)}")
    width, heads = int(source.get("n_embd")), int(source.get("n_head"))
    if width % heads:
        _refuse(source, f"n_embd {width} not divisible by n_head {heads}",
                "n_embd a multiple of n_head")


def _rope(source: HFSource) -> tuple[str, float, float]:
    """The RoPE type, base and rotated fraction, from transformers 5's ``rope_parameters`` or
    the older ``rope_theta`` and ``rope_scaling``."""
    params = source.config.get("rope_parameters")
    if not isinstance(params, dict):
        params = dict(source.config.get("rope_scaling") or {})
        params.setdefault("rope_theta", source.config.get("rope_theta", ROPE_BASE))
    kind = params.get("rope_type", params.get("type", "default"))
    partial = params.get("partial_rotary_factor",
                         source.config.get("partial_rotary_factor", 1.0))
    return str(kind), float(params.get("rope_theta", ROPE_BASE)), float(partial)


def _check_llama(source: HFSource) -> None:
    act = source.get("hidden_act")
    if act != "silu":
        _refuse(source, f"hidden_act {act!r}", "hidden_act 'silu'")
    kind, _, partial = _rope(source)
    if kind != "default":
        _refuse(source, f"rope type {kind!r}", "rope type 'default' (no RoPE scaling)")
    if partial != 1.0:
        _refuse(source, f"partial_rotary_factor {partial}", "partial_rotary_factor 1.0")
    heads, kv = _llama_heads(source)
    if kv < 1 or heads % kv:
        _refuse(source, f"num_attention_heads {heads} not a multiple of num_key_value_heads "
                f"{kv}", "num_attention_heads a multiple of num_key_value_heads")
    if bool(source.get("attention_bias")) != bool(source.get("mlp_bias")):
        _refuse(source, f"attention_bias={source.get('attention_bias')} but mlp_bias="
                f"{source.get('mlp_bias')}", "attention_bias equal to mlp_bias")
    if _llama_head_dim(source) % 2:
        _refuse(source, f"head_dim {_llama_head_dim(source)}", "an even head_dim (RoPE)")


def _llama_heads(source: HFSource) -> tuple[int, int]:
    heads = int(source.get("num_attention_heads"))
    kv = source.get("num_key_value_heads")
    return heads, heads if kv is None else int(kv)


def _llama_head_dim(source: HFSource) -> int:
    d = source.get("head_dim")
    return int(source.get("hidden_size")) // int(source.get("num_attention_heads")) \
        if d is None else int(d)


def read_config(folder: str | Path) -> HFSource:
    """The :class:`HFSource` of ``folder`` (its config.json only, no weights), or a one-line
    :class:`ConfigError` naming what frugalnas cannot reproduce exactly and what it supports."""
    path = Path(folder)
    config = _load_json(path)
    source = HFSource(path, _architecture(config, path), config)
    (_check_gpt2 if source.architecture == GPT2 else _check_llama)(source)
    return source


def elastic_config(source: HFSource) -> GPTConfig:
    """The :class:`GPTConfig` of the elastic network that holds ``source``'s model."""
    get = source.get
    if source.architecture == GPT2:
        width, heads = int(get("n_embd")), int(get("n_head"))
        return GPTConfig(
            vocab_size=int(get("vocab_size")), max_width=width, max_depth=int(get("n_layer")),
            max_heads=heads, head_dim=width // heads,
            max_mlp_hidden=int(get("n_inner") or 4 * width), context=int(get("n_positions")),
            positions="learned", norm="layernorm", tie_weights=bool(get("tie_word_embeddings")),
            activation=GPT2_ACTIVATIONS[str(get("activation_function"))], bias=True,
            norm_eps=float(get("layer_norm_epsilon")))
    heads, kv = _llama_heads(source)
    return GPTConfig(
        vocab_size=int(get("vocab_size")), max_width=int(get("hidden_size")),
        max_depth=int(get("num_hidden_layers")), max_heads=heads,
        head_dim=_llama_head_dim(source), max_mlp_hidden=int(get("intermediate_size")),
        context=int(get("max_position_embeddings")), positions="rotary", norm="rmsnorm",
        tie_weights=bool(get("tie_word_embeddings")), kv_heads=kv, activation="silu",
        bias=bool(get("attention_bias")), gated=True, norm_eps=float(get("rms_norm_eps")),
        rope_base=_rope(source)[1])


# -- weights -----------------------------------------------------------------------------------
def _transformers() -> Any:
    require_transformers("reading or writing Hugging Face models")
    return importlib.import_module("transformers")


def _load_hf(source: HFSource) -> Any:
    transformers = _transformers()
    with quiet_transformers(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = transformers.AutoModelForCausalLM.from_pretrained(str(source.folder))
    if type(hf).__name__ != source.architecture:
        raise ConfigError(f"transformers loads {source.folder} as {type(hf).__name__}, not its "
                          f"config's {source.architecture}; {_supported()}")
    return hf.to(torch.float32).eval()


def read_pretrained(folder: str | Path) -> tuple[ElasticGPT, HFSource]:
    """The elastic network holding the weights of the model saved in ``folder`` (computing the
    same logits, in float32), with the model's :class:`HFSource`."""
    source = read_config(folder)
    hf = _load_hf(source)
    hf_state = dict(hf.state_dict())
    with torch.random.fork_rng(devices=[]):
        model = ElasticGPT.from_config(elastic_config(source))
    names = list(model.state_dict())
    unused = sorted(set(hf_state) - {hf_key(k, source.architecture) for k in names})
    missing = sorted({hf_key(k, source.architecture) for k in names} - set(hf_state))
    if unused or missing:
        raise ConfigError(f"the weights of {source.folder} do not match a {source.architecture}"
                          f" frugalnas can hold: unexpected {unused[:3]}, missing {missing[:3]}")
    try:
        model.load_state_dict(from_hf_state(names, hf_state, source.architecture), strict=True)
    except RuntimeError as exc:
        raise ConfigError(f"the weights of {source.folder} do not fit its config: "
                          f"{str(exc).strip().splitlines()[-1].strip()}") from None
    return model, source


# -- writing a sub-network -----------------------------------------------------------------------
#: The sizes a sub-network (or a child made of one) may shrink; every other field of its
#: GPTConfig must be the parent's.
SIZES = ("max_width", "max_depth", "max_heads", "max_mlp_hidden", "kv_heads")


def _check_model(source: HFSource, model: ElasticGPT) -> None:
    """``model`` must be the parent's supernet or a smaller network of the same kind (the
    same fields but the sizes, the same grouped-query group size)."""
    want, have = elastic_config(source), model.config
    differences = [f"{f.name} {getattr(have, f.name)!r} (the parent's "
                   f"{getattr(want, f.name)!r})"
                   for f in fields(GPTConfig)
                   if f.name not in SIZES and getattr(have, f.name) != getattr(want, f.name)]
    if have.group != want.group:
        differences.append(f"grouped-query group size {have.group} (the parent's "
                           f"{want.group})")
    if differences:
        raise ConfigError(f"the model is not a network of the {source.architecture} in "
                          f"{source.folder}: its {', '.join(differences)}")


def _check_alike(source: HFSource, config: SubnetConfig) -> BlockChoice:
    if config.depth < 1:
        raise ConfigError(f"depth {config.depth}: a {source.architecture} needs at least one "
                          "layer")
    first = config.blocks[0]
    for i, choice in enumerate(config.blocks[:config.depth]):
        if choice != first:
            raise ConfigError(
                f"layer {i} of the sub-network has {choice.heads} heads and {choice.mlp_hidden}"
                f" MLP units, layer 0 {first.heads} and {first.mlp_hidden}: a "
                f"{source.architecture} config holds one value for every layer (choose the "
                "same heads and mlp_hidden for each)")
    return first


def _check_heads(source: HFSource, model: ElasticGPT, config: SubnetConfig,
                 choice: BlockChoice) -> None:
    d, heads = model.config.head_dim, choice.heads
    if source.architecture == GPT2 and config.width != heads * d:
        fit = f" or {config.width // d} heads" if config.width % d == 0 else ""
        raise ConfigError(f"width {config.width} != heads x head_dim = {heads} x {d} = "
                          f"{heads * d}: GPT-2 splits its width into its heads (choose width "
                          f"{heads * d}{fit})")


def check_writable(source: HFSource, model: ElasticGPT, config: SubnetConfig) -> None:
    """A one-line :class:`ConfigError` when the sub-network ``config`` of ``model`` cannot be
    written as a ``source.architecture`` folder: ``model`` must be ``source``'s supernet,
    every layer alike, GPT-2's width its heads times head_dim, and Llama's heads whole groups
    of its grouped-query attention."""
    _check_model(source, model)
    choice = _check_alike(source, config)
    _check_heads(source, model, config, choice)
    model.check(config)


def _sizes(source: HFSource, model: ElasticGPT, config: SubnetConfig) -> dict[str, Any]:
    choice, d = config.blocks[0], model.config.head_dim
    if source.architecture == GPT2:
        return {"n_embd": config.width, "n_layer": config.depth, "n_head": choice.heads,
                "n_inner": choice.mlp_hidden}
    return {"hidden_size": config.width, "num_hidden_layers": config.depth,
            "num_attention_heads": choice.heads,
            "num_key_value_heads": choice.heads // model.config.group,
            "head_dim": d, "intermediate_size": choice.mlp_hidden}


def _hf_config(transformers: Any, source: HFSource, sizes: dict[str, Any]) -> Any:
    values = {k: v for k, v in source.config.items()
              if k not in ("_name_or_path", "transformers_version", "torch_dtype")}
    values.update(sizes, dtype="float32", architectures=[source.architecture])
    config_class = getattr(transformers, source.architecture).config_class
    return config_class.from_dict(values)


def _copy_tokenizer(source: Path, folder: Path) -> None:
    for name in TOKENIZER_FILES:
        if (source / name).is_file():
            shutil.copyfile(source / name, folder / name)


def write_pretrained(model: ElasticGPT, config: SubnetConfig, source: HFSource,
                     folder: str | Path) -> Path:
    """Write the sub-network ``config`` of ``model`` (the blocks its ``layer_order`` keeps) to
    ``folder`` as a ``save_pretrained`` folder of ``source``'s architecture, its config the
    parent's with the new sizes, with copies of the parent's tokenizer files; returns
    ``folder``."""
    check_writable(source, model, config)
    out = Path(folder)
    if out.resolve() == source.folder.resolve():
        raise ConfigError(f"{out} is the parent's folder: write the sub-network elsewhere")
    transformers = _transformers()
    state = to_hf_state(model.export(config).state_dict(), source.architecture)
    hf_config = _hf_config(transformers, source, _sizes(source, model, config))
    out.mkdir(parents=True, exist_ok=True)
    with torch.random.fork_rng(devices=[]), quiet_transformers(), warnings.catch_warnings():
        warnings.simplefilter("ignore")
        hf = getattr(transformers, source.architecture)(hf_config).to(torch.float32)
        hf.load_state_dict(state, strict=True)
        hf.save_pretrained(str(out))
    _copy_tokenizer(source.folder, out)
    return out
