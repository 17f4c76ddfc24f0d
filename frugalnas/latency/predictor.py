"""Latency predictors fitted from measurements: lookup tables of layers or of fused kernels,
calibrated on a few networks measured whole.

:class:`KernelTablePredictor` (the ``latency-predictor`` estimator's default) is described in
its docstring. :class:`LayerTablePredictor` keys its table by single layers, after
ProxylessNAS (Cai et al., ICLR 2019): a network's latency is predicted from the latencies of
its layers, each measured once alone at its input shape and kept in a table. The sum of a network's layer latencies misses what runs
between layers (residual additions, the runtime's per-call overhead, fused operators), so the
prediction is ``intercept + sum over layer kinds of slope[kind] * (their summed table
latency)``, fitted by least squares on the relative error to a few networks measured whole
(the calibration set): a runtime fuses a convolution with the batch norm and activation that
follow it, so each kind gets its own weight. A new network costs nothing to predict once
the table holds its layers; a layer never seen is measured once and added.
"""

from __future__ import annotations

import copy
import random
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.space import SearchSpace
from frugalnas.latency.cache import LatencyCache, cache_key
from frugalnas.latency.kernels import Kernel, network_kernels, probe_leaves
from frugalnas.latency.measure import LatencySetup, Measurement, measure_many

#: A measurement to look up or take: its cache key parts, how to build the module, the input
#: shape (without the batch axis). Key parts with ``"input": "tokens"`` measure on int64
#: tokens over a vocabulary of ``parts["classes"]`` (:func:`input_vocab`).
Item = tuple[dict[str, object], Callable[[], object], Sequence[int]]


def input_vocab(parts: dict[str, object]) -> int | None:
    """The vocabulary of an item's token inputs, ``None`` for float inputs: the key says
    which, so image and token measurements never share a key."""
    if parts.get("input") != "tokens":
        return None
    vocab = parts["classes"]
    assert isinstance(vocab, int)
    return vocab


