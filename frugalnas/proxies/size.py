"""Size proxies: params, flops, l2_norm (baselines in Abdelfattah et al., ICLR 2021)."""

from __future__ import annotations

from frugalnas.ports.cost import count_flops, count_params
from frugalnas.proxies.base import Proxy, weighted_layers


class Params(Proxy):
    """params: the number of trainable parameters (a strong baseline; Abdelfattah et al. 2021)."""

    name = "params"
    needs_data = False
    needs_labels = False
    passes = 0.0

    def compute(self, model, inputs, targets) -> float:
        return float(count_params(model))


class Flops(Proxy):
    """flops: forward FLOPs for one input sample (Abdelfattah et al. 2021)."""

    name = "flops"
    needs_data = False
    needs_labels = False
    passes = 1.0

    def compute(self, model, inputs, targets) -> float:
        return float(count_flops(model, inputs[:1]))

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        return forward_flops_per_sample


class L2Norm(Proxy):
    """l2_norm: sum over layers of the L2 norm of the initial weights (Abdelfattah et al. 2021)."""

    name = "l2_norm"
    needs_data = False
    needs_labels = False
    passes = 0.0

    def compute(self, model, inputs, targets) -> float:
        return float(sum(m.weight.detach().norm() for m in weighted_layers(model)))
