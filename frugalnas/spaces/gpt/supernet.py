"""Weight sharing for the ``gpt`` space: its supernet is one
:class:`~frugalnas.nn.transformer.ElasticGPT` as large as the space's largest network (store
key ``("gpt",)``). An architecture's network runs the first ``width`` embedding features, the
first ``depth`` blocks and, in each, the first heads and MLP units it chose, so every network
shares the weights of the larger ones (weight entanglement, as in AutoFormer and HAT)."""

from __future__ import annotations

from collections.abc import Callable

from torch import nn

from frugalnas.nn.transformer import ActiveNetwork, ElasticGPT, SubnetConfig
from frugalnas.nn.weight_store import Key
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.capabilities import sharing_by
from frugalnas.ports.errors import ConfigError
from frugalnas.spaces.gpt.network import elastic_model, check_token_shape
from frugalnas.spaces.gpt.space import GPTSpace

KEY: Key = ("gpt",)


class GPTSharedBuilder:
    """The networks of a :class:`GPTSpace` over one elastic GPT."""

    def __init__(self, space: GPTSpace, num_classes: int, input_shape: tuple[int, ...],
                 sharing: str = "operation"):
        if sharing != "operation":
            raise ConfigError(f"invalid sharing {sharing!r} for space {space.name!r}; valid: "
                              "'operation' (one elastic transformer)")
        check_token_shape(space, input_shape)
        self.space, self.vocab_size = space, int(num_classes)

    def keys(self) -> list[Key]:
        return [KEY]

    def factory(self, key: Key) -> nn.Module:
        if key != KEY:
            raise KeyError(f"unknown gpt weight-store key {key!r}; keys: {self.keys()}")
        return elastic_model(self.space, self.vocab_size)

    def subnet(self, arch: Architecture, get: Callable[[Key], nn.Module]
               ) -> ActiveNetwork[SubnetConfig]:
        supernet = get(KEY)
        assert isinstance(supernet, ElasticGPT)
        return ActiveNetwork(supernet, self.space.subnet_config(arch))


#: Weight sharing for the space: its networks over one elastic transformer.
GPTSharing = sharing_by(GPTSharedBuilder)
