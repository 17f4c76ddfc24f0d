"""The ``mobilenet`` space's own encoding for surrogates (declared by
the space's ``OwnEncodings`` capability)."""

from __future__ import annotations

import numpy as np

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.space import SearchSpace
from frugalnas.spaces.mobilenet.space import (
    RESOLUTION_KEY,
    MobileNetSpace,
    block_keys,
    depth_key,
)
from frugalnas.surrogates.encodings import Encoding


class MobileNetStructureEncoding(Encoding):
    """A one-hot searched resolution (when the space searches it); per stage: its depth scaled
    to [0, 1]; per block slot: whether the block exists, a one-hot kernel and ratio, and SE.
    A slot the network lacks is all zeros, so two architectures that differ only in blocks
    they lack encode equally. The features follow the network's structure, not the
    decisions' order."""

    def __init__(self, space: SearchSpace):
        super().__init__(space)
        if not isinstance(space, MobileNetSpace):
            raise TypeError(f"the structure encoding needs a mobilenet space, got {space.name!r}")
        self.mobilenet = space

    def encode_one(self, arch: Architecture) -> np.ndarray:
        space, d = self.mobilenet, arch.decisions
        out = [1.0 if d[RESOLUTION_KEY] == r else 0.0 for r in space.resolutions] \
            if space.resolutions is not None else []
        for s, stage in enumerate(space.stages, start=1):
            depth = int(d[depth_key(s)])
            span = stage.depth - space.min_depth
            out.append((depth - space.min_depth) / span if span else 1.0)
            for b in range(stage.depth):
                if b >= depth:
                    out.extend([0.0] * (2 + len(space.kernels) + len(space.expand_ratios)))
                    continue
                kernel, expand, se = (d[k] for k in block_keys(s, b))
                out.append(1.0)
                out.extend(1.0 if kernel == k else 0.0 for k in space.kernels)
                out.extend(1.0 if expand == e else 0.0 for e in space.expand_ratios)
                out.append(1.0 if se else 0.0)
        return np.asarray(out, dtype=np.float64)


class MobileNetEncodings:
    """The MobileNet space's own encoding, ``structure``: per stage its depth, per block slot
    whether it exists and its kernel, ratio and SE (zeros for blocks the network lacks)."""

    def __init__(self, space: SearchSpace):
        self.space = space

    def encodings(self) -> dict[str, type[Encoding]]:
        return {"structure": MobileNetStructureEncoding}
