"""SWAP: the number of distinct sample-wise activation patterns, and its regularised form.

Peng, Song, Fayek, Ciesielski, Chang, "SWAP-NAS: Sample-Wise Activation Patterns for
Ultra-fast NAS", ICLR 2024. Feed a batch of ``S`` samples; every ReLU unit ``n`` (one
channel at one position of one layer) has a *sample-wise* pattern, the binary vector
``(1[a_n(x_1) > 0], ..., 1[a_n(x_S) > 0])``. The SWAP-Score is the number of distinct
patterns over all units of the network:

    SWAP = |{ p_n : n a ReLU unit }|

A standard activation pattern (one vector per sample, as NASWOT uses) can take at most ``S``
distinct values; a sample-wise one up to ``2^S``, so the score keeps resolving large
networks. The regularised SWAP-Score multiplies by ``f(Theta) = exp(-(Theta - mu)^2 / sigma)``,
``Theta`` the parameter count in thousands, to steer the search to a model size ``mu``
(``sigma`` sets how sharply). The authors' code redraws conv and linear weights from
N(0, 1) (batch-norm weights 1, biases 0) before scoring, as ``init="gaussian"`` does here.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

from frugalnas.ports.cost import count_params
from frugalnas.ports.errors import check_choice, check_range
from frugalnas.proxies.base import Proxy
from frugalnas.proxies.shared import SharedPasses, shared_value

INITS = ("gaussian", "none")
#: NB201 benchmark networks (N=5, C=16, 10 classes): largest and mean parameter count, in
#: thousands, over all 15,625 cells (frugalnas/data table); the defaults of ``swap_reg``.
NB201_MAX_KPARAMS = 1531.546
NB201_MEAN_KPARAMS = 398.554
#: up to this many samples :func:`sample_wise_pattern_count` counts with a table of
#: 2^samples flags (1 MiB) instead of sorting
TABLE_SAMPLES = 20


def pack_bits(bits: torch.Tensor) -> torch.Tensor:
    """Pack a boolean matrix ``(rows, n)`` into int64 words ``(rows, ceil(n / 62))``: equal
    rows give equal words and different rows different words."""
    rows, n = bits.shape
    width = 62
    if n <= width:
        weights = torch.pow(2, torch.arange(n, device=bits.device, dtype=torch.int64))
        return (bits.to(torch.int64) * weights).sum(dim=1, keepdim=True)  # no int matmul on GPUs
    words = -(-n // width)
    padded = torch.zeros((rows, words * width), dtype=torch.int64, device=bits.device)
    padded[:, :n] = bits.to(torch.int64)
    weights = torch.pow(2, torch.arange(width, device=bits.device, dtype=torch.int64))
    return (padded.reshape(rows, words, width) * weights).sum(dim=2)


def gaussian_init(model: nn.Module) -> None:
    """Conv and linear weights from N(0, 1) (torch's RNG), biases 0, batch-norm affine 1/0."""
    with torch.no_grad():
        for m in model.modules():
            if isinstance(m, (nn.Conv2d, nn.Linear)):
                m.weight.normal_()
                if m.bias is not None:
                    m.bias.zero_()
            elif isinstance(m, nn.modules.batchnorm._BatchNorm) and m.affine:
                m.weight.fill_(1.0)
                m.bias.zero_()


def on_relu_maps(model: nn.Module, inputs: torch.Tensor,
                 take: Callable[[torch.Tensor], None]) -> None:
    """One training-mode forward of ``inputs`` without gradients, handing the output of every
    ``nn.ReLU`` module that acts on a 4-D feature map to ``take``."""
    def hook(module, inp, out) -> None:
        if inp and isinstance(inp[0], torch.Tensor) and inp[0].dim() == 4:
            take(out.detach())

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.ReLU)]
    try:
        model.train()
        with torch.no_grad():
            model(inputs)
    finally:
        for h in handles:
            h.remove()


