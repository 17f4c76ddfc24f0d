"""The structure encoding of a layer-stack space, for surrogates (declared by the space's
``OwnEncodings`` capability)."""

from __future__ import annotations

import numpy as np
from optuna.distributions import CategoricalDistribution

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.space import SearchSpace
from frugalnas.spaces.stack.space import DEPTH_KEY, LayerStackSpace, layer_keys
from frugalnas.surrogates.encodings import Encoding


class StackStructureEncoding(Encoding):
    """Each network-wide choice one-hot (the width, a patch size), the depth scaled to [0, 1],
    and per layer slot: whether the layer exists, a one-hot number of heads and MLP ratio. A
    slot the network lacks is all zeros, so decisions a network does not use do not change
    its encoding."""

    def __init__(self, space: SearchSpace):
        super().__init__(space)
        if not isinstance(space, LayerStackSpace):
            raise TypeError(f"the structure encoding needs a layer-stack space (gpt, vit), "
                            f"got {space.name!r}")
        self.stack = space

    def encode_one(self, arch: Architecture) -> np.ndarray:
        space, d = self.stack, arch.decisions
        out: list[float] = []
        for key, dist in space.active_decisions(arch).items():
            if key != DEPTH_KEY and not key.startswith("layer"):
                assert isinstance(dist, CategoricalDistribution)
                out.extend(1.0 if d[key] == c else 0.0 for c in dist.choices)
        depth, span = int(d[DEPTH_KEY]), space.max_depth - space.min_depth
        out.append((depth - space.min_depth) / span if span else 1.0)
        for i in range(space.max_depth):
            if i >= depth:
                out.extend([0.0] * (1 + len(space.heads) + len(space.mlp_ratios)))
                continue
            heads, ratio = (d[k] for k in layer_keys(i))
            out.append(1.0)
            out.extend(1.0 if heads == h else 0.0 for h in space.heads)
            out.extend(1.0 if ratio == r else 0.0 for r in space.mlp_ratios)
        return np.asarray(out, dtype=np.float64)


class StackEncodings:
    """A layer-stack space's own encoding, ``structure``: its network-wide choices, the depth,
    and per layer slot whether it exists with its heads and MLP ratio (zeros for layers the
    network lacks)."""

    def __init__(self, space: SearchSpace):
        self.space = space

    def encodings(self) -> dict[str, type[Encoding]]:
        return {"structure": StackStructureEncoding}
