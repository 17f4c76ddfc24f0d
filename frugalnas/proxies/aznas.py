"""The AZ-NAS signals: expressivity, progressivity and trainability.

Lee & Ham, "AZ-NAS: Assembling Zero-Cost Proxies for Network Architecture Search", CVPR
2024. The network is seen as a chain of primary blocks with outputs ``f_0 (stem), f_1, ...,
f_L`` (for NB201: the stem, every cell and every residual reduction block), weights
re-initialised with Kaiming normal (fan-in) as in the paper.

* **Expressivity** of block ``l``: the entropy of the normalised eigenvalue spectrum of the
  channel covariance of ``f_l`` (every position of every sample a ``C``-dimensional point),
  ``s^E_l = -sum_i p_i log p_i``, ``p = lambda / sum(lambda)``: how isotropically the
  features fill their space. ``s^E = sum_l s^E_l``.
* **Progressivity**: ``s^P = min_l (s^E_l - s^E_{l-1})``, expressivity should grow with depth.
* **Trainability**: for each block, a Rademacher vector ``g_out`` at its output is
  back-propagated to its input (``g_in``); ``sigma_l`` is the spectral norm of
  ``E[g_in g_out^T]`` (positions and samples averaged; ``g_in`` space-to-depth rearranged
  when the block halves the resolution), an estimate of the block's Jacobian norm.
  ``s^T = mean_l (2 - sigma_l - 1 / sigma_l)``, best (0) at ``sigma = 1``, the gradient
  neither explodes nor vanishes. A block whose Jacobian is exactly the identity is
  penalised, as in the paper.
* **Complexity** is the FLOP count (the existing ``flops`` proxy).

AZ-NAS ranks networks by each signal and sums the logarithms of the percentile ranks: the
``rank-ensemble`` estimator with ``aggregation="log-rank"`` and the proxies
``az_expressivity, az_progressivity, az_trainability, flops``.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.ports.errors import check_choice
from frugalnas.ports.network import BlockNetwork
from frugalnas.proxies.activation import DEAD_SCORE
from frugalnas.proxies.base import Proxy
from frugalnas.proxies.shared import SharedPasses, shared_value

INITS = ("kaiming", "none")


def kaiming_init(model: nn.Module) -> None:
    """Kaiming normal (fan-in, ReLU gain) conv and linear weights, zero biases, batch-norm
    affine 1/0, drawn from torch's RNG."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                nn.init.kaiming_normal_(m.weight, mode="fan_in", nonlinearity="relu")
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
                m.weight.fill_(1.0)
                m.bias.zero_()


def primary_blocks(model: nn.Module) -> list[nn.Module]:
    """The chain of blocks whose outputs AZ-NAS scores: ``model.forward_blocks()`` when the
    network declares them (a :class:`~frugalnas.ports.network.BlockNetwork`, as NB201 and DAG
    networks do: stem, cells, reductions), else its direct children."""
    if isinstance(model, BlockNetwork):
        return list(model.forward_blocks())
    return list(model.children())


def block_features(model: nn.Module, inputs: torch.Tensor, grad: bool) -> list[torch.Tensor]:
    """The 4-D outputs of the primary blocks, in execution order (one training-mode
    forward; with ``grad`` the graph between them is kept)."""
    feats: list[torch.Tensor] = []

    def hook(module, inp, out) -> None:
        if isinstance(out, torch.Tensor) and out.dim() == 4:
            feats.append(out)

    handles = [b.register_forward_hook(hook) for b in primary_blocks(model)]
    try:
        model.train()
        with torch.set_grad_enabled(grad):
            model(inputs.detach().clone().requires_grad_(grad))
    finally:
        for h in handles:
            h.remove()
    return feats


def spectral_entropy(feature: torch.Tensor) -> float:
    """Entropy of the normalised eigenvalues of the channel covariance of ``(B, C, H, W)``
    (nan when the covariance is zero)."""
    f = feature.detach().to(torch.float64).permute(0, 2, 3, 1).reshape(-1, feature.shape[1])
    f = f - f.mean(dim=0, keepdim=True)
    cov = f.T @ f / len(f)
    eig = torch.linalg.eigvalsh(cov).clamp(min=0.0)
    total = float(eig.sum())
    if not total > 0 or not math.isfinite(total):
        return math.nan
    p = eig / total
    return float(-torch.special.xlogy(p, p).sum())


