"""Running a define-by-run builder with its decisions answered from somewhere.

A builder is a user's function ``builder(trial, **options) -> torch.nn.Module`` that asks for
its decisions through ``trial.suggest_categorical`` / ``suggest_int`` / ``suggest_float`` (the
names and signatures of optuna's trial) while it builds the network; ``trial.num_classes``
and ``trial.input_shape`` say what the network must fit. One *replay* runs the builder once
and records the decisions it asked, in order, with their distributions and answers. Where the
answers come from is an :class:`Answers` object: a fixed architecture, a random draw, an
optuna trial, or a mix of these (mutation keeps the parent's answers and draws the rest).
"""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from optuna.distributions import (BaseDistribution, CategoricalDistribution,
                                  FloatDistribution, IntDistribution)

from frugalnas.ports.errors import ArchitectureParseError, ConfigError, one_line
from frugalnas.ports.space import contains, draw
from frugalnas.ports.space import describe_distribution as describe

Value = Any


class Answers:
    """Where a replay's answers come from: ``answer(name, dist)`` for each asked decision."""

    def answer(self, name: str, dist: BaseDistribution) -> Value:
        raise NotImplementedError


@dataclass
class Fixed(Answers):
    """The answers of ``values``; an asked decision missing from it is an error (or, with
    ``fill``, answered by ``fill``)."""

    values: Mapping[str, Value]
    fill: Answers | None = None
    space_name: str = "space"

    def answer(self, name: str, dist: BaseDistribution) -> Value:
        if name in self.values:
            value = self.values[name]
            if not contains(dist, value):
                raise ArchitectureParseError(
                    f"invalid value {value!r} for decision {name!r} of space "
                    f"{self.space_name!r}; valid: {describe(dist)}")
            return value
        if self.fill is not None:
            return self.fill.answer(name, dist)
        raise ArchitectureParseError(
            f"the architecture for space {self.space_name!r} has no value for decision "
            f"{name!r}, which its builder asks for here (valid: {describe(dist)})")


@dataclass
class Drawn(Answers):
    """Random answers from ``rng``."""

    rng: random.Random

    def answer(self, name: str, dist: BaseDistribution) -> Value:
        return draw(dist, self.rng)


class First(Answers):
    """The first choice of each categorical decision and the low end of each numeric one."""

    def answer(self, name: str, dist: BaseDistribution) -> Value:
        if isinstance(dist, CategoricalDistribution):
            return dist.choices[0]
        if isinstance(dist, (IntDistribution, FloatDistribution)):
            return dist.low
        raise TypeError(f"unsupported distribution {dist!r}")


@dataclass
class FromTrial(Answers):
    """The answers of an optuna trial (so its sampler decides, and the trial stores them)."""

    trial: Any

    def answer(self, name: str, dist: BaseDistribution) -> Value:
        if isinstance(dist, CategoricalDistribution):
            return self.trial.suggest_categorical(name, dist.choices)
        if isinstance(dist, IntDistribution):
            return self.trial.suggest_int(name, dist.low, dist.high, step=dist.step, log=dist.log)
        if isinstance(dist, FloatDistribution):
            return self.trial.suggest_float(name, dist.low, dist.high, step=dist.step,
                                            log=dist.log)
        raise TypeError(f"unsupported distribution {dist!r}")


@dataclass
class Recorded:
    """What one replay asked: the decisions in order, their distributions and answers."""

    values: dict[str, Value] = field(default_factory=dict)
    dists: dict[str, BaseDistribution] = field(default_factory=dict)
    result: Any = None


class ModelTrial:
    """The object a builder receives: optuna's ``suggest_*`` methods, answered by an
    :class:`Answers`, plus ``num_classes`` and ``input_shape`` of the network to build."""

    def __init__(self, answers: Answers, record: Recorded, builder_name: str,
                 num_classes: int, input_shape: tuple[int, ...]):
        self._answers, self._record, self._builder = answers, record, builder_name
        self.num_classes = int(num_classes)
        self.input_shape = tuple(input_shape)
        self.in_channels = int(input_shape[0])

    def _ask(self, name: str, dist: BaseDistribution) -> Value:
        if not isinstance(name, str) or not name or any(c in name for c in ",=:"):
            raise ConfigError(f"builder {self._builder} asks for a decision named {name!r}; "
                              "decision names are non-empty strings without ',', '=' or ':'")
        seen = self._record.dists.get(name)
        if seen is not None:
            if seen != dist:
                raise ConfigError(
                    f"builder {self._builder} asks for decision {name!r} twice with different "
                    f"choices ({describe(seen)} and {describe(dist)}); give each its own name")
            return self._record.values[name]
        value = self._answers.answer(name, dist)
        self._record.dists[name] = dist
        self._record.values[name] = value
        return value

    def suggest_categorical(self, name: str, choices: Any) -> Value:
        choices = tuple(choices)
        for c in choices:
            if not isinstance(c, (str, int, float, bool)):
                raise ConfigError(f"builder {self._builder}: decision {name!r} has choice "
                                  f"{c!r} of type {type(c).__name__}; valid choice types: "
                                  "str, int, float, bool")
        if not choices:
            raise ConfigError(f"builder {self._builder}: decision {name!r} has no choices")
        return self._ask(name, CategoricalDistribution(choices))

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> int:
        try:
            dist = IntDistribution(int(low), int(high), step=int(step), log=bool(log))
        except ValueError as exc:
            raise ConfigError(f"builder {self._builder}: decision {name!r}: {exc}") from None
        return int(self._ask(name, dist))

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> float:
        try:
            dist = FloatDistribution(float(low), float(high), step=step, log=bool(log))
        except ValueError as exc:
            raise ConfigError(f"builder {self._builder}: decision {name!r}: {exc}") from None
        return float(self._ask(name, dist))


def replay(builder: Callable[..., Any], options: Mapping[str, Any], answers: Answers,
           builder_name: str, num_classes: int, input_shape: tuple[int, ...],
           *, meta: bool) -> Recorded:
    """Run ``builder`` once with ``answers``; ``meta`` builds on torch's meta device (no
    memory, no initialisation: for replays that only need the decisions). An exception of the
    builder other than an invalid architecture becomes a one-line ConfigError naming the
    builder and the decisions asked so far; so does a result that is not an ``nn.Module``."""
    import torch
    from torch import nn

    record = Recorded()
    trial = ModelTrial(answers, record, builder_name, num_classes, input_shape)
    try:
        if meta:
            with torch.device("meta"):
                result = builder(trial, **options)
        else:
            result = builder(trial, **options)
    except (ArchitectureParseError, ConfigError):
        raise
    except Exception as exc:
        raise ConfigError(f"builder {builder_name} failed after deciding "
                          f"{_decided(record)}: {one_line(exc)}") from exc
    if not isinstance(result, nn.Module):
        raise ConfigError(f"builder {builder_name} returned {type(result).__name__} after "
                          f"deciding {_decided(record)}; it must return a torch.nn.Module")
    record.result = result
    return record


def _decided(record: Recorded) -> str:
    if not record.values:
        return "nothing"
    return ", ".join(f"{k}={v!r}" for k, v in record.values.items())
