"""TE-NAS's two indicators: the condition number of the neural tangent kernel, and the number
of linear regions.

Chen, Gong, Wang, "Neural Architecture Search on ImageNet in Four GPU Hours: A
Theoretically Inspired Perspective", ICLR 2021.

* **Trainability**, the condition number of the empirical NTK on a batch:
  ``Theta = J J^T`` with ``J[i] = d(sum_k f_k(x_i)) / d(weights)``, the gradient of sample
  ``i``'s summed logits with respect to every weight tensor; ``kappa = lambda_max /
  lambda_min``. A smaller ``kappa`` trains faster, so the proxy is ``-kappa``.
* **Expressivity**, the number of linear regions the ReLU network cuts its input space into,
  estimated by the number of distinct activation patterns (one binary vector over all ReLU
  units per input) over many random Gaussian inputs at a low resolution.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import torch
from torch import nn

from frugalnas.ports.errors import check_range
from frugalnas.proxies.base import Proxy
from frugalnas.proxies.shared import SharedPasses
from frugalnas.proxies.swap import pack_bits

#: -kappa of a kernel that is singular to working precision (or of a dead network)
MAX_CONDITION = 1e12


def ntk_condition_number(gram: torch.Tensor) -> float:
    """lambda_max / lambda_min of a symmetric PSD kernel, capped at ``MAX_CONDITION``
    (a kernel that is zero or singular to working precision gets the cap)."""
    eig = torch.linalg.eigvalsh(gram.to(torch.float64))
    top, low = float(eig[-1]), float(eig[0])
    if not top > 0:
        return MAX_CONDITION
    return min(top / max(low, top / MAX_CONDITION), MAX_CONDITION)


class NTKCondition(Proxy):
    """ntk_cond: minus the condition number of the empirical NTK of ``samples`` inputs
    (gradients of each sample's summed logits w.r.t. every weight tensor; Chen et al.,
    ICLR 2021).

    It needs one backward per sample (``samples`` of them, each through the graph of a
    forward of ``samples`` inputs), so its cost grows as ``samples^2``: with the default 8
    samples of a 64-sample batch about one forward+backward of the full batch, with 16
    about four. TE-NAS computes the kernel on larger batches; 8 keeps the cost of the
    other proxies, at the price of a noisier estimate."""

    name = "ntk_cond"
    needs_data = True
    needs_labels = False
    passes = 3.0

    def __init__(self, samples: int = 8):
        check_range("ntk_cond samples", samples, 2)
        self.samples = samples

    def compute(self, model, inputs, targets) -> float:
        rows: list[torch.Tensor] = []
        self._gradients(model, inputs, lambda i, grads: rows.append(
            torch.cat([g.reshape(-1) for g in grads]).to(torch.float64)))
        jac = torch.stack(rows)
        return -ntk_condition_number(jac @ jac.T)

    def compute_shared(self, model, inputs, targets, shared: SharedPasses) -> float:
        """The same value, each sample's gradients written straight into one float64
        Jacobian (no per-sample concatenation, conversion and stacking): the same matrix,
        hence the same kernel and condition number."""
        jac: list[torch.Tensor] = []

        def put(i: int, grads: Sequence[torch.Tensor]) -> None:
            if not jac:
                size = sum(g.numel() for g in grads)
                jac.append(grads[0].new_empty((min(len(inputs), int(self.samples)), size),
                                              dtype=torch.float64))
            torch.cat([g.reshape(-1) for g in grads], out=jac[0][i])

        self._gradients(model, inputs, put)
        return -ntk_condition_number(jac[0] @ jac[0].T)

    def _gradients(self, model: nn.Module, inputs: torch.Tensor,
                   put: Callable[[int, Sequence[torch.Tensor]], None],
                   batched: bool | None = None) -> None:
        """One training-mode forward of the first ``samples`` inputs, then the backward of
        each sample's summed logits, handing ``put(i, gradients)`` the gradients of every
        weight tensor (zeros for weights it does not reach). The backward passes run one
        per sample, or (``batched``; by default on CUDA, where one launch per kernel for all
        samples beats one per sample) as one batched backward over the samples' one-hot
        cotangents, which gives the same gradients."""
        model.train()
        weights = [p for n, p in model.named_parameters() if n.endswith("weight")]
        for w in weights:
            w.requires_grad_(True)
        x = inputs[: int(self.samples)]
        out = model(x).reshape(len(x), -1).sum(dim=1)
        if batched if batched is not None else out.device.type == "cuda":
            grads = torch.autograd.grad(out, weights, torch.eye(len(x), device=out.device,
                                                                dtype=out.dtype),
                                        is_grads_batched=True, allow_unused=True,
                                        materialize_grads=True)
            for i in range(len(x)):
                put(i, [g[i] for g in grads])
            return
        for i in range(len(x)):
            put(i, torch.autograd.grad(out[i], weights, retain_graph=i < len(x) - 1,
                                       allow_unused=True, materialize_grads=True))

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        n = min(batch_size, self.samples)
        return forward_flops_per_sample * n * (1 + 2 * n)


def activation_regions(model: nn.Module, inputs: torch.Tensor, channels: int | None = None) -> int:
    """The number of distinct activation patterns (one per input: the sign of every unit of
    every ``nn.ReLU`` on a 4-D feature map, or of its first ``channels`` channels) over
    ``inputs`` (one training-mode forward)."""
    codes: list[torch.Tensor] = []

    def hook(module, inp, out) -> None:
        if inp and isinstance(inp[0], torch.Tensor) and inp[0].dim() == 4:
            out = out.detach() if channels is None else out.detach()[:, :channels]
            codes.append(pack_bits(out.reshape(out.shape[0], -1) > 0))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.ReLU)]
    try:
        model.train()
        with torch.no_grad():
            model(inputs)
    finally:
        for h in handles:
            h.remove()
    if not codes:
        return 1
    return int(torch.unique(torch.cat(codes, dim=1), dim=0).shape[0])


class LinearRegions(Proxy):
    """linear_regions: number of distinct ReLU activation patterns over ``samples`` Gaussian
    inputs of ``size x size`` pixels, an estimate of the number of linear regions (Chen et
    al., ICLR 2021; data-free).

    TE-NAS counts regions with 3x3 inputs on a thin copy of the architecture (one channel,
    one cell per stage, no stem), so that the count stays below the number of samples. A
    proxy sees only the network it is given: ``channels`` (default 1) restricts the patterns
    to the units of the first channels of every ReLU layer, a thin view of the same network,
    and the inputs are 1x1 by default, because on NB201's N=5 networks the 3x3 count
    saturates at ``samples`` (7 of 8 random cells measured 1000 of 1000, even with one
    channel). ``channels=None`` counts every unit."""

    families = ("convolutional",)
    reads = "ReLU activation patterns on tiny images"

    name = "linear_regions"
    needs_data = False
    needs_labels = False
    passes = 1.0

    def __init__(self, samples: int = 1000, size: int = 1, channels: int | None = 1,
                 seed: int = 0):
        check_range("linear_regions samples", samples, 2)
        check_range("linear_regions size", size, 1)
        if channels is not None:
            check_range("linear_regions channels", channels, 1)
        self.samples, self.size, self.channels, self.seed = samples, size, channels, seed

    def compute(self, model, inputs, targets) -> float:
        x = torch.randn((int(self.samples), inputs.shape[1], int(self.size), int(self.size)),
                        device=inputs.device)
        return float(activation_regions(model, x, self.channels))

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        return 0.0  # tiny inputs; not derivable from the full-size forward