class _AZProxy(Proxy):
    families = ("convolutional",)
    reads = "the 4-D feature maps of convolutional blocks"
    needs_data = True
    needs_labels = False
    passes = 1.0

    def __init__(self, init: str = "kaiming", seed: int = 0):
        check_choice("AZ-NAS init", init, INITS)
        self.init, self.seed = init, seed

    def _prepare(self, model: nn.Module) -> None:
        if self.init == "kaiming":
            kaiming_init(model)

    def _entropies(self, model: nn.Module, inputs: torch.Tensor,
                   shared: SharedPasses | None = None) -> tuple[float, ...]:
        """The spectral entropy of every primary block's output after the
        re-initialisation; shared by az_expressivity and az_progressivity (the key holds
        what it depends on besides the network and batch: the init and the seed)."""
        def run() -> tuple[float, ...]:
            self._prepare(model)
            return tuple(spectral_entropy(f) for f in block_features(model, inputs, grad=False))

        return shared_value(shared, ("az_nas.entropies", self.init, int(self.seed)), run)

    def compute(self, model, inputs, targets) -> float:
        return self.compute_shared(model, inputs, targets, None)


class AZExpressivity(_AZProxy):
    """az_expressivity: sum over primary blocks of the entropy of the normalised channel
    covariance spectrum of their outputs (AZ-NAS, Lee & Ham, CVPR 2024)."""

    name = "az_expressivity"

    def compute_shared(self, model, inputs, targets, shared) -> float:
        ent = self._entropies(model, inputs, shared)
        if not ent or any(math.isnan(e) for e in ent):
            return DEAD_SCORE
        return float(sum(ent))


class AZProgressivity(_AZProxy):
    """az_progressivity: the smallest increase of block expressivity from one primary block
    to the next (AZ-NAS, Lee & Ham, CVPR 2024)."""

    name = "az_progressivity"

    def compute_shared(self, model, inputs, targets, shared) -> float:
        ent = self._entropies(model, inputs, shared)
        if len(ent) < 2 or any(math.isnan(e) for e in ent):
            return DEAD_SCORE
        return float(min(b - a for a, b in zip(ent, ent[1:])))


def _space_to_depth(g: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Rearrange ``g`` (B, C, H, W) to ``(B, C r^2, height, width)``, r = ceil(H / height),
    zero-padding H and W to multiples of r."""
    r = max(1, -(-g.shape[2] // height), -(-g.shape[3] // width))
    if r == 1:
        return g
    pad_h, pad_w = height * r - g.shape[2], width * r - g.shape[3]
    if pad_h or pad_w:
        g = F.pad(g, (0, max(pad_w, 0), 0, max(pad_h, 0)))[:, :, :height * r, :width * r]
    return F.pixel_unshuffle(g, r)


def block_jacobian_norm(g_in: torch.Tensor, g_out: torch.Tensor) -> float:
    """Spectral norm of ``E[g_in g_out^T]`` over samples and positions (``g_in``
    rearranged to ``g_out``'s resolution)."""
    b, c_out, h, w = g_out.shape
    g_in = _space_to_depth(g_in, h, w)
    a = g_in.to(torch.float64).permute(0, 2, 3, 1).reshape(-1, g_in.shape[1])
    o = g_out.to(torch.float64).permute(0, 2, 3, 1).reshape(-1, c_out)
    return float(torch.linalg.matrix_norm(a.T @ o / len(o), ord=2))


class AZTrainability(_AZProxy):  # shares nothing: its pass keeps the graph
    """az_trainability: mean over primary blocks of 2 - sigma - 1/sigma, sigma the spectral
    norm of the block's Jacobian estimated with a Rademacher vector (AZ-NAS, Lee & Ham,
    CVPR 2024)."""

    name = "az_trainability"
    passes = 2.0

    def compute_shared(self, model, inputs, targets, shared) -> float:
        return self.compute(model, inputs, targets)

    def compute(self, model, inputs, targets) -> float:
        self._prepare(model)
        feats = block_features(model, inputs, grad=True)
        if len(feats) < 2:
            return DEAD_SCORE
        scores = []
        for f_in, f_out in zip(feats[:-1], feats[1:]):
            g_out = torch.randint(0, 2, f_out.shape, device=f_out.device).to(f_out.dtype) * 2 - 1
            (g_in,) = torch.autograd.grad(f_out, f_in, g_out, retain_graph=True,
                                          allow_unused=True, materialize_grads=True)
            if g_in.shape == g_out.shape and torch.equal(g_in, g_out):
                scores.append(DEAD_SCORE)  # an identity block: the paper scores it -inf
                continue
            sigma = block_jacobian_norm(g_in, g_out)
            sigma = max(sigma, 1e-6)
            scores.append(2.0 - sigma - 1.0 / sigma)
        return float(sum(scores) / len(scores))
