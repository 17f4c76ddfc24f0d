"""The dense (stand-alone) transformer modules that the elastic ones of
:mod:`frugalnas.nn.transformer` export to, and the functions both call: plain torch modules
that need no frugalnas to run once exported (:func:`export_program`).

* :class:`DenseAttention` (multi-head or grouped-query, causal or not, optional rotary
  positions), :class:`DenseMLP` (plain or gated, as SwiGLU), :class:`DenseBlock` (pre-norm
  residual) and :class:`DenseGPT` (the whole language model, listed by stages as a
  :class:`~frugalnas.ports.network.BlockNetwork`).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, cast

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.ports.errors import ConfigError

ACTIVATIONS: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "gelu": F.gelu,
    "gelu_tanh": lambda x: F.gelu(x, approximate="tanh"),
    "relu": F.relu,
    "silu": F.silu,
}
#: The base of the rotary angles unless a model names its own (RoPE's, and Llama's default).
ROPE_BASE = 10000.0


def sliced_linear(x: torch.Tensor, layer: nn.Linear, out_features: int) -> torch.Tensor:
    """``layer`` restricted to its first ``out_features`` outputs and the input's features."""
    weight = layer.weight[:out_features, :x.shape[-1]].contiguous()
    bias = None if layer.bias is None else layer.bias[:out_features].contiguous()
    return F.linear(x, weight, bias)


def export_linear(layer: nn.Linear, in_features: int, out_features: int) -> nn.Linear:
    """A plain ``nn.Linear`` holding a copy of the slice :func:`sliced_linear` uses."""
    dense = nn.Linear(in_features, out_features, bias=layer.bias is not None)
    with torch.no_grad():
        dense.weight.copy_(layer.weight[:out_features, :in_features])
        if layer.bias is not None:
            dense.bias.copy_(layer.bias[:out_features])
    return dense


def apply_rotary(x: torch.Tensor, base: float = ROPE_BASE, offset: int = 0) -> torch.Tensor:
    """Rotary position embedding (RoPE, Su et al. 2021) of ``x`` shaped (N, heads, T, d), its
    positions ``offset .. offset + T - 1``: the two halves of each head's features are rotated
    by an angle growing with the position."""
    t, d = x.shape[-2], x.shape[-1]
    inv_freq = base ** (-torch.arange(0, d, 2, dtype=torch.float32, device=x.device) / d)
    positions = torch.arange(offset, offset + t, dtype=torch.float32, device=x.device)
    angles = torch.outer(positions, inv_freq)
    cos, sin = angles.cos().to(x.dtype), angles.sin().to(x.dtype)
    x1, x2 = x[..., :d // 2], x[..., d // 2:]
    return torch.cat((x1 * cos - x2 * sin, x1 * sin + x2 * cos), dim=-1)


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, head_dim: int, causal: bool,
           rotary: bool, rope_base: float = ROPE_BASE) -> torch.Tensor:
    """Scaled dot-product attention of projected queries (N, T, heads * d) over keys and values
    (N, T, kv_heads * d); each group of ``heads / kv_heads`` query heads shares one key/value
    head; ``rope_base`` is the base of the rotary angles. Returns (N, T, heads * d)."""
    n, t, _ = q.shape
    q, k, v = (z.view(n, t, -1, head_dim).transpose(1, 2) for z in (q, k, v))
    if rotary:
        q, k = apply_rotary(q, rope_base), apply_rotary(k, rope_base)
    group = q.shape[1] // k.shape[1]
    if group > 1:
        k, v = k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)
    y = F.scaled_dot_product_attention(q, k, v, is_causal=causal)
    return y.transpose(1, 2).reshape(n, t, -1)


#: One attention's key/value cache: keys and values (N, kv_heads, positions, head_dim), the
#: keys already rotated.
KVCache = tuple[torch.Tensor, torch.Tensor]


