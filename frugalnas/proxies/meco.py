"""MeCo: the minimum eigenvalue of the channel correlation of the feature maps.

Jiang, Wang, Bie, "MeCo: Zero-Shot NAS with One Data and Single Forward Pass via Minimum
Eigenvalue of Correlation", NeurIPS 2023. For one random input ``X`` and the feature map
``f_l(X)`` (``C_l`` channels of ``H_l x W_l`` values) of every layer ``l``:

    MeCo = sum_l lambda_min(P(f_l(X)))

where ``P`` is the ``C_l x C_l`` Pearson correlation matrix between the channels (each
channel's ``H_l W_l`` values are one variable). Channels that are less collinear give a
larger minimum eigenvalue, which the paper ties to faster convergence and better
generalisation. Undefined correlations (a constant channel) count as 0, as in the paper.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from frugalnas.ports.errors import check_range
from frugalnas.proxies.base import Proxy
from frugalnas.proxies.shared import SharedPasses


def min_correlation_eigenvalue(feature: torch.Tensor) -> float:
    """lambda_min of the channel correlation of one sample's feature map ``(C, ...)``;
    entries that are undefined (constant channels) are set to 0."""
    f = feature.reshape(feature.shape[0], -1).to(torch.float64)
    if f.shape[0] < 2 or f.shape[1] < 2:
        return 0.0
    f = f - f.mean(dim=1, keepdim=True)
    norm = f.norm(dim=1)
    corr = (f @ f.T) / (norm[:, None] * norm[None, :])
    corr = torch.nan_to_num(corr, nan=0.0, posinf=0.0, neginf=0.0)
    return float(torch.linalg.eigvalsh(corr)[0])


def min_correlation_eigenvalues(features: list[torch.Tensor]) -> list[float]:
    """:func:`min_correlation_eigenvalue` of each of ``features`` (one sample's feature maps
    ``(C, ...)``): the maps of one shape are stacked, centred, normalised and decomposed
    together. The arithmetic per map is the one-map function's, so are the values (bitwise
    on CPU at any thread count, ``tests/proxies/test_fast_scoring.py``)."""
    values = [0.0] * len(features)
    groups: dict[tuple[int, ...], list[int]] = {}
    for i, feature in enumerate(features):
        groups.setdefault(tuple(feature.shape), []).append(i)
    for shape, members in groups.items():
        if shape[0] < 2 or math.prod(shape[1:]) < 2:
            continue  # a single channel or a single value: 0, as one map alone
        f = torch.stack([features[i].reshape(shape[0], -1) for i in members]).to(torch.float64)
        f = f - f.mean(dim=2, keepdim=True)
        norm = f.norm(dim=2)
        # one product per map: a batched product splits its work over threads otherwise
        gram = torch.stack([one @ one.T for one in f])
        corr = gram / (norm[:, :, None] * norm[:, None, :])
        corr = torch.nan_to_num(corr, nan=0.0, posinf=0.0, neginf=0.0)
        for i, value in zip(members, torch.linalg.eigvalsh(corr)[:, 0].tolist()):
            values[i] = value
    return values


class MeCo(Proxy):
    """meco: sum over layers of the minimum eigenvalue of the channel correlation of the
    feature map of one random input (Jiang et al., NeurIPS 2023; data-free).

    The layers are the modules without children whose output is a 4-D feature map
    (convolutions, batch norms, activations, pooling, identities); ``samples`` random inputs
    are scored and averaged (the paper uses one)."""

    name = "meco"
    needs_data = False
    needs_labels = False
    passes = 1.0

    def __init__(self, samples: int = 1, seed: int = 0):
        check_range("meco samples", samples, 1)
        self.samples = samples
        self.seed = seed

    def compute(self, model, inputs, targets) -> float:
        total = [0.0]

        def add(feature: torch.Tensor) -> None:
            for sample in feature:
                total[0] += min_correlation_eigenvalue(sample)

        self._feature_maps(model, inputs, add)
        return total[0] / int(self.samples)

    def compute_shared(self, model, inputs, targets, shared: SharedPasses) -> float:
        """The same sum, the eigenvalues of all feature maps computed after the forward
        passes in batched calls (:func:`min_correlation_eigenvalues`), added in the order the
        one-map path adds them."""
        features: list[torch.Tensor] = []
        # a copy: a later in-place module (ReLU(inplace=True)) must not change a kept map
        self._feature_maps(model, inputs,
                           lambda out: features.extend(out.to(torch.float64, copy=True)))
        total = 0.0
        for value in min_correlation_eigenvalues(features):
            total += value
        return total / int(self.samples)

    def _feature_maps(self, model: nn.Module, inputs: torch.Tensor,
                      take: Callable[[torch.Tensor], None]) -> None:
        """Run the ``samples`` random inputs through ``model`` (training mode, one per
        forward, as the paper does) and hand every 4-D output of a module without children
        to ``take``, in the order they are made."""
        x = torch.randn((int(self.samples), *inputs.shape[1:]), device=inputs.device)

        def hook(module, inp, out) -> None:
            if isinstance(out, torch.Tensor) and out.dim() == 4:
                take(out.detach())

        leaves = [m for m in model.modules() if not list(m.children())]
        handles = [m.register_forward_hook(hook) for m in leaves]
        try:
            model.train()
            with torch.no_grad():
                for i in range(len(x)):
                    model(x[i:i + 1])
        finally:
            for h in handles:
                h.remove()

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        return forward_flops_per_sample * self.samples
