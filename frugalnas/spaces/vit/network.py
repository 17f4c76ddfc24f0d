"""The networks of the ``vit`` space: stand-alone vision transformers of plain torch modules
(:class:`~frugalnas.nn.vision_transformer.DenseViT`), initialised as the ``gpt`` space's (every
linear, convolution and position weight drawn from N(0, 0.02), biases zero: ViT's
truncated-normal start, untruncated), so that a network built alone and one sliced from the
supernet start from the same distribution."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from frugalnas.nn.vision_transformer import DenseViT, ElasticViT, ViTSubnet
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError
from frugalnas.spaces.gpt.network import gpt_init

if TYPE_CHECKING:
    from frugalnas.spaces.vit.space import ViTSpace

def check_image_shape(space: ViTSpace, input_shape: Sequence[int]) -> int:
    """The images' side; a ConfigError unless they are square (C, H, W) images whose side
    every patch size divides."""
    if len(input_shape) != 3 or int(input_shape[1]) != int(input_shape[2]):
        raise ConfigError(f"space {space.name!r} classifies square images: it needs examples of "
                          f"shape (channels, side, side), got {tuple(input_shape)}")
    side = int(input_shape[1])
    bad = [p for p in space.patch_sizes if side % p]
    if bad:
        fits = [p for p in range(1, side + 1) if side % p == 0]
        raise ConfigError(f"patch sizes {sorted(bad)} of space {space.name!r} do not divide the "
                          f"images' side {side}; valid: {fits}")
    return side


def elastic_model(space: ViTSpace, num_classes: int, input_shape: Sequence[int],
                  subnet: ViTSubnet | None = None) -> ElasticViT:
    """A freshly initialised :class:`ElasticViT` as large as ``subnet`` (default: the space's
    largest network, every patch size)."""
    side = check_image_shape(space, input_shape)
    if subnet is None:
        patches: Sequence[int] = space.patch_sizes
        width, depth = max(space.widths), space.max_depth
        heads, hidden = max(space.heads), max(space.mlp_ratios) * width
    else:
        config, patches = subnet.config, (subnet.patch,)
        width, depth = config.width, config.depth
        heads = max(b.heads for b in config.blocks)
        hidden = max(b.mlp_hidden for b in config.blocks)
    model = ElasticViT(side, int(input_shape[0]), num_classes, patches, width, depth, heads,
                       space.head_dim, hidden, norm=space.norm)
    gpt_init(model)
    return model


def build_network(space: ViTSpace, arch: Architecture, num_classes: int,
                  input_shape: Sequence[int]) -> DenseViT:
    """The stand-alone network of ``arch`` with fresh weights."""
    subnet = space.vit_subnet(arch)
    return elastic_model(space, num_classes, input_shape, subnet).export(subnet)