class DenseAttention(nn.Module):
    """Plain multi-head (``kv_heads == heads``) or grouped-query attention. ``forward``
    attends over its input; ``forward_cached`` over a key/value cache of earlier positions
    and its input (causal attention only: the cache is how a decoder generates)."""

    def __init__(self, width: int, heads: int, head_dim: int, kv_heads: int, causal: bool = True,
                 rotary: bool = False, bias: bool = True, rope_base: float = ROPE_BASE):
        super().__init__()
        self.head_dim, self.causal, self.rotary = head_dim, causal, rotary
        self.rope_base = rope_base
        self.q = nn.Linear(width, heads * head_dim, bias=bias)
        self.k = nn.Linear(width, kv_heads * head_dim, bias=bias)
        self.v = nn.Linear(width, kv_heads * head_dim, bias=bias)
        self.out = nn.Linear(heads * head_dim, width, bias=bias)

    def extra_repr(self) -> str:
        return (f"head_dim={self.head_dim}, causal={self.causal}, rotary={self.rotary}, "
                f"rope_base={self.rope_base:g}")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = attend(self.q(x), self.k(x), self.v(x), self.head_dim, self.causal, self.rotary,
                   self.rope_base)
        out: torch.Tensor = self.out(y)
        return out

    def forward_cached(self, x: torch.Tensor, past: KVCache | None = None
                       ) -> tuple[torch.Tensor, KVCache]:
        """The output for the new positions ``x`` (N, T, width) following the ``past``
        positions, and the cache of all of them."""
        if not self.causal:
            raise ConfigError("a bidirectional attention has no key/value cache: every "
                              "position sees the later ones")
        n, t, _ = x.shape
        q, k, v = (z.view(n, t, -1, self.head_dim).transpose(1, 2)
                   for z in (self.q(x), self.k(x), self.v(x)))
        offset = 0 if past is None else past[0].shape[2]
        if self.rotary:
            q = apply_rotary(q, self.rope_base, offset)
            k = apply_rotary(k, self.rope_base, offset)
        if past is not None:
            k, v = torch.cat([past[0], k], dim=2), torch.cat([past[1], v], dim=2)
        group = q.shape[1] // k.shape[1]
        keys, values = (k.repeat_interleave(group, dim=1), v.repeat_interleave(group, dim=1)) \
            if group > 1 else (k, v)
        # new position i sees the past and the new positions up to i
        mask = None if t == 1 else \
            torch.ones(t, offset + t, dtype=torch.bool, device=x.device).tril(offset)
        y = F.scaled_dot_product_attention(q, keys, values, attn_mask=mask)
        out: torch.Tensor = self.out(y.transpose(1, 2).reshape(n, t, -1))
        return out, (k, v)


class DenseMLP(nn.Module):
    """Plain feed-forward layer: ``fc`` (width -> hidden), activation, ``proj`` (back). A gated
    one (``gated``, as Llama's SwiGLU) multiplies the activation of ``gate`` (width -> hidden)
    by ``fc``'s output before ``proj``."""

    def __init__(self, width: int, hidden: int, activation: str = "gelu", bias: bool = True,
                 gated: bool = False):
        super().__init__()
        self.activation = activation
        self.fc = nn.Linear(width, hidden, bias=bias)
        self.gate = nn.Linear(width, hidden, bias=bias) if gated else None
        self.proj = nn.Linear(hidden, width, bias=bias)

    def extra_repr(self) -> str:
        return f"activation={self.activation}"

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        act = ACTIVATIONS[self.activation]
        h = act(self.fc(x)) if self.gate is None else act(self.gate(x)) * self.fc(x)
        out: torch.Tensor = self.proj(h)
        return out


class DenseBlock(nn.Module):
    """Pre-norm residual block: ``x + attn(norm1(x))``, then ``x + mlp(norm2(x))``."""

    def __init__(self, norm1: nn.Module, attn: DenseAttention, norm2: nn.Module, mlp: DenseMLP):
        super().__init__()
        self.norm1, self.attn, self.norm2, self.mlp = norm1, attn, norm2, mlp

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.norm1(x))
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out

    def forward_cached(self, x: torch.Tensor, past: KVCache | None = None
                       ) -> tuple[torch.Tensor, KVCache]:
        """:meth:`forward` of new positions after the ``past`` ones, and the block's cache."""
        attended, cache = self.attn.forward_cached(self.norm1(x), past)
        x = x + attended
        out: torch.Tensor = x + self.mlp(self.norm2(x))
        return out, cache


class GPTEmbedding(nn.Module):
    """The embedding stage of a :class:`DenseGPT`: token embedding plus, when ``pos`` is
    given, learned positions. It holds plain references to its parent's ``tok`` and ``pos``
    (not submodules), so the parent's parameters and state-dict keys stay where they are."""

    parts: tuple[nn.Embedding, nn.Embedding | None]

    def __init__(self, tok: nn.Embedding, pos: nn.Embedding | None):
        super().__init__()
        self.parts = (tok, pos)          # a tuple: not registered as submodules

    def forward(self, tokens: torch.Tensor, offset: int = 0) -> torch.Tensor:
        """The embedding of ``tokens`` at positions ``offset, offset + 1, ...``."""
        tok, pos = self.parts
        x: torch.Tensor = tok(tokens)
        if pos is not None:
            end = offset + tokens.shape[1]
            if end > pos.num_embeddings:
                raise ConfigError(f"position {end - 1} is beyond the model's "
                                  f"{pos.num_embeddings} learned positions")
            x = x + pos(torch.arange(offset, end, device=tokens.device))
        return x

    def extra_repr(self) -> str:
        tok, pos = self.parts
        return f"tok={tok!r}" + (f", pos={pos!r}" if pos is not None else "")


