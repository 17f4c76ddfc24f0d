"""Size proxies: params, flops, l2_norm (baselines in Abdelfattah et al., ICLR 2021), and
decoder_params for language models (LiteTransformerSearch, Javaheripi et al., NeurIPS 2022)."""

from __future__ import annotations

import torch
from torch import nn

from frugalnas.ports.cost import count_flops, count_params
from frugalnas.ports.task import IMAGE_CLASSIFICATION, LANGUAGE_MODELLING
from frugalnas.proxies.base import Proxy, weighted_layers

EVERY_TASK = (IMAGE_CLASSIFICATION.name, LANGUAGE_MODELLING.name)


class Params(Proxy):
    """params: the number of trainable parameters (a strong baseline; Abdelfattah et al. 2021)."""

    name = "params"
    needs_data = False
    needs_labels = False
    tasks = EVERY_TASK
    passes = 0.0

    def compute(self, model, inputs, targets) -> float:
        return float(count_params(model))


class Flops(Proxy):
    """flops: forward FLOPs for one input sample (Abdelfattah et al. 2021)."""

    name = "flops"
    needs_data = False
    needs_labels = False
    tasks = EVERY_TASK
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


class DecoderParams(Proxy):
    """decoder_params: the parameters of a language model's decoder, without token or position
    embeddings and the output head (LiteTransformerSearch, Javaheripi et al., NeurIPS 2022,
    found it ranks GPT networks of one family by perplexity without training)."""

    name = "decoder_params"
    needs_data = False
    needs_labels = False
    tasks = (LANGUAGE_MODELLING.name,)
    passes = 1.0

    def compute(self, model: nn.Module, inputs: torch.Tensor,
                targets: torch.Tensor | None) -> float:
        with torch.no_grad():
            vocab = model(inputs[:1]).shape[-1]
        left_out = [m for m in model.modules() if isinstance(m, nn.Embedding)
                    or (isinstance(m, nn.Linear) and m.out_features == vocab)]
        skipped = {id(p) for m in left_out for p in m.parameters()}
        return float(sum(p.numel() for p in model.parameters()
                         if p.requires_grad and id(p) not in skipped))

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        return forward_flops_per_sample
