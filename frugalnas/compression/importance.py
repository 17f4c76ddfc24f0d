"""How much each part of a trained :class:`~frugalnas.nn.transformer.ElasticGPT` matters, and
the weights reordered so that every prefix slice keeps the parts that matter most.

Two rankings, each from a few calibration batches:

* ``"activation"``, in the manner of Minitron (Muralidharan et al., 2024, "Compact Language
  Models via Pruning and Knowledge Distillation"): a head scores the mean L2 norm of its
  attention output, an MLP unit the mean magnitude of its activation, an embedding channel
  the mean magnitude of every normalisation's output in it; a layer scores one minus the
  cosine similarity of its input and output (the block importance of ShortGPT, Men et al.,
  2024): a layer that barely changes its input matters little.
* ``"gradient"``: the first-order Taylor estimate of the loss change when a part is removed,
  ``|sum(w * dL/dw)|`` over the part's weights, summed over the batches (Molchanov et al.,
  2019).

:func:`reorder` permutes the heads (whole key/value groups under grouped-query attention), MLP
units and embedding channels in place, most important first, and sets the layer order: the
network computes the same outputs (up to float rounding in the order of sums), but a
sub-network of fewer heads, units, channels or layers now keeps the most important ones.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.compression.options import IMPORTANCE_METHODS
from frugalnas.nn.transformer import ACTIVATIONS, ElasticBlock, ElasticGPT, attend
from frugalnas.ports.errors import check_choice

METHODS = IMPORTANCE_METHODS


@dataclass(frozen=True)
class Importance:
    """Scores of a network's parts (higher: more important): per block, one per key/value
    group of heads (one per head without grouped-query attention) and one per MLP unit; one
    per embedding channel; one per block."""

    groups: tuple[torch.Tensor, ...]
    units: tuple[torch.Tensor, ...]
    channels: torch.Tensor
    layers: torch.Tensor

    def orders(self) -> tuple[list[torch.Tensor], list[torch.Tensor], torch.Tensor, list[int]]:
        """The permutations, most important first (ties kept in the network's order)."""
        def order(scores: torch.Tensor) -> torch.Tensor:
            return torch.sort(scores, descending=True, stable=True).indices
        return ([order(g) for g in self.groups], [order(u) for u in self.units],
                order(self.channels), order(self.layers).tolist())


def _blocks(model: ElasticGPT) -> list[ElasticBlock]:
    return [block for block in model.blocks if isinstance(block, ElasticBlock)]


def measure(model: ElasticGPT, batches: Iterable[torch.Tensor], method: str = "activation",
            targets: Iterable[torch.Tensor] | None = None) -> Importance:
    """The :class:`Importance` of ``model``'s parts over calibration token ``batches`` (N, T);
    the ``"gradient"`` method needs the next tokens too (``targets``, aligned with
    ``batches``)."""
    check_choice("method", method, METHODS)
    if method == "activation":
        return _activation(model, batches)
    if targets is None:
        raise ValueError("the gradient method needs the batches' next tokens (targets)")
    return _gradient(model, batches, targets)


# -- activations -----------------------------------------------------------------------------
class _Sums:
    def __init__(self, model: ElasticGPT):
        blocks = _blocks(model)
        self.heads = [torch.zeros(b.attn.max_heads) for b in blocks]
        self.units = [torch.zeros(b.mlp.max_hidden) for b in blocks]
        self.channels = torch.zeros(model.max_width)
        self.layers = torch.zeros(len(blocks))
        self.batches = 0


@contextmanager
def _hooks(model: ElasticGPT, sums: _Sums) -> Iterator[None]:
    handles: list[Any] = []

    def on_channels(_: nn.Module, __: Any, out: torch.Tensor) -> None:
        sums.channels += out.detach().abs().mean(dim=(0, 1)).float().cpu()

    for i, block in enumerate(_blocks(model)):
        d = block.attn.head_dim

        def on_heads(attn: nn.Module, args: Any, _: Any, i: int = i, d: int = d) -> None:
            y = _head_outputs(attn, args[0])
            sums.heads[i] += y.view(*y.shape[:-1], -1, d).norm(dim=-1).mean(dim=(0, 1)).float().cpu()

        def on_units(mlp: nn.Module, args: Any, _: Any, i: int = i) -> None:
            sums.units[i] += _hidden(mlp, args[0]).abs().mean(dim=(0, 1)).float().cpu()

        def on_layer(_: nn.Module, args: Any, out: torch.Tensor, i: int = i) -> None:
            cos = F.cosine_similarity(args[0].detach(), out.detach(), dim=-1).mean()
            sums.layers[i] += float(1.0 - cos)

        handles += [block.attn.register_forward_hook(on_heads),
                    block.mlp.register_forward_hook(on_units),
                    block.register_forward_hook(on_layer),
                    block.norm1.register_forward_hook(on_channels),
                    block.norm2.register_forward_hook(on_channels)]
    handles.append(model.norm.register_forward_hook(on_channels))
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _head_outputs(attn: Any, x: torch.Tensor) -> torch.Tensor:
    """The heads' outputs (N, T, heads * d) of the whole attention on ``x``, before the output
    projection (recomputed: the elastic module calls its layers functionally)."""
    q, k, v = (F.linear(x, layer.weight, layer.bias) for layer in (attn.q, attn.k, attn.v))
    return attend(q, k, v, attn.head_dim, attn.causal, attn.rotary, attn.rope_base)


def _hidden(mlp: Any, x: torch.Tensor) -> torch.Tensor:
    """The MLP's hidden activations (N, T, units) on ``x`` (recomputed, as the heads')."""
    act = ACTIVATIONS[mlp.activation]
    up = F.linear(x, mlp.fc.weight, mlp.fc.bias)
    return act(up) if mlp.gate is None else act(F.linear(x, mlp.gate.weight, mlp.gate.bias)) * up


def _group_scores(model: ElasticGPT, per_head: list[torch.Tensor]) -> tuple[torch.Tensor, ...]:
    return tuple(h.view(-1, b.attn.group).sum(dim=1) for b, h in zip(_blocks(model), per_head))


def _activation(model: ElasticGPT, batches: Iterable[torch.Tensor]) -> Importance:
    sums = _Sums(model)
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    with torch.no_grad(), _hooks(model, sums):
        for tokens in batches:
            model(tokens.to(device))
            sums.batches += 1
    model.train(was_training)
    n = max(sums.batches, 1)
    return Importance(_group_scores(model, [h / n for h in sums.heads]),
                      tuple(u / n for u in sums.units), sums.channels / n, sums.layers / n)


# -- gradients -------------------------------------------------------------------------------
def _taylor(weight: torch.Tensor | None, dims: int) -> torch.Tensor:
    """``w * dL/dw`` of ``weight``, summed over every dimension but ``dims``."""
    if weight is None or weight.grad is None:
        return torch.zeros(())
    product = (weight.detach() * weight.grad).float()
    if product.dim() == 1:
        return product
    return product.sum(dim=[d for d in range(product.dim()) if d != dims])


def _gradient(model: ElasticGPT, batches: Iterable[torch.Tensor],
              targets: Iterable[torch.Tensor]) -> Importance:
    blocks = _blocks(model)
    heads = [torch.zeros(b.attn.max_heads) for b in blocks]
    units = [torch.zeros(b.mlp.max_hidden) for b in blocks]
    channels, layers = torch.zeros(model.max_width), torch.zeros(len(blocks))
    device = next(model.parameters()).device
    was_training = model.training
    model.eval()
    for tokens, following in zip(batches, targets):
        model.zero_grad(set_to_none=True)
        logits = model(tokens.to(device))
        loss = F.cross_entropy(logits.flatten(0, 1), following.to(device).flatten())
        loss.backward()  # type: ignore[no-untyped-call]
        for i, block in enumerate(blocks):
            heads[i] += _head_taylor(block).abs()
            units[i] += _unit_taylor(block).abs()
            layers[i] += sum(float((p.detach() * p.grad).sum()) for p in block.parameters()
                             if p.grad is not None)
        channels += _channel_taylor(model).abs()
    model.zero_grad(set_to_none=True)
    model.train(was_training)
    return Importance(_group_scores(model, heads), tuple(units), channels, layers.abs())


def _head_taylor(block: ElasticBlock) -> torch.Tensor:
    attn, d = block.attn, block.attn.head_dim
    q = _taylor(attn.q.weight, 0) + _taylor(attn.q.bias, 0)
    out = _taylor(attn.out.weight, 1)
    per_head = (q + out).view(-1, d).sum(dim=1)
    kv = (_taylor(attn.k.weight, 0) + _taylor(attn.v.weight, 0) + _taylor(attn.k.bias, 0)
          + _taylor(attn.v.bias, 0)).view(-1, d).sum(dim=1)
    return per_head + kv.repeat_interleave(attn.group) / attn.group


def _unit_taylor(block: ElasticBlock) -> torch.Tensor:
    mlp = block.mlp
    total = _taylor(mlp.fc.weight, 0) + _taylor(mlp.fc.bias, 0) + _taylor(mlp.proj.weight, 1)
    if mlp.gate is not None:
        total = total + _taylor(mlp.gate.weight, 0) + _taylor(mlp.gate.bias, 0)
    return total


def _channel_taylor(model: ElasticGPT) -> torch.Tensor:
    total = _taylor(model.tok.weight, 1) + _taylor(model.head.weight, 1)
    if model.pos is not None:
        total = total + _taylor(model.pos.weight, 1)
    total = total + _taylor(model.norm.weight, 0)
    for block in _blocks(model):
        for layer in _by_input(block):
            total = total + _taylor(layer.weight, 1)
        for layer in (block.attn.out, block.mlp.proj):
            total = total + _taylor(layer.weight, 0) + _taylor(layer.bias, 0)
        for norm in (block.norm1, block.norm2):
            total = total + _taylor(norm.weight, 0) + _taylor(getattr(norm, "bias", None), 0)
    return total


def _by_input(block: ElasticBlock) -> list[nn.Linear]:
    """The linear layers reading the embedding channels."""
    layers = [block.attn.q, block.attn.k, block.attn.v, block.mlp.fc]
    return layers + ([block.mlp.gate] if block.mlp.gate is not None else [])


# -- reordering ------------------------------------------------------------------------------
def _rows(layer: nn.Linear, order: torch.Tensor) -> None:
    layer.weight.copy_(layer.weight[order])
    if layer.bias is not None:
        layer.bias.copy_(layer.bias[order])


def _expand(order: torch.Tensor, size: int) -> torch.Tensor:
    """A permutation of groups of ``size`` rows as a permutation of the rows."""
    return (order[:, None] * size + torch.arange(size)).flatten()


def _reorder_heads(block: ElasticBlock, groups: torch.Tensor) -> None:
    attn = block.attn
    d, g = attn.head_dim, attn.group
    query_rows = _expand(groups, g * d)
    kv_rows = _expand(groups, d)
    _rows(attn.q, query_rows)
    _rows(attn.k, kv_rows)
    _rows(attn.v, kv_rows)
    attn.out.weight.copy_(attn.out.weight[:, query_rows])


def _reorder_units(block: ElasticBlock, units: torch.Tensor) -> None:
    mlp = block.mlp
    _rows(mlp.fc, units)
    if mlp.gate is not None:
        _rows(mlp.gate, units)
    mlp.proj.weight.copy_(mlp.proj.weight[:, units])


def _reorder_channels(model: ElasticGPT, channels: torch.Tensor) -> None:
    for embedding in (model.tok, model.pos):
        if embedding is not None:
            embedding.weight.copy_(embedding.weight[:, channels])
    if model.head.weight is not model.tok.weight:
        model.head.weight.copy_(model.head.weight[:, channels])
    norms: list[Any] = [model.norm]
    for block in _blocks(model):
        norms += [block.norm1, block.norm2]
        for layer in _by_input(block):
            layer.weight.copy_(layer.weight[:, channels])
        for layer in (block.attn.out, block.mlp.proj):
            _rows(layer, channels)
    for norm in norms:
        for param in (getattr(norm, "weight", None), getattr(norm, "bias", None)):
            if param is not None:
                param.copy_(param[channels])


def reorder(model: ElasticGPT, importance: Importance) -> ElasticGPT:
    """Permute ``model``'s weights in place, most important parts first, and rank its layers
    (:meth:`~frugalnas.nn.transformer.ElasticGPT.set_layer_order`); returns ``model``."""
    groups, units, channels, layers = importance.orders()
    with torch.no_grad():
        for block, group_order, unit_order in zip(_blocks(model), groups, units):
            _reorder_heads(block, group_order)
            _reorder_units(block, unit_order)
        _reorder_channels(model, channels)
    model.set_layer_order(layers)
    return model
