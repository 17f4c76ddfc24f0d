"""ZiCo: the inverse coefficient of variation of the loss gradients.

Li, Yang, Wang, Marculescu, "ZiCo: Zero-shot NAS via Inverse Coefficient of Variation on
Gradients", ICLR 2023. For every convolution and linear layer ``l`` with weights
``theta_l``, over ``S`` mini-batches ``b``:

    ZiCo = sum_l log( sum_{w in theta_l, sigma_w > 0} E_b[|g_w(b)|] / sigma_w ),
    sigma_w = sqrt(Var_b[g_w(b)])

where ``g_w(b)`` is the gradient of the cross-entropy loss of batch ``b`` with respect to
``w``. Gradients that are consistent across batches (large mean, small spread) mean fast and
well-generalising training. frugalnas scores one batch, so the batches are ``splits`` equal
parts of it (the paper's experiments use two batches); each part is a separate
forward+backward, so the proxy costs one forward+backward of the whole batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F

from frugalnas.ports.errors import check_range
from frugalnas.proxies.base import Proxy, weighted_layers


class ZiCo(Proxy):
    """zico: sum over layers of log sum |E[g]| / std[g], gradients over batch parts (Li et
    al., ICLR 2023)."""

    name = "zico"
    needs_data = True
    needs_labels = True
    passes = 3.0

    def __init__(self, splits: int = 2):
        check_range("zico splits", splits, 2)
        self.splits = splits

    def compute(self, model, inputs, targets) -> float:
        model.train()
        layers = weighted_layers(model)
        grads: list[list[torch.Tensor]] = [[] for _ in layers]
        parts = max(2, min(int(self.splits), len(inputs)))
        for x, y in zip(torch.tensor_split(inputs, parts), torch.tensor_split(targets, parts)):
            model.zero_grad(set_to_none=True)
            F.cross_entropy(model(x), y).backward()
            for store, layer in zip(grads, layers):
                g = layer.weight.grad
                store.append(torch.zeros_like(layer.weight) if g is None
                             else g.detach().to(torch.float64).clone())
        model.zero_grad(set_to_none=True)
        return zico_from_gradients([torch.stack(g) for g in grads])


def zico_from_gradients(per_layer: list[torch.Tensor]) -> float:
    """ZiCo from per-layer gradients stacked over batches (``(S, *weight.shape)`` each):
    sum over layers of log(sum over weights with non-zero spread of mean|g| / std(g));
    population statistics over the ``S`` batches; layers whose sum is 0 add nothing."""
    total = 0.0
    for g in per_layer:
        g = g.reshape(g.shape[0], -1).to(torch.float64)
        std = g.std(dim=0, unbiased=False)
        keep = std > 0
        ratio = float((g.abs().mean(dim=0)[keep] / std[keep]).sum())
        if ratio > 0 and math.isfinite(ratio):
            total += math.log(ratio)
    return total