def sample_wise_patterns(model: nn.Module, inputs: torch.Tensor) -> int:
    """The number of distinct sample-wise patterns of the outputs of the ``nn.ReLU`` modules
    that act on 4-D feature maps, over ``inputs`` (one training-mode forward)."""
    keys: list[torch.Tensor] = []

    def take(out: torch.Tensor) -> None:
        active = (out.reshape(out.shape[0], -1) > 0).T  # (units, samples)
        packed = pack_bits(active)
        # one word per unit for up to 62 samples: a fast 1-D unique
        keys.append(torch.unique(packed[:, 0]) if packed.shape[1] == 1
                    else torch.unique(packed, dim=0))

    on_relu_maps(model, inputs, take)
    if not keys:
        return 0
    keys_all = torch.cat(keys)
    if keys_all.dim() == 1:  # one word per pattern: a 1-D unique (row-wise unique is slow)
        return int(torch.unique(keys_all).shape[0])
    return int(torch.unique(keys_all, dim=0).shape[0])


def sample_wise_pattern_count(model: nn.Module, inputs: torch.Tensor) -> int:
    """:func:`sample_wise_patterns`, counted without sorting for up to ``TABLE_SAMPLES``
    samples: a unit's pattern is the integer whose bit ``k`` says whether sample ``k``
    activates it (a float32 product with the powers of two, exact below 2^24), and the
    count is the number of flags set in a table of 2^samples entries. The same integer as
    the sorting count; more samples fall back to it."""
    n = len(inputs)
    if n > TABLE_SAMPLES:
        return sample_wise_patterns(model, inputs)
    powers = torch.pow(2.0, torch.arange(n, dtype=torch.float32, device=inputs.device))
    seen = torch.zeros(2 ** n, dtype=torch.bool, device=inputs.device)

    def take(out: torch.Tensor) -> None:
        active = (out.reshape(out.shape[0], -1) > 0).to(torch.float32)  # (samples, units)
        seen[(powers @ active).to(torch.int64)] = True

    on_relu_maps(model, inputs, take)
    return int(seen.sum())


class Swap(Proxy):
    """swap: number of distinct sample-wise ReLU activation patterns over a batch of
    ``samples`` inputs (Peng et al., ICLR 2024)."""

    families = ("convolutional",)
    reads = "ReLU activation patterns"

    name = "swap"
    needs_data = True
    needs_labels = False
    passes = 1.0

    def __init__(self, samples: int = 16, init: str = "gaussian", seed: int = 0):
        check_range("swap samples", samples, 2)
        check_choice("swap init", init, INITS)
        self.samples, self.init, self.seed = samples, init, seed

    def patterns(self, model: nn.Module, inputs: torch.Tensor,
                 shared: SharedPasses | None = None) -> int:
        """The SWAP count after the re-initialisation; shared by swap and swap_reg (the key
        holds what it depends on besides the network and batch)."""
        def run() -> int:
            if self.init == "gaussian":
                gaussian_init(model)
            count = sample_wise_patterns if shared is None else sample_wise_pattern_count
            return count(model, inputs[: int(self.samples)])

        key = ("swap.patterns", int(self.samples), self.init, int(self.seed))
        return shared_value(shared, key, run)

    def compute(self, model, inputs, targets) -> float:
        return self.compute_shared(model, inputs, targets, None)

    def compute_shared(self, model, inputs, targets, shared) -> float:
        return float(self.patterns(model, inputs, shared))

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        return forward_flops_per_sample * min(batch_size, self.samples)


class SwapReg(Swap):
    """swap_reg: regularised SWAP-Score, log SWAP - (Theta - mu)^2 / sigma (Peng et al.,
    ICLR 2024).

    ``Theta`` is the parameter count in thousands; the score is the log of the paper's
    SWAP * exp(-(Theta - mu)^2 / sigma), the same ranking without underflow. Defaults: mu
    and sigma are the largest and the mean parameter count of the NB201 benchmark networks
    (thousands), the way the SWAP authors' code derives them from a population of model
    sizes; the paper tunes them per search space."""

    name = "swap_reg"

    def __init__(self, samples: int = 16, init: str = "gaussian", seed: int = 0,
                 mu: float = NB201_MAX_KPARAMS, sigma: float = NB201_MEAN_KPARAMS):
        super().__init__(samples, init, seed)
        check_range("swap_reg mu", mu, 0)
        check_range("swap_reg sigma", sigma, 1e-12)
        self.mu, self.sigma = mu, sigma

    def compute_shared(self, model, inputs, targets, shared) -> float:
        theta = count_params(model) / 1e3
        count = self.patterns(model, inputs, shared)
        return math.log(max(count, 1)) - (theta - self.mu) ** 2 / self.sigma
