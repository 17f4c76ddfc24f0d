"""Architecture encodings for surrogates (chosen by name in :mod:`.choice`).

* ``onehot``: every categorical decision one-hot, every numeric one scaled to [0, 1]; works on
  any :class:`SearchSpace`.
* a space's own encodings (an ``OwnEncodings`` capability), e.g. NB201's ``adjacency`` and
  ``path`` (:mod:`frugalnas.spaces.nb201.encodings`); asking a space for an encoding it does
  not have is a ConfigError naming the ones it has.
* ``proxy``: zero-cost proxy scores of the untrained network (see :mod:`.proxy_features`).
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np
from optuna.distributions import CategoricalDistribution, FloatDistribution, IntDistribution

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.space import SearchSpace

#: The built-in encodings: ``onehot`` and ``proxy`` work on every space; ``adjacency`` and
#: ``path`` are NB201's own (a space declares its own in an ``OwnEncodings`` capability).
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
        decisions = arch.decisions
        for key, dist in self.space.distributions().items():
            if key not in decisions:  # an inactive conditional decision: all zeros
                out.extend([0.0] * (len(dist.choices) if isinstance(
                    dist, CategoricalDistribution) else 1))
                continue
            value = decisions[key]
            if isinstance(dist, CategoricalDistribution):
                out.extend(1.0 if value == c else 0.0 for c in dist.choices)
            elif isinstance(dist, (IntDistribution, FloatDistribution)):
                lo, hi, v = float(dist.low), float(dist.high), float(value)
                if dist.log:
                    lo, hi, v = math.log(lo), math.log(hi), math.log(v)
                out.append((v - lo) / (hi - lo) if hi > lo else 0.0)
        return np.asarray(out, dtype=np.float64)
