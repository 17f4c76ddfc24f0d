"""Architecture encodings for surrogates, chosen by name.

* ``onehot``: every categorical decision one-hot, every numeric one scaled to [0, 1]; works on
  any :class:`SearchSpace`.
* ``adjacency``: on NB201, the cell's upper-triangular adjacency (edge present unless its op is
  ``none``) plus a one-hot op per edge; on other spaces the same as ``onehot``.
* ``path``: on NB201, the path encoding of BANANAS (White et al., AAAI 2021): one feature per
  possible op sequence along an input-to-output path, counting how many live paths carry it;
  on other spaces the same as ``onehot``.
* ``proxy``: zero-cost proxy scores of the untrained network (see :mod:`.proxy_features`).
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Sequence
from typing import Any

import numpy as np
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from frugalnas.core.architecture import Architecture
from frugalnas.core.errors import check_choice
from frugalnas.core.space import SearchSpace

ENCODINGS = ("onehot", "adjacency", "path", "proxy")


class Encoding:
    """Turns architectures of one space into a float feature matrix."""

    def __init__(self, space: SearchSpace):
        self.space = space

    def encode_one(self, arch: Architecture) -> np.ndarray:
        raise NotImplementedError

    def encode(self, archs: Sequence[Architecture]) -> np.ndarray:
        """Features of ``archs``, shape (len(archs), n_features)."""
        rows = [self.encode_one(a) for a in archs]
        return np.stack(rows) if rows else np.zeros((0, 0))


class OneHotEncoding(Encoding):
    """One-hot of each categorical decision, numeric decisions scaled to [0, 1]."""

    def encode_one(self, arch: Architecture) -> np.ndarray:
        out: list[float] = []
        for key, dist in self.space.distributions().items():
            value = arch[key]
            if isinstance(dist, CategoricalDistribution):
                out.extend(1.0 if value == c else 0.0 for c in dist.choices)
            elif isinstance(dist, (IntDistribution, FloatDistribution)):
                lo, hi, v = float(dist.low), float(dist.high), float(value)
                if dist.log:
                    lo, hi, v = math.log(lo), math.log(hi), math.log(v)
                out.append((v - lo) / (hi - lo) if hi > lo else 0.0)
        return np.asarray(out, dtype=np.float64)


def _is_nb201(space: SearchSpace) -> bool:
    return getattr(space, "name", None) == "nb201"


class NB201AdjacencyEncoding(Encoding):
    """NB201 cell as adjacency (live edges) plus one-hot operation per edge."""

    def encode_one(self, arch: Architecture) -> np.ndarray:
        from frugalnas.spaces.nb201.space import DECISIONS, OPS

        adj = [0.0 if arch[k] == "none" else 1.0 for k in DECISIONS]
        ops = [1.0 if arch[k] == op else 0.0 for k in DECISIONS for op in OPS]
        return np.asarray(adj + ops, dtype=np.float64)


class NB201PathEncoding(Encoding):
    """BANANAS path encoding of an NB201 cell (paths through ``none`` edges are dead)."""

    def __init__(self, space: SearchSpace):
        super().__init__(space)
        from frugalnas.spaces.nb201.space import OPS

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


def make_encoding(name: str, space: SearchSpace, **options: Any) -> Encoding:
    """The encoding ``name`` (one of :data:`ENCODINGS`) for ``space``; ``options`` go to the
    ``proxy`` encoding (see :class:`~.proxy_features.ProxyEncoding`)."""
    check_choice("encoding", name, ENCODINGS)
    if name == "proxy":
        from frugalnas.surrogates.proxy_features import ProxyEncoding

        return ProxyEncoding(space, **options)
    if options:
        from frugalnas.core.errors import ConfigError

        raise ConfigError(f"encoding {name!r} takes no options, got {sorted(options)}")
    if name == "adjacency" and _is_nb201(space):
        return NB201AdjacencyEncoding(space)
    if name == "path" and _is_nb201(space):
        return NB201PathEncoding(space)
    return OneHotEncoding(space)