class LatencyMeter:
    """Measures whole networks and single layers with one setup, through an optional cache."""

    def __init__(self, setup: LatencySetup, cache: LatencyCache | None = None):
        self.setup, self.cache = setup, cache
        self._memory: dict[str, Measurement] = {}

    def _cached(self, parts: dict[str, object], make_model: Callable[[], object],
                input_shape: Sequence[int]) -> tuple[Measurement, bool]:
        """The measurement under ``parts`` and whether it was cached; ``make_model`` is
        called only to measure a network that is not."""
        return self.cached_many([(parts, make_model, input_shape)])[0]

    def cached_many(self, items: Sequence[Item]) -> list[tuple[Measurement, bool]]:
        """The measurement under each item's key parts and whether it was cached; the items
        not cached are built and measured together, in interleaved rounds
        (:func:`~frugalnas.latency.measure.measure_many`)."""
        keys = [cache_key({**parts, "input_shape": list(shape), **self.setup.identity()})
                for parts, _, shape in items]
        found: dict[str, tuple[Measurement, bool]] = {}
        missing: dict[str, tuple[Callable[[], object], Sequence[int], int | None]] = {}
        for key, (parts, make_model, shape) in zip(keys, items):
            if key in found or key in missing:
                continue
            hit = self._memory.get(key) or (self.cache.get(key) if self.cache else None)
            if hit is not None:
                self._memory[key] = hit
                found[key] = (hit, True)
            else:
                missing[key] = (make_model, shape, input_vocab(parts))
        if missing:
            measured = measure_many([(make(), shape, vocab)
                                     for make, shape, vocab in missing.values()], self.setup)
            for key, result in zip(missing, measured):
                self._memory[key] = result
                if self.cache is not None:
                    self.cache.put(key, result)
                found[key] = (result, False)
        return [found[key] for key in keys]

    def network(self, space: SearchSpace, arch: Architecture, num_classes: int,
                input_shape: Sequence[int], tokens: bool = False) -> tuple[Measurement, bool]:
        """The measurement of ``arch``'s network and whether it came from the cache; with
        ``tokens``, on int64 tokens over a vocabulary of ``num_classes``, ``input_shape``
        ``(T,)``."""
        return self.networks(space, [arch], num_classes, input_shape, tokens)[0]

    def networks(self, space: SearchSpace, archs: Sequence[Architecture], num_classes: int,
                 input_shape: Sequence[int], tokens: bool = False
                 ) -> list[tuple[Measurement, bool]]:
        """:meth:`network` for several architectures, those not cached measured together."""
        return self.cached_many([self.network_item(space, a, num_classes, input_shape, tokens)
                                 for a in archs])

    @staticmethod
    def network_item(space: SearchSpace, arch: Architecture, num_classes: int,
                     input_shape: Sequence[int], tokens: bool = False) -> Item:
        """What :meth:`cached_many` needs to measure ``arch``'s network (on tokens: the key
        holds ``"input": "tokens"``; an image's key is as it always was)."""
        parts: dict[str, object] = {"space": space.name, "arch": str(arch),
                                    "classes": num_classes}
        if tokens:
            parts["input"] = "tokens"
        return (parts, lambda: space.build(arch, num_classes, tuple(input_shape)), input_shape)

    def decode(self, space: SearchSpace, arch: Architecture, num_classes: int,
               length: int) -> tuple[Measurement, bool]:
        """The latency of generating token ``length`` of ``arch``'s language model with a
        key/value cache of the ``length - 1`` before it (:class:`~frugalnas.nn.
        dense_transformer.DecodeStep`), and whether it came from the cache."""
        parts: dict[str, object] = {"space": space.name, "arch": str(arch),
                                    "classes": num_classes, "input": "tokens",
                                    "decode_at": length}
        batch = self.setup.batch_size

        def make() -> object:
            import torch

            from frugalnas.nn.dense_transformer import DecodeStep, DenseGPT

            model = space.build(arch, num_classes, (length,)).eval()
            if not isinstance(model, DenseGPT):
                raise ConfigError(f"per-token latency needs a decoder with a key/value cache "
                                  f"(the gpt space's networks); space {space.name!r} builds "
                                  f"{type(model).__name__}")
            prompt = torch.randint(0, num_classes, (batch, length - 1),
                                   generator=torch.Generator().manual_seed(0))
            return DecodeStep(model, prompt)

        return self._cached(parts, make, (1,))

    @staticmethod
    def kernel_item(kernel: Kernel) -> Item:
        """What :meth:`cached_many` needs to measure ``kernel`` alone (a kernel of token
        inputs, an embedding, on zero tokens: any vocabulary holds them)."""
        parts: dict[str, object] = {"kernel": kernel.signature}
        if kernel.tokens:
            parts.update(input="tokens", classes=1)
        return (parts, kernel.module, kernel.input_shape)

    @staticmethod
    def probe_item() -> Item:
        """What :meth:`cached_many` needs to measure the runtime's per-call overhead (a
        flatten of 16 numbers: a call that does almost nothing), which each kernel measured
        alone pays once but a network pays once for all its kernels."""
        from torch import nn

        return ({"probe": "flatten"}, nn.Flatten, (16,))

    def layer(self, signature: str, module: object, input_shape: Sequence[int]) -> float:
        """The table latency of one layer, measured on a copy of ``module`` when not cached."""
        return self._cached({"layer": signature}, lambda: copy.deepcopy(module),
                            input_shape)[0].median_ms

    def kernels(self, kernels: Sequence[Kernel]) -> list[float]:
        """The table latencies of ``kernels`` (each measured alone, as one module, when not
        cached; the new ones together)."""
        return [m.median_ms for m, _ in self.cached_many([self.kernel_item(k)
                                                          for k in kernels])]


def leaf_layers(model: object, input_shape: Sequence[int]) -> list[tuple[str, object, tuple[int, ...]]]:
    """``(signature, module, input shape)`` of each leaf module a forward pass runs, in
    order (a module run twice appears twice)."""
    import torch

    calls: list[tuple[str, object, tuple[int, ...]]] = []

    def record(module: torch.nn.Module, args: tuple[object, ...]) -> None:
        x = args[0] if args else None
        if isinstance(x, torch.Tensor):
            shape = tuple(int(s) for s in x.shape[1:])
            calls.append((f"{module!r}@{shape}", module, shape))

    probe_leaves(model, input_shape, lambda m: m.register_forward_pre_hook(record))
    return calls


