"""NB201's own architecture encodings for surrogates (declared as the space's ``OwnEncodings`` capability):
``adjacency``, the cell's upper-triangular adjacency (edge present unless its op is ``none``)
plus a one-hot op per edge, and ``path``, the path encoding of BANANAS (White et al., AAAI
2021): one feature per possible op sequence along an input-to-output path, counting how many
live paths carry it."""

from __future__ import annotations

import itertools

import numpy as np

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.space import SearchSpace
from frugalnas.spaces.nb201.space import DECISIONS, OPS
from frugalnas.surrogates.encodings import Encoding


class NB201AdjacencyEncoding(Encoding):
    """NB201 cell as adjacency (live edges) plus one-hot operation per edge."""

    def encode_one(self, arch: Architecture) -> np.ndarray:
        adj = [0.0 if arch[k] == "none" else 1.0 for k in DECISIONS]
        ops = [1.0 if arch[k] == op else 0.0 for k in DECISIONS for op in OPS]
        return np.asarray(adj + ops, dtype=np.float64)


class NB201PathEncoding(Encoding):
    """BANANAS path encoding of an NB201 cell (paths through ``none`` edges are dead)."""

    def __init__(self, space: SearchSpace):
        super().__init__(space)
        live = [op for op in OPS if op != "none"]
        self._index = {seq: i for i, seq in enumerate(
            seq for n in (1, 2, 3) for seq in itertools.product(live, repeat=n))}
        # The four input-to-output paths of the 4-node cell, as lists of edges (to, from).
        self._paths = [[(3, 0)], [(1, 0), (3, 1)], [(2, 0), (3, 2)], [(1, 0), (2, 1), (3, 2)]]

    def encode_one(self, arch: Architecture) -> np.ndarray:
        out = np.zeros(len(self._index))
        for path in self._paths:
            seq = tuple(arch[f"edge_{j}_{i}"] for j, i in path)
            if "none" not in seq:
                out[self._index[seq]] += 1.0
        return out


class NB201Encodings:
    """NB201's own encodings: ``adjacency`` and ``path`` (BANANAS)."""

    def __init__(self, space: SearchSpace):
        self.space = space

    def encodings(self) -> dict[str, type[Encoding]]:
        return {"adjacency": NB201AdjacencyEncoding, "path": NB201PathEncoding}
