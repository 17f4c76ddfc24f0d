"""Weight sharing for the ``vit`` space: its supernet is one
:class:`~frugalnas.nn.vision_transformer.ElasticViT` as large as the space's largest network
(store key ``("vit",)``), with one patch projection and one table of positions per patch size
and the blocks, norm and classifier shared by all. An architecture's network runs its patch
size's projection, the first ``width`` features, the first ``depth`` blocks and, in each, the
first heads and MLP units it chose (weight entanglement, as in AutoFormer)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from frugalnas.nn.transformer import ActiveNetwork
from frugalnas.nn.vision_transformer import ElasticViT, ViTSubnet
from frugalnas.nn.weight_store import Key
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.capabilities import sharing_by
from frugalnas.ports.errors import ConfigError
from frugalnas.spaces.vit.network import check_image_shape, elastic_model
from frugalnas.spaces.vit.space import ViTSpace

KEY: Key = ("vit",)


class ViTSharedBuilder:
    """The networks of a :class:`ViTSpace` over one elastic vision transformer."""

    def __init__(self, space: ViTSpace, num_classes: int, input_shape: tuple[int, ...],
                 sharing: str = "operation"):
        if sharing != "operation":
            raise ConfigError(f"invalid sharing {sharing!r} for space {space.name!r}; valid: "
                              "'operation' (one elastic vision transformer)")
        check_image_shape(space, input_shape)
        self.space, self.num_classes = space, int(num_classes)
        self.input_shape = tuple(int(v) for v in input_shape)

    def keys(self) -> list[Key]:
        return [KEY]

    def factory(self, key: Key) -> nn.Module:
        if key != KEY:
            raise KeyError(f"unknown vit weight-store key {key!r}; keys: {self.keys()}")
        return elastic_model(self.space, self.num_classes, self.input_shape)

    def subnet(self, arch: Architecture, get: Callable[[Key], nn.Module]
               ) -> ActiveNetwork[ViTSubnet]:
        supernet = get(KEY)
        assert isinstance(supernet, ElasticViT)
        return ActiveNetwork(supernet, self.space.vit_subnet(arch))


#: Weight sharing for the space: its networks over one elastic vision transformer.
ViTSharing = sharing_by(ViTSharedBuilder)
