"""Activation-based zero-cost proxies: naswot, jacob_cov, zen."""

from __future__ import annotations

import copy

import numpy as np
import torch
from torch import nn

from frugalnas.proxies.base import Proxy, finite_log
from frugalnas.proxies.shared import SharedPasses, shared_value

#: Score of a network whose kernel is singular or whose output does not depend on its input.
DEAD_SCORE = -1e6


class Naswot(Proxy):
    """naswot: log|det K| of the kernel of binary ReLU activation codes over one batch.

    K[i, j] = number of ReLU units on which samples i and j agree (Mellor et al., "Neural
    Architecture Search without Training", ICML 2021)."""

    families = ("convolutional",)
    reads = "ReLU activation patterns"

    name = "naswot"
    needs_data = True
    needs_labels = False
    passes = 1.0

    def compute(self, model, inputs, targets) -> float:
        n = inputs.shape[0]
        kernel = torch.zeros((n, n), dtype=torch.float64, device=inputs.device)

        def hook(module, inp, out) -> None:
            codes = (inp[0].detach().reshape(n, -1) > 0).float()
            # agreements = both on + both off = F - s_i - s_j + 2 c_i.c_j; float32 counts are
            # exact below 2^24, and the sum over layers is kept in float64
            on = codes.sum(1, dtype=torch.float64)
            both = (codes @ codes.T).double()
            kernel.add_(codes.shape[1] - on[:, None] - on[None, :] + 2.0 * both)

        relus = [m for m in model.modules() if isinstance(m, nn.ReLU)]
        handles = [m.register_forward_hook(hook) for m in relus]
        try:
            model.train()
            with torch.no_grad():
                model(inputs)
        finally:
            for h in handles:
                h.remove()
        sign, logdet = torch.linalg.slogdet(kernel)
        return float(logdet) if sign > 0 and torch.isfinite(logdet) else DEAD_SCORE


class JacobCov(Proxy):
    """jacob_cov: how uncorrelated the input Jacobians of the batch are.

    -sum(log(v + k) + 1 / (v + k)) over the eigenvalues v of their correlation matrix,
    k = 1e-5 (Mellor et al., arXiv:2006.04647v1; as in Abdelfattah et al. 2021)."""

    name = "jacob_cov"
    needs_data = True
    needs_labels = False

    def compute(self, model, inputs, targets) -> float:
        return self.compute_shared(model, inputs, targets, None)

    def compute_shared(self, model, inputs, targets, shared) -> float:
        jac, _ = input_jacobians(model, inputs, shared)
        if not np.all(np.isfinite(jac)) or np.any(jac.std(axis=1) == 0):
            return DEAD_SCORE
        corrs = np.corrcoef(jac)
        v = np.linalg.eigvalsh(corrs)
        k = 1e-5
        v = np.clip(v, 0.0, None)
        return float(-np.sum(np.log(v + k) + 1.0 / (v + k)))


def input_jacobians(model: nn.Module, inputs: torch.Tensor,
                    shared: SharedPasses | None = None) -> tuple[np.ndarray, int]:
    """The per-sample input Jacobians of the summed outputs, ``d(sum_k f_k(x_i)) / d x_i``
    flattened, as a read-only float64 array ``(n, inputs[0].numel())``, and the number of
    outputs per sample (one training-mode forward and one backward). Shared by jacob_cov and
    epe_nas (key ``input_jacobian``: nothing random is drawn); an input the output does
    not depend on has a zero Jacobian."""
    def run() -> tuple[np.ndarray, int]:
        model.train()
        x = inputs.detach().clone().requires_grad_(True)
        out = model(x)
        (jac,) = torch.autograd.grad(out, x, torch.ones_like(out), allow_unused=True,
                                     materialize_grads=True)
        jac = jac.reshape(len(x), -1).to(torch.float64).cpu().numpy()
        jac.flags.writeable = False
        return jac, int(out.shape[-1])

    return shared_value(shared, ("input_jacobian",), run)


class Zen(Proxy):
    """zen: Zen-score, expressivity of the pre-pooling features on Gaussian inputs (data-free).

    log E||f(x) - f(x + a e)||_1 + sum over batch-norm layers of log sqrt(mean batch
    variance); f the pre-pooling feature map, x and e Gaussian, a = ``mixup_gamma`` = 0.01,
    weights redrawn from N(0, 1) (Lin et al., "Zen-NAS", ICCV 2021). Runs on a copy."""

    name = "zen"
    needs_data = False
    needs_labels = False
    passes = 2.0

    def __init__(self, mixup_gamma: float = 0.01, repeat: int = 1, seed: int = 0):
        self.mixup_gamma = mixup_gamma
        self.repeat = repeat
        self.seed = seed

    def compute(self, model, inputs, targets) -> float:
        net = copy.deepcopy(model)
        g = torch.Generator(device=inputs.device).manual_seed(self.seed)
        scores = []
        for _ in range(self.repeat):
            self._gaussian_init(net, g)
            x = torch.randn(inputs.shape, generator=g, device=inputs.device)
            eps = torch.randn(inputs.shape, generator=g, device=inputs.device)
            with torch.no_grad():
                net.train()
                a = _pre_pool_features(net, x)
                # BN uses batch statistics; the running variance kept is the mixed batch's,
                # as in the authors' code (the two batches differ by 1% noise).
                b = _pre_pool_features(net, x + self.mixup_gamma * eps)
            delta = (a - b).abs().flatten(1).sum(1).mean()
            log_bn = sum(finite_log(float(m.running_var.mean().sqrt()))
                         for m in net.modules() if isinstance(m, nn.BatchNorm2d))
            scores.append(finite_log(float(delta)) + log_bn)
        return float(np.mean(scores))

    @staticmethod
    def _gaussian_init(net: nn.Module, g: torch.Generator) -> None:
        with torch.no_grad():
            for m in net.modules():
                if isinstance(m, (nn.Conv2d, nn.Linear)):
                    m.weight.copy_(torch.randn(m.weight.shape, generator=g, device=m.weight.device))
                    if m.bias is not None:
                        m.bias.zero_()
                elif isinstance(m, nn.modules.batchnorm._BatchNorm):
                    # momentum 1: running_var becomes exactly this batch's variance
                    m.momentum = 1.0
                    if m.affine:
                        m.weight.fill_(1.0)
                        m.bias.zero_()

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        return 2.0 * self.repeat * forward_flops_per_sample * batch_size


def _pre_pool_features(net: nn.Module, x: torch.Tensor) -> torch.Tensor:
    """The last 4-D activation computed by a leaf module: the feature map before global
    pooling for the usual conv-net layout (works for any module tree without a special API)."""
    last: list[torch.Tensor] = []

    def hook(module, inp, out) -> None:
        if isinstance(out, torch.Tensor) and out.dim() == 4:
            last[:] = [out]

    leaves = [m for m in net.modules() if not list(m.children())]
    handles = [m.register_forward_hook(hook) for m in leaves]
    try:
        out = net(x)
    finally:
        for h in handles:
            h.remove()
    return last[0] if last else out
