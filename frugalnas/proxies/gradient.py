"""Gradient-based zero-cost proxies: grad_norm, snip, grasp, fisher, plain, synflow.

Definitions follow Abdelfattah et al., "Zero-Cost Proxies for Lightweight NAS", ICLR 2021,
which adapts pruning-at-initialisation saliencies to score whole networks by summing the
per-weight (or per-channel) saliency over every convolution and linear layer."""

from __future__ import annotations

import copy
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, sdpa_kernel

from frugalnas.proxies.base import Proxy, weighted_layers


def _backward_loss(model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None) -> None:
    model.train()
    model.zero_grad(set_to_none=True)
    out = model(inputs)
    F.cross_entropy(out, targets).backward()


class GradNorm(Proxy):
    """grad_norm: sum over layers of the L2 norm of the loss gradient (Abdelfattah et al. 2021)."""

    name = "grad_norm"
    needs_data = True
    needs_labels = True

    def compute(self, model, inputs, targets) -> float:
        _backward_loss(model, inputs, targets)
        return float(sum(m.weight.grad.norm() for m in weighted_layers(model)
                         if m.weight.grad is not None))


class Snip(Proxy):
    """snip: sum of |dL/dw * w| over all weights.

    Lee et al., ICLR 2019; as a network score by Abdelfattah et al. 2021."""

    name = "snip"
    needs_data = True
    needs_labels = True

    def compute(self, model, inputs, targets) -> float:
        _backward_loss(model, inputs, targets)
        return float(sum((m.weight.grad * m.weight.detach()).abs().sum() for m in weighted_layers(model)
                         if m.weight.grad is not None))


class Plain(Proxy):
    """plain: sum of dL/dw * w over all weights, signs kept.

    Mozer & Smolensky 1989; as a network score by Abdelfattah et al. 2021."""

    name = "plain"
    needs_data = True
    needs_labels = True

    def compute(self, model, inputs, targets) -> float:
        _backward_loss(model, inputs, targets)
        return float(sum((m.weight.grad * m.weight.detach()).sum() for m in weighted_layers(model)
                         if m.weight.grad is not None))


class Grasp(Proxy):
    """grasp: sum of -w * (H g), H g the Hessian-gradient product of the loss.

    Wang et al., ICLR 2020; as a network score by Abdelfattah et al. 2021. Needs a double
    backward, so attention runs as plain operations (the fused attention kernels have no
    second derivative)."""

    name = "grasp"
    needs_data = True
    needs_labels = True
    passes = 7.0  # two forwards, a backward and a double backward

    def compute(self, model, inputs, targets) -> float:
        model.train()
        layers = weighted_layers(model)
        weights = [m.weight for m in layers]
        for w in weights:
            w.requires_grad_(True)
        model.zero_grad(set_to_none=True)
        with sdpa_kernel(SDPBackend.MATH):
            loss = F.cross_entropy(model(inputs), targets)
            g_first = [g.detach() for g in torch.autograd.grad(
                loss, weights, allow_unused=True, materialize_grads=True)]
            loss = F.cross_entropy(model(inputs), targets)
            g_second = torch.autograd.grad(loss, weights, create_graph=True,
                                           allow_unused=True, materialize_grads=True)
            z = sum((a * b).sum() for a, b in zip(g_first, g_second))
            if not z.requires_grad:  # no weight reaches the loss
                return 0.0
            hg = torch.autograd.grad(z, weights, allow_unused=True, materialize_grads=True)
        return float(sum((-w.detach() * h).sum() for w, h in zip(weights, hg)))


class Fisher(Proxy):
    """fisher: sum over channels of 0.5 * E_batch[(sum_spatial a * dL/da)^2].

    ``a`` is each convolution or linear output (Theis et al. 2018; Turner et al., ICLR 2020;
    Abdelfattah et al. 2021)."""

    name = "fisher"
    needs_data = True
    needs_labels = True

    def compute(self, model, inputs, targets) -> float:
        total: list[torch.Tensor] = []

        def on_grad(act: torch.Tensor):
            def hook(grad: torch.Tensor) -> None:
                prod = act.detach() * grad
                if prod.dim() > 2:
                    prod = prod.sum(dim=tuple(range(2, prod.dim())))
                total.append(prod.pow(2).mean(0).mul(0.5).sum())
            return hook

        def forward_hook(module, inp, out) -> None:
            if out.requires_grad:
                out.register_hook(on_grad(out))

        handles = [m.register_forward_hook(forward_hook) for m in weighted_layers(model)]
        try:
            _backward_loss(model, inputs, targets)
        finally:
            for h in handles:
                h.remove()
        return float(sum(total)) if total else 0.0


class Synflow(Proxy):
    """synflow: synaptic flow, sum of |w * dR/dw| on an all-ones input (data-free).

    R is the output sum of the network with absolute-valued weights, in double precision,
    batch-norm in evaluation mode (Tanaka et al., NeurIPS 2020; as a network score by
    Abdelfattah et al. 2021)."""

    name = "synflow"
    needs_data = False
    needs_labels = False
    passes: ClassVar[float] = 3.0

    def compute(self, model, inputs, targets) -> float:
        # Absolute-valued float64 copies of the tensors, run through the caller's network
        # (functional_call): its own weights are never touched, and no module is copied (a
        # deepcopy of the network cost twice the proxy itself on small cells).
        named = dict(model.named_parameters())
        layers = [f"{n}.weight" for n, m in model.named_modules()
                  if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
        shared = len(list(model.named_parameters(remove_duplicate=False))) != len(named)
        if shared or any(name not in named for name in layers):
            # A module or weight reached by two paths: functional_call would not restore
            # it, so the network is copied instead.
            return self._on_a_copy(model, inputs)
        params = {n: p.detach().double().abs().requires_grad_(p.requires_grad)
                  for n, p in named.items()}
        buffers = {n: b.double() if b.is_floating_point() else b
                   for n, b in model.named_buffers()}
        modes = [(m, m.training) for m in model.modules()]
        ones = torch.ones((1, *inputs.shape[1:]), dtype=torch.float64, device=inputs.device)
        try:
            model.eval()
            torch.func.functional_call(model, (params, buffers), (ones,)).sum().backward()
        finally:
            for m, mode in modes:
                m.training = mode
        weights = [params[name] for name in layers]
        return float(sum((w.detach() * w.grad).abs().sum() for w in weights
                         if w.grad is not None))

    @staticmethod
    def _on_a_copy(model, inputs) -> float:
        """The same score on an absolute-valued float64 copy of the network, for networks
        whose layers hold weights that are not their parameters (shared weight stores)."""
        net = copy.deepcopy(model).double().eval()
        with torch.no_grad():
            for p in net.parameters():
                p.abs_()
        net.zero_grad(set_to_none=True)
        ones = torch.ones((1, *inputs.shape[1:]), dtype=torch.float64, device=inputs.device)
        net(ones).sum().backward()
        return float(sum((m.weight.detach() * m.weight.grad).abs().sum()
                         for m in weighted_layers(net) if m.weight.grad is not None))

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        return self.passes * forward_flops_per_sample  # one all-ones sample
