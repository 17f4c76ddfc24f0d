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

import torch

from frugalnas.ports.errors import check_range
from frugalnas.proxies.base import Proxy


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
        x = torch.randn((int(self.samples), *inputs.shape[1:]), device=inputs.device)
        total = [0.0]

        def hook(module, inp, out) -> None:
            if isinstance(out, torch.Tensor) and out.dim() == 4:
                for sample in out.detach():
                    total[0] += min_correlation_eigenvalue(sample)

        leaves = [m for m in model.modules() if not list(m.children())]
        handles = [m.register_forward_hook(hook) for m in leaves]
        try:
            model.train()
            with torch.no_grad():
                for i in range(len(x)):  # one sample per forward, as the paper does
                    model(x[i:i + 1])
        finally:
            for h in handles:
                h.remove()
        return total[0] / len(x)

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        return forward_flops_per_sample * self.samples
