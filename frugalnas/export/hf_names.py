"""Where frugalnas's transformer parameters sit in a Hugging Face GPT-2 or Llama state dict.

The weights map one to one: GPT-2's ``Conv1D`` layers hold ``(in, out)`` matrices, the
transposes of ``nn.Linear``'s, and its ``c_attn`` is the query, key and value projections side
by side; Llama's ``up_proj``, ``gate_proj`` and ``down_proj`` are the gated MLP's ``fc``,
``gate`` and ``proj``. Both the ``huggingface`` export format and compression's reading and
writing of Hugging Face models go through :func:`to_hf_state` and :func:`from_hf_state`.
"""

from __future__ import annotations

import torch

GPT2 = "GPT2LMHeadModel"
LLAMA = "LlamaForCausalLM"

# frugalnas module names -> Hugging Face module names (the parameter name follows).
_TOP = {GPT2: {"tok": "transformer.wte", "pos": "transformer.wpe", "norm": "transformer.ln_f",
               "head": "lm_head"},
        LLAMA: {"tok": "model.embed_tokens", "norm": "model.norm", "head": "lm_head"}}
_LAYERS = {GPT2: "transformer.h", LLAMA: "model.layers"}
_BLOCK = {GPT2: {"norm1": "ln_1", "norm2": "ln_2", "attn.q": "attn.c_attn",
                 "attn.k": "attn.c_attn", "attn.v": "attn.c_attn", "attn.out": "attn.c_proj",
                 "mlp.fc": "mlp.c_fc", "mlp.proj": "mlp.c_proj"},
          LLAMA: {"norm1": "input_layernorm", "norm2": "post_attention_layernorm",
                  "attn.q": "self_attn.q_proj", "attn.k": "self_attn.k_proj",
                  "attn.v": "self_attn.v_proj", "attn.out": "self_attn.o_proj",
                  "mlp.fc": "mlp.up_proj", "mlp.gate": "mlp.gate_proj",
                  "mlp.proj": "mlp.down_proj"}}
#: GPT-2's Conv1D modules (their weights are (in, out)).
_CONV1D = ("attn.c_attn", "attn.c_proj", "mlp.c_fc", "mlp.c_proj")
#: The parts of GPT-2's ``c_attn``, in order.
_QKV = ("attn.q", "attn.k", "attn.v")


def hf_key(key: str, architecture: str) -> str:
    """The Hugging Face name of the frugalnas parameter ``key`` (``blocks.1.attn.q.weight``)."""
    module, param = key.rsplit(".", 1)
    if module.startswith("blocks."):
        _, index, part = module.split(".", 2)
        return f"{_LAYERS[architecture]}.{index}.{_BLOCK[architecture][part]}.{param}"
    return f"{_TOP[architecture][module]}.{param}"


def _is_conv1d(key: str, architecture: str) -> bool:
    return architecture == GPT2 and key.endswith(".weight") and \
        key.rsplit(".", 1)[0].endswith(_CONV1D)


def _part(key: str) -> str:
    """``attn.q`` of ``blocks.1.attn.q.weight``."""
    return key.split(".", 2)[2].rsplit(".", 1)[0] if key.startswith("blocks.") else ""


def from_hf_state(names: list[str], hf_state: dict[str, torch.Tensor],
                  architecture: str) -> dict[str, torch.Tensor]:
    """The frugalnas parameters ``names`` taken from a Hugging Face state dict."""
    state = {}
    for key in names:
        hf = hf_key(key, architecture)
        value = hf_state[hf].detach()
        value = value.t() if _is_conv1d(hf, architecture) else value
        if architecture == GPT2 and _part(key) in _QKV:
            value = value.chunk(3, dim=0)[_QKV.index(_part(key))]
        state[key] = value.contiguous()
    return state


def to_hf_state(state: dict[str, torch.Tensor], architecture: str) -> dict[str, torch.Tensor]:
    """A frugalnas state dict under Hugging Face's names (GPT-2's q, k and v joined), as
    copies."""
    order = {part: i for i, part in enumerate(_QKV)}
    grouped: dict[str, list[tuple[int, torch.Tensor]]] = {}
    for key, value in state.items():
        grouped.setdefault(hf_key(key, architecture), []).append(
            (order.get(_part(key), 0), value.detach()))
    out = {}
    for hf, parts in grouped.items():
        value = torch.cat([v for _, v in sorted(parts, key=lambda p: p[0])])
        out[hf] = (value.t() if _is_conv1d(hf, architecture) else value).contiguous().clone()
    return out
