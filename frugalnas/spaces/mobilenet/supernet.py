"""Weight sharing for the ``mobilenet`` space: its supernet is one elastic block per block
position, plus the fixed stem, first block and head.

Store keys: ``("stem",)``, ``("first",)``, ``("block", stage, index)`` (an
:class:`~frugalnas.nn.elastic.ElasticMBConv` at the largest kernel and ratio, with
squeeze-excite weights when the space searches SE) and ``("head",)``. An architecture's
network runs each of its blocks at the architecture's configuration: smaller kernels are
transformed centres of the largest, smaller ratios the first hidden channels, and a
shallower stage its first blocks, and a searched resolution resizes the input before the
shared stem (Once-for-All, Cai et al., ICLR 2020).
"""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from frugalnas.ports.capabilities import sharing_by
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError
from frugalnas.nn.elastic import ElasticMBConv
from frugalnas.nn.weight_store import Key
from frugalnas.spaces.mobilenet.network import (
    ActiveBlock,
    MobileNetNetwork,
    Resize,
    make_first,
    make_head,
    make_stem,
)
from frugalnas.spaces.mobilenet.space import MobileNetSpace

Getter = Callable[[Key], nn.Module]


class MobileNetSharedBuilder:
    """The networks of a :class:`MobileNetSpace` over a store of elastic blocks."""

    def __init__(self, space: MobileNetSpace, num_classes: int,
                 input_shape: tuple[int, ...], sharing: str = "operation"):
        if sharing != "operation":
            raise ConfigError(f"invalid sharing {sharing!r} for space {space.name!r}; valid: "
                              "'operation' (one elastic block per position)")
        self.space, self.num_classes = space, int(num_classes)
        self.input_shape = tuple(int(v) for v in input_shape)

    def keys(self) -> list[Key]:
        keys: list[Key] = [("stem",), ("first",)]
        for s, stage in enumerate(self.space.stages, start=1):
            keys.extend(("block", s, b) for b in range(stage.depth))
        return [*keys, ("head",)]

    def factory(self, key: Key) -> nn.Module:
        space = self.space
        if key == ("stem",):
            # A searched resolution resizes in each network, not in the shared stem.
            return make_stem(space, self.input_shape, space.resolution)
        if key == ("first",):
            return make_first(space)
        if key == ("head",):
            return make_head(space, self.num_classes)
        if key[0] == "block" and 1 <= int(key[1]) <= len(space.stages):
            s, b = int(key[1]), int(key[2])
            stage, (cin, cout) = space.stages[s - 1], space.stage_channels()[s - 1]
            if 0 <= b < stage.depth:
                return ElasticMBConv(cin if b == 0 else cout, cout, space.kernels,
                                     space.expand_ratios, stage.stride if b == 0 else 1, space.se)
        raise KeyError(f"unknown mobilenet weight-store key {key!r}; keys: {self.keys()}")

    def subnet(self, arch: Architecture, get: Getter) -> MobileNetNetwork:
        """The network of ``arch``; its parameters are the store's tensors."""
        blocks: list[nn.Module] = [get(("first",))]
        for s, configs in enumerate(self.space.block_configs(arch), start=1):
            for b, config in enumerate(configs):
                block = get(("block", s, b))
                assert isinstance(block, ElasticMBConv)
                blocks.append(ActiveBlock(block, config))
        stem = get(("stem",))
        if self.space.resolutions is not None:
            # Resize first, then the store's own layers: the stand-alone build's layout.
            stem = nn.Sequential(Resize(self.space.resolution_of(arch) or 0), *stem)
        return MobileNetNetwork(stem, blocks, get(("head",)))


def export_subnet(network: MobileNetNetwork) -> MobileNetNetwork:
    """A stand-alone copy of a shared network: every elastic block replaced by the plain
    block of its configuration with its weights (for export or fine-tuning alone)."""
    import copy

    blocks = [b.export() if isinstance(b, ActiveBlock) else copy.deepcopy(b)
              for b in network.blocks]
    out = MobileNetNetwork(copy.deepcopy(network.stem), blocks, copy.deepcopy(network.head))
    return out.train(network.training)


#: Weight sharing for the space: its networks over one shared weight store.
MobileNetSharing = sharing_by(MobileNetSharedBuilder)
