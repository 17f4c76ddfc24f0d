"""An example frugalnas plugin: registers the ``hello-mlp`` search space, the
``hello-logit-spread`` zero-cost proxy (an estimator of the same name too) and the
``hello-climb`` search strategy through the ``frugalnas`` entry-point group."""

from __future__ import annotations

import random
from typing import Any

import optuna
import torch
from optuna.distributions import BaseDistribution, CategoricalDistribution
from optuna.trial import FrozenTrial
from torch import nn

import frugalnas
from frugalnas import ArchSampler, History, Proxy, strategy_factory

ACTIVATIONS = {"relu": nn.ReLU, "tanh": nn.Tanh, "gelu": nn.GELU}


class MLPSpace(frugalnas.SearchSpace):
    """Multi-layer perceptrons: depth, width of each layer and activation."""

    name = "hello-mlp"

    def __init__(self, max_depth: int = 3, widths: tuple[int, ...] = (16, 32, 64)):
        self.max_depth = max_depth
        self.widths = tuple(widths)

    def distributions(self) -> dict[str, BaseDistribution]:
        dists: dict[str, BaseDistribution] = {
            "depth": CategoricalDistribution(tuple(range(1, self.max_depth + 1))),
            "activation": CategoricalDistribution(tuple(ACTIVATIONS))}
        for i in range(self.max_depth):
            dists[f"width_{i}"] = CategoricalDistribution(self.widths)
        return dists

    def build(self, arch: frugalnas.Architecture, num_classes: int = 10,
              input_shape: tuple[int, ...] = (1, 8, 8)) -> nn.Module:
        self.validate(arch)
        layers: list[nn.Module] = [nn.Flatten()]
        fan_in = input_shape[0] * input_shape[1] * input_shape[2]
        for i in range(int(arch["depth"])):
            width = int(arch[f"width_{i}"])
            layers += [nn.Linear(fan_in, width), ACTIVATIONS[str(arch["activation"])]()]
            fan_in = width
        layers.append(nn.Linear(fan_in, num_classes))
        return nn.Sequential(*layers)


class LogitSpread(Proxy):
    """Spread (standard deviation) of the untrained network's logits over one batch; a toy
    proxy that shows the plugin API, not a recommended estimator."""

    name = "hello-logit-spread"
    needs_data = True
    needs_labels = False
    passes = 1.0

    def __init__(self, seed: int = 0):
        self.seed = seed

    def compute(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor | None) -> float:
        model.eval()
        with torch.no_grad():
            return float(model(inputs).std())


class HillClimb(ArchSampler):
    """Hill climbing: mutate the best architecture found so far; with probability
    ``explore``, try an unseen random architecture instead."""

    # explore is this strategy's option; **common passes ArchSampler's common options on
    # (the registry reads them, and their defaults, from ArchSampler itself).
    def __init__(self, space: frugalnas.SearchSpace, seed: int = 0, n_init: int = 4,
                 explore: float = 0.1, **common: Any):
        if isinstance(explore, bool) or not isinstance(explore, (int, float)) \
                or not 0.0 <= explore <= 1.0:
            raise frugalnas.ConfigError(f"invalid explore {explore!r} for strategy "
                                        "'hello-climb'; valid: a number in [0, 1]")
        super().__init__(space, seed, n_init, **common)
        self.explore = float(explore)

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> frugalnas.Architecture:
        if rng.random() < self.explore:
            return self.fresh_random(hist, rng)
        fit = self.fitness(study, hist.values, hist.violations)  # higher is better
        best = max(range(len(hist)), key=lambda i: (fit[i], -hist.numbers[i]))
        return self.fresh_mutation(hist.archs[best], hist, rng)


@frugalnas.hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"hello-climb": strategy_factory(HillClimb)}


@frugalnas.hookimpl
def frugalnas_search_spaces() -> dict[str, Any]:
    return {"hello-mlp": MLPSpace}


@frugalnas.hookimpl
def frugalnas_proxies() -> dict[str, Any]:
    return {"hello-logit-spread": LogitSpread}