class GPTOutput(nn.Module):
    """The output stage of a :class:`DenseGPT`: final norm, then the language-model head
    (references to its parent's ``norm`` and ``head``, as :class:`GPTEmbedding`)."""

    parts: tuple[nn.Module, nn.Linear]

    def __init__(self, norm: nn.Module, head: nn.Linear):
        super().__init__()
        self.parts = (norm, head)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        norm, head = self.parts
        logits: torch.Tensor = head(norm(x))
        return logits

    def extra_repr(self) -> str:
        norm, head = self.parts
        return f"norm={norm!r}, head={head!r}"


class DenseGPT(nn.Module):
    """A plain decoder: token embedding (plus learned positions when ``pos`` is given), blocks,
    final norm and language-model head. ``forward(tokens)`` returns logits (N, T, vocab).

    It is a :class:`~frugalnas.ports.network.BlockNetwork`: :meth:`forward_blocks` lists the
    embedding stage (``embedding``: ``tok`` + ``pos``), every :class:`DenseBlock` and the output
    stage (``output``: ``norm`` + ``head``), which ``forward`` calls once each, in order; the
    out-of-core backend plans per stage. The stages hold references to ``tok``, ``pos``,
    ``norm`` and ``head`` (kept in step when those are reassigned), so the parameters and the
    state-dict keys are ``tok.*``, ``pos.*``, ``blocks.<i>.*``, ``norm.*`` and ``head.*``."""

    _STAGE_PARTS = ("tok", "pos", "norm", "head")

    def __init__(self, tok: nn.Embedding, pos: nn.Embedding | None, blocks: list[DenseBlock],
                 norm: nn.Module, head: nn.Linear):
        super().__init__()
        self.tok, self.pos, self.norm, self.head = tok, pos, norm, head
        self.blocks = nn.ModuleList(blocks)
        self.embedding = GPTEmbedding(tok, pos)
        self.output = GPTOutput(norm, head)

    def __setattr__(self, name: str, value: Any) -> None:
        super().__setattr__(name, value)
        if name in self._STAGE_PARTS and "output" in self._modules:
            self.embedding.parts = (self.tok, self.pos)
            self.output.parts = (self.norm, self.head)

    def forward_blocks(self) -> list[nn.Module]:
        """The stages in forward order: embedding, each block, output (norm + head)."""
        return [self.embedding, *self.blocks, self.output]

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        x = self.embedding(tokens)
        for block in self.blocks:
            x = block(x)
        logits: torch.Tensor = self.output(x)
        return logits

    def forward_cached(self, tokens: torch.Tensor, cache: list[KVCache] | None = None
                       ) -> tuple[torch.Tensor, list[KVCache]]:
        """The logits of ``tokens`` (N, T) that follow the positions held in ``cache`` (one
        :data:`KVCache` per block; None: none before), and the cache extended by them: a
        prompt, then one generated token at a time, computes what :meth:`forward` computes
        on the whole sequence."""
        blocks = [cast(DenseBlock, b) for b in self.blocks]
        offset = 0 if not cache else cache[0][0].shape[2]
        x = self.embedding(tokens, offset)
        extended = []
        for i, block in enumerate(blocks):
            x, kv = block.forward_cached(x, cache[i] if cache else None)
            extended.append(kv)
        logits: torch.Tensor = self.output(x)
        return logits, extended


class DecodeStep(nn.Module):
    """One generated token of ``model`` after ``prompt`` (N, P): ``forward(token)`` (N, 1)
    returns the logits (N, 1, vocabulary) of position P, the prompt's keys and values held as
    a fixed cache (buffers), so each call costs what generating one token with a key/value
    cache costs (what a per-token latency times)."""

    def __init__(self, model: DenseGPT, prompt: torch.Tensor):
        super().__init__()
        self.model = model
        with torch.no_grad():
            _, cache = model.forward_cached(prompt)
        self.depth = len(cache)
        for i, (k, v) in enumerate(cache):
            self.register_buffer(f"k{i}", k)
            self.register_buffer(f"v{i}", v)

    def forward(self, token: torch.Tensor) -> torch.Tensor:
        cache = [(cast(torch.Tensor, getattr(self, f"k{i}")),
                  cast(torch.Tensor, getattr(self, f"v{i}"))) for i in range(self.depth)]
        logits, _ = self.model.forward_cached(token, cache)
        return logits


def count_non_embedding_params(model: Any) -> int:
    """Parameters of the decoder blocks and the final norm: neither token nor position
    embeddings, nor the language-model head (for an elastic GPT, of its largest network)."""
    return sum(p.numel() for part in (model.blocks, model.norm) for p in part.parameters())


def export_program(model: DenseGPT, example: torch.Tensor) -> torch.export.ExportedProgram:
    """``torch.export`` of ``model`` for ``example`` tokens (N, T), with the batch size and the
    sequence length (up to the model's positions, when learned) left dynamic. Save it with
    ``torch.export.save``; ``torch.export.load(path).module()`` runs without frugalnas."""
    max_len = model.pos.num_embeddings if model.pos is not None else None
    batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq", max=max_len)
    return torch.export.export(model, (example,),
                               dynamic_shapes={"tokens": {0: batch, 1: seq}})


