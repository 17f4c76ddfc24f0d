"""The networks of the ``gpt`` space: stand-alone language models of plain torch modules
(:class:`~frugalnas.nn.transformer.DenseGPT`), initialised as GPT-2 is (every linear and
embedding weight drawn from N(0, 0.02), biases zero), so that a network built alone and one
sliced from the supernet start from the same distribution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

import torch
from torch import nn

from frugalnas.nn.transformer import DenseGPT, ElasticGPT, SubnetConfig
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError

if TYPE_CHECKING:
    from frugalnas.spaces.gpt.space import GPTSpace

INIT_STD = 0.02


def gpt_init(model: nn.Module) -> nn.Module:
    """GPT-2's initialisation, in place: linear (and convolution, for a vision transformer's
    patches) and embedding weights from N(0, 0.02), biases zero."""
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, (nn.Linear, nn.Conv2d)):
                module.weight.normal_(0.0, INIT_STD)
                if module.bias is not None:
                    module.bias.zero_()
            elif isinstance(module, nn.Embedding):
                module.weight.normal_(0.0, INIT_STD)
    return model


def check_token_shape(space: GPTSpace, input_shape: Sequence[int]) -> None:
    """ConfigError unless the data are tokens ``(context,)`` no longer than the networks'
    positions."""
    if len(input_shape) != 1:
        raise ConfigError(f"space {space.name!r} models text: it needs a language-modelling "
                          f"dataset such as 'text' (examples of shape (context,)), got examples "
                          f"of shape {tuple(input_shape)}")
    length = int(input_shape[0])
    if length > space.context:
        raise ConfigError(f"context length {length} of the data is larger than the "
                          f"{space.context} positions of space {space.name!r}; give the space "
                          f"context >= {length} (-o space.context={length}) or the data a "
                          "shorter one")


def elastic_model(space: GPTSpace, vocab_size: int, config: SubnetConfig | None = None
                  ) -> ElasticGPT:
    """A freshly initialised :class:`ElasticGPT` as large as ``config`` (default: the space's
    largest network)."""
    if config is None:
        width, depth = max(space.widths), space.max_depth
        heads, hidden = max(space.heads), max(space.mlp_ratios) * width
    else:
        width, depth = config.width, config.depth
        heads = max(b.heads for b in config.blocks[:depth])
        hidden = max(b.mlp_hidden for b in config.blocks[:depth])
    model = ElasticGPT(vocab_size, width, depth, heads, space.head_dim, hidden, space.context,
                       positions=space.positions, norm=space.norm)
    gpt_init(model)
    return model


def build_network(space: GPTSpace, arch: Architecture, vocab_size: int,
                  input_shape: Sequence[int]) -> DenseGPT:
    """The stand-alone network of ``arch`` with fresh weights, over ``vocab_size`` tokens."""
    check_token_shape(space, input_shape)
    config = space.subnet_config(arch)
    return elastic_model(space, vocab_size, config).export(config)