@dataclass
class Calibration:
    """``intercept + sum(slopes[kind] * summed latency of the layers of that kind)``."""

    intercept: float
    slopes: dict[str, float]

    def predict(self, sums: dict[str, float]) -> float:
        other = self.slopes.get("other", 1.0)
        return self.intercept + sum(self.slopes.get(kind, other) * v for kind, v in sums.items())


class LayerTablePredictor:
    """Predicts the latency of a space's networks from a per-layer table (see the module)."""

    def __init__(self, space: SearchSpace, meter: LatencyMeter, num_classes: int,
                 input_shape: Sequence[int], calibration: int = 20, seed: int = 0):
        self.space, self.meter = space, meter
        self.num_classes, self.input_shape = int(num_classes), tuple(int(s) for s in input_shape)
        self.calibration_size, self.seed = int(calibration), int(seed)
        self._fit: Calibration | None = None

    def layer_sums(self, arch: Architecture) -> dict[str, float]:
        """The table latencies of ``arch``'s layers, summed per kind of layer (its class)."""
        model = self.space.build(arch, self.num_classes, self.input_shape)
        sums: dict[str, float] = {}
        for sig, module, shape in leaf_layers(model, self.input_shape):
            kind = type(module).__name__
            sums[kind] = sums.get(kind, 0.0) + self.meter.layer(sig, module, shape)
        return sums

    def layer_sum(self, arch: Architecture) -> float:
        return sum(self.layer_sums(arch).values())

    def calibration_set(self) -> list[Architecture]:
        return calibration_set(self.space, self.calibration_size, self.seed)

    def fit(self) -> Calibration:
        """Measure the calibration networks whole and fit the intercept and one slope per kind
        of layer (a runtime fuses a convolution with the batch norm and activation after it,
        so those kinds cost less inside a network than alone); kinds that vary too little to
        fit share one slope."""
        import numpy as np

        if self._fit is None:
            archs = self.calibration_set()
            sums = [self.layer_sums(a) for a in archs]
            measured = np.array([self.meter.network(self.space, a, self.num_classes,
                                                    self.input_shape)[0].median_ms
                                 for a in archs])
            kinds = sorted({k for row in sums for k in row})
            table = np.array([[row.get(k, 0.0) for k in kinds] for row in sums])
            # A kind of its own where it varies across the calibration networks and there
            # are enough of them; the rest pooled as "other".
            own = [i for i in np.argsort(-table.std(0)) if table[:, i].std() > 0]
            own = own[:max(0, len(archs) // 4 - 1)]
            rest = [i for i in range(len(kinds)) if i not in own]
            columns = [table[:, i] for i in own] + ([table[:, rest].sum(1)] if rest else [])
            names = [kinds[i] for i in own] + (["other"] if rest else [])
            if len(archs) >= 2 and columns:
                # Least squares on relative errors: small and large networks count alike.
                # Non-negative: a kind of layer never makes a network faster (and kinds that
                # always come together, a batch norm and its activation, share one weight
                # instead of two large ones of opposite signs).
                from scipy.optimize import nnls

                rows = np.stack([np.ones(len(archs))] + columns, axis=1) / measured[:, None]
                coef = nnls(rows, np.ones(len(archs)))[0]
                slopes = dict(zip(names, map(float, coef[1:])))
                self._fit = Calibration(float(coef[0]), slopes)
            else:
                self._fit = Calibration(float(measured.mean() - table.sum(1).mean()),
                                        {"other": 1.0})
        return self._fit

    def predict(self, arch: Architecture) -> float:
        return max(0.0, self.fit().predict(self.layer_sums(arch)))


def calibration_set(space: SearchSpace, size: int, seed: int) -> list[Architecture]:
    """Up to ``size`` distinct random architectures of ``space``, the same for one seed."""
    rng = random.Random(f"latency-calibration:{seed}")
    found: dict[str, Architecture] = {}
    for _ in range(size * 20):
        a = space.sample(rng)
        found.setdefault(a.key, a)
        if len(found) >= size:
            break
    return list(found.values())


@dataclass
class KernelFit:
    """``intercept + slope * sum over kernels of (table latency - overhead)``."""

    overhead: float
    intercept: float
    slope: float

    def predict(self, latencies: Sequence[float]) -> float:
        return self.intercept + self.slope * sum(max(0.0, t - self.overhead) for t in latencies)


class KernelTablePredictor:
    """Predicts the latency of a space's networks from a table of fused kernels (nn-Meter
    style): each kernel (a convolution or linear layer with the batch norms and activations
    the runtime fuses into it, :mod:`frugalnas.latency.kernels`) is measured once alone, keyed
    by its layers' full configuration and input shape. A kernel measured alone pays the
    runtime's per-call overhead, a network only once, so a network's prediction is
    ``intercept + slope * sum(kernel latency - per-call overhead)``; the two numbers are fitted
    by non-negative least squares on the relative error to ``calibration`` networks measured
    whole (without calibration networks they are the overhead and 1). The calibration
    networks, their kernels and the overhead probe are measured together, in interleaved
    rounds, so a machine whose speed drifts affects table and networks alike. With
    ``tokens`` the networks are language models on int64 tokens (``input_shape`` ``(T,)``),
    whose attention, MLP, embedding and output stages are kernels measured whole."""

    def __init__(self, space: SearchSpace, meter: LatencyMeter, num_classes: int,
                 input_shape: Sequence[int], calibration: int = 20, seed: int = 0,
                 tokens: bool = False):
        self.space, self.meter = space, meter
        self.num_classes, self.input_shape = int(num_classes), tuple(int(s) for s in input_shape)
        self.calibration_size, self.seed = int(calibration), int(seed)
        self.tokens = bool(tokens)
        self._fit: KernelFit | None = None

    def kernels(self, arch: Architecture) -> list[Kernel]:
        """The kernels ``arch``'s network runs, in order."""
        return network_kernels(self.space.build(arch, self.num_classes, self.input_shape),
                               self.input_shape, self.tokens)

    def prepare(self, archs: Sequence[Architecture]) -> None:
        """Measure the kernels of ``archs`` missing from the table, together (interleaved
        rounds), so that later predictions of them cost no measurement."""
        self.meter.kernels([k for a in archs for k in self.kernels(a)])

    def calibration_set(self) -> list[Architecture]:
        return calibration_set(self.space, self.calibration_size, self.seed)

    def fit(self) -> KernelFit:
        """Measure the calibration networks whole, with their kernels and the overhead probe,
        and fit the intercept and slope."""
        import numpy as np

        if self._fit is None:
            archs = self.calibration_set()
            kernels = [self.kernels(a) for a in archs]
            meter = self.meter
            nets = [meter.network_item(self.space, a, self.num_classes, self.input_shape,
                                       self.tokens) for a in archs]
            table = [meter.kernel_item(k) for ks in kernels for k in ks]
            done = meter.cached_many(nets + table + [meter.probe_item()])
            overhead = done[-1][0].median_ms
            measured = np.array([m.median_ms for m, _ in done[:len(nets)]])
            sums = np.array([sum(max(0.0, t - overhead) for t in self.meter.kernels(ks))
                             for ks in kernels])
            fit = KernelFit(overhead, overhead, 1.0)
            if len(archs) >= 2 and sums.std() > 0:
                from scipy.optimize import nnls

                # relative errors: small and large networks count alike
                rows = np.stack([np.ones(len(archs)), sums], axis=1) / measured[:, None]
                coef = nnls(rows, np.ones(len(archs)))[0]
                fit = KernelFit(overhead, float(coef[0]), float(coef[1]))
            self._fit = fit
        return self._fit

    def predict(self, arch: Architecture) -> float:
        fit = self.fit()
        return max(0.0, fit.predict(self.meter.kernels(self.kernels(arch))))


def prediction_quality(predicted: Sequence[float], measured: Sequence[float],
                       tolerance: float = 0.10) -> dict[str, float]:
    """How well predictions match fresh measurements: the share within ``tolerance``
    (relative), Kendall's tau, and the mean absolute relative error."""
    import numpy as np
    from scipy.stats import kendalltau

    p, m = np.asarray(predicted, float), np.asarray(measured, float)
    rel = np.abs(p - m) / m
    return {"within": float((rel <= tolerance).mean()),
            "kendall_tau": float(kendalltau(p, m)[0]), "mean_abs_rel_error": float(rel.mean())}
