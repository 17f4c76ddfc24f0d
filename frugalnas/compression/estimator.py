"""The ``inherited-loss`` estimator: a sub-network of a trained parent scored one-shot, with
the weights it inherits and no training: its validation loss in nats per token (minimise it)."""

from __future__ import annotations

import time
from collections.abc import Mapping
from typing import Any

from frugalnas.compression.space import SubnetSpace
from frugalnas.engine.training import split_metric
from frugalnas.latency.measure import LatencySetup, measure_many
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost, count_params
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.space import SearchSpace

#: The metric of a sub-network's size that budgets bound.
PARAMS = "non_embedding_params"
#: Its latency: ONNX Runtime, batch 1, one block of tokens, one thread (ms).
LATENCY = "latency_ms"
#: Its inference memory: float32 weights and the key/value cache of one block (MiB).
MEMORY = "memory_mib"
#: The inherited weights' validation loss (also the value).
INHERITED = "inherited_loss"
#: How a candidate's latency is measured (a few repetitions: the search sees many).
LATENCY_SETUP = LatencySetup(runtime="onnxruntime", warmup=3, repeats=15)


def latency_ms(model: Any, context: int, vocab_size: int,
               setup: LatencySetup = LATENCY_SETUP) -> float:
    """The median latency of ``model`` on one block of ``context`` tokens."""
    return float(measure_many([(model, (context,), vocab_size)], setup)[0].median_ms)


class InheritedLoss(Estimator):
    """A sub-network of the ``gpt-subnet`` space scored with the weights it inherits from the
    trained parent, without training: validation loss in nats per token (minimise it);
    options valid_examples, latency.

    ``valid_examples`` is how many validation blocks are scored (None: all); ``latency``
    also measures each sub-network's ONNX Runtime latency (``latency_ms``: batch 1, one block
    of tokens, one thread), for a latency budget."""

    name = "inherited-loss"
    provides: tuple[str, ...] = (PARAMS, MEMORY, INHERITED)
    measures = ("seconds", "params")

    def __init__(self, valid_examples: int | None = 64, latency: bool = False):
        if valid_examples is not None:
            check_range("valid_examples", valid_examples, 1)
        if not isinstance(latency, bool):
            raise ConfigError(f"invalid latency {latency!r}; valid: true, false")
        self.valid_examples, self.latency = valid_examples, latency
        if latency:
            self.provides = (*self.provides, LATENCY)

    def check_space(self, space: SearchSpace) -> None:
        if not isinstance(space, SubnetSpace):
            raise ConfigError(f"estimator {self.name!r} scores sub-networks of a trained "
                              f"parent: it needs space 'gpt-subnet', got {space.name!r}")

    def known_metrics(self, arch: Architecture, space: SearchSpace) -> Mapping[str, float]:
        if not isinstance(space, SubnetSpace):
            return {}
        return {PARAMS: float(space.non_embedding_params(arch)),
                MEMORY: space.memory_mib(arch)}

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        start = time.perf_counter()
        data = context.dataset
        space = context.space
        assert isinstance(space, SubnetSpace)
        network = space.build(arch, data.num_classes, data.input_shape)
        metrics = dict(self.known_metrics(arch, space))
        if self.latency:   # on the CPU network, before the backend moves it
            metrics[LATENCY] = latency_ms(network, int(data.input_shape[0]),
                                          space.config.vocab_size)
        model = context.backend.prepare(network)
        loss = split_metric(model, context.backend, data, limit=self.valid_examples)
        metrics[INHERITED] = loss
        metrics.update(data.task.derived_metrics(loss))
        cost = Cost(seconds=time.perf_counter() - start, params=count_params(model))
        return EstimateResult(value=loss, metrics=metrics, cost=cost)
