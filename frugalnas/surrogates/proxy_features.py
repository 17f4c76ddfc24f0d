"""Zero-cost proxy scores as surrogate features, and proxy ranking for warm starts.

Proxies come from the host's ``proxies`` registry (each is also an estimator of the same name,
created with ``host.create_estimator``) and are computed on the network
the space builds. ``params`` and ``flops`` fall back to :mod:`frugalnas.ports.cost` when no
plugin registers them, so the encoding works with no proxy plugin at all.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import torch

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import count_flops, count_params
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.estimator import TrialContext
from frugalnas.ports.space import SearchSpace
from frugalnas.surrogates.encodings import Encoding

#: Data-free proxies used by default when registered.
DEFAULT_PROXIES = ("synflow", "params", "flops")
#: Computed here when no plugin registers them.
BUILTIN_FALLBACKS = ("params", "flops")


class ProxyScorer:
    """Scores architectures with named proxies (cached per architecture)."""

    def __init__(self, space: SearchSpace, proxies: Sequence[str] | None = None, host: Any = None,
                 input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
                 seed: int = 0):
        if host is None:
            raise ConfigError("proxy features need the plugin host that registers the proxies "
                              "(host=); a study's strategy passes its own")
        self.space, self.host = space, host
        self.input_shape, self.num_classes, self.seed = tuple(input_shape), num_classes, seed
        registered = set(self.host.registry("proxies").names())
        if proxies is None:
            names = [p for p in DEFAULT_PROXIES if p in registered] or list(BUILTIN_FALLBACKS)
        else:
            names = list(proxies)
            bad = [p for p in names if p not in registered and p not in BUILTIN_FALLBACKS]
            if bad:
                raise ConfigError(f"unknown proxy {bad[0]!r}; registered proxies: "
                                  f"{', '.join(sorted(registered | set(BUILTIN_FALLBACKS)))}")
        self.names = names
        self._registered = registered
        self._estimators: dict[str, Any] = {}
        self._cache: dict[str, np.ndarray] = {}
        self._context: TrialContext | None = None

    def _ctx(self) -> TrialContext:
        if self._context is None:
            c, h, w = self.input_shape
            self._context = TrialContext(
                space=self.space, backend=self.host.create("backends", "single-device"),
                seed=self.seed,
                dataset_loader=lambda: self.host.create(
                    "datasets", "synthetic", seed=self.seed, n=128, num_classes=self.num_classes,
                    channels=c, size=h))
        return self._context

    def _fallback(self, name: str, arch: Architecture) -> float:
        torch.manual_seed(self.seed)
        model = self.space.build(arch, self.num_classes, self.input_shape)
        if name == "params":
            return float(count_params(model))
        return float(count_flops(model, torch.zeros(1, *self.input_shape)))

    def score(self, arch: Architecture) -> np.ndarray:
        """The proxy values of ``arch``, in the order of :attr:`names`."""
        if arch.key not in self._cache:
            values = []
            for name in self.names:
                if name in self._registered:
                    if name not in self._estimators:
                        self._estimators[name] = self.host.create_estimator(name, {})
                    values.append(float(self._estimators[name].evaluate(arch, self._ctx()).value))
                else:
                    values.append(self._fallback(name, arch))
            self._cache[arch.key] = np.asarray(values, dtype=np.float64)
        return self._cache[arch.key]


def _signed_log(x: np.ndarray) -> np.ndarray:
    # Proxy scores span many orders of magnitude (synflow can exceed 1e30).
    return np.sign(x) * np.log1p(np.abs(x))


class ProxyEncoding(Encoding):
    """Features = signed-log proxy scores of the network built for each architecture."""

    def __init__(self, space: SearchSpace, proxies: Sequence[str] | None = None, host: Any = None,
                 input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
                 seed: int = 0):
        super().__init__(space)
        self.scorer = ProxyScorer(space, proxies, host, input_shape, num_classes, seed)

    @property
    def names(self) -> list[str]:
        return self.scorer.names

    def encode_one(self, arch: Architecture) -> np.ndarray:
        return _signed_log(np.nan_to_num(self.scorer.score(arch), nan=0.0, posinf=1e300,
                                         neginf=-1e300))
