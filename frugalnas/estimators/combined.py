"""Several estimators as one: accuracy from training, latency from a predictor, ..."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.space import SearchSpace


class CombinedEstimator(Estimator):
    """Several estimators as one (accuracy from training, latency from a predictor): the
    first gives the value, every member's metrics are kept.

    ``members`` maps each member's registered name to its options (``{"train": {"epochs": 2}, "latency-predictor": {"input_shape": [1, 28, 28]}}``);
    the first member gives ``value``, every member's metrics become metrics of the
    combination (a name two members produce is refused), costs add up. What any member
    knows before evaluating (``known_metrics``, e.g. a predicted latency) the combination
    knows too, so a constrained study screens candidates with it."""

    name = "combined"

    def __init__(self, members: dict[str, dict[str, Any]], host: Any = None):
        if not isinstance(members, dict) or not members:
            raise ConfigError(f"invalid members {members!r}; expected a table of estimator "
                              "names to their options, e.g. {train = {epochs = 2}, "
                              "latency-predictor = {}}")
        if host is None:
            raise ConfigError("the combined estimator needs the study's plugin host (host=)")
        if "combined" in members:
            raise ConfigError("the combined estimator cannot contain itself")
        self.members: dict[str, Estimator] = {}
        for name, options in members.items():
            if not isinstance(options, dict):
                raise ConfigError(f"invalid options {options!r} of member {name!r}; expected "
                                  "a table of options ({} for none)")
            self.members[name] = host.create_estimator(name, dict(options))
        owner: dict[str, str] = {}
        for name, member in self.members.items():
            for metric in member.provides:
                if metric in owner:
                    raise ConfigError(f"members {owner[metric]!r} and {name!r} both produce "
                                      f"the metric {metric!r}; combine estimators whose "
                                      "metrics differ")
                owner[metric] = name
        self.provides = tuple(owner)
        self.measures = tuple(dict.fromkeys(m for e in self.members.values() for m in e.measures))
        self.needs_dataset = any(e.needs_dataset for e in self.members.values())

    def check_space(self, space: SearchSpace) -> None:
        for member in self.members.values():
            member.check_space(space)

    def known_metrics(self, arch: Architecture, space: SearchSpace) -> Mapping[str, float]:
        known: dict[str, float] = {}
        for member in self.members.values():
            known.update(member.known_metrics(arch, space))
        return known

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        results = [(name, member.evaluate(arch, context))
                   for name, member in self.members.items()]
        first = results[0][1]
        combined = EstimateResult(first.value, dict(first.metrics), first.cost,
                                  dict(first.artifacts))
        for name, result in results[1:]:
            combined.metrics.update(result.metrics)
            combined.cost = combined.cost + result.cost
            combined.artifacts.update({f"{name}/{k}": v for k, v in result.artifacts.items()})
        return combined
