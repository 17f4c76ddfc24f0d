"""The ``inherited-loss`` estimator: a sub-network of a trained parent scored one-shot, with
the weights it inherits and no training: its validation loss in nats per token (minimise it)."""

from __future__ import annotations

import time
from collections.abc import Mapping

from frugalnas.compress.space import SubnetSpace
from frugalnas.engine.training import split_metric
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost, count_params
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.space import SearchSpace

#: The metric of a sub-network's size that budgets bound.
PARAMS = "non_embedding_params"


class InheritedLoss(Estimator):
    """A sub-network of the ``gpt-subnet`` space scored with the weights it inherits from the
    trained parent, without training: validation loss in nats per token (minimise it);
    option valid_examples.

    ``valid_examples`` is how many validation blocks are scored (None: all)."""

    name = "inherited-loss"
    provides = (PARAMS, "valid_loss")
    measures = ("seconds", "params")

    def __init__(self, valid_examples: int | None = 64):
        if valid_examples is not None:
            check_range("valid_examples", valid_examples, 1)
        self.valid_examples = valid_examples

    def check_space(self, space: SearchSpace) -> None:
        if not isinstance(space, SubnetSpace):
            raise ConfigError(f"estimator {self.name!r} scores sub-networks of a trained "
                              f"parent: it needs space 'gpt-subnet', got {space.name!r}")

    def known_metrics(self, arch: Architecture, space: SearchSpace) -> Mapping[str, float]:
        if not isinstance(space, SubnetSpace):
            return {}
        return {PARAMS: float(space.non_embedding_params(arch))}

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        start = time.perf_counter()
        data = context.dataset
        space = context.space
        assert isinstance(space, SubnetSpace)
        model = context.backend.prepare(space.build(arch, data.num_classes, data.input_shape))
        loss = split_metric(model, context.backend, data, limit=self.valid_examples)
        metrics = {PARAMS: float(space.non_embedding_params(arch)), "valid_loss": loss}
        cost = Cost(seconds=time.perf_counter() - start, params=count_params(model))
        return EstimateResult(value=loss, metrics=metrics, cost=cost)
