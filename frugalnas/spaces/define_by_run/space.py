"""DefineByRunSpace: a search space whose decisions are asked by a user's builder function.

The space's decisions are those its builder asks. Some may be conditional (the kernel of a
fourth layer is asked only when the depth is at least four), so an architecture holds only
its *active* decisions, in the order the builder asked them: inactive ones are neither stored
nor mutated, and optuna stores exactly the decisions a trial's network uses. The union of all
decisions (:meth:`distributions`, what optuna's relative samplers and the one-hot encoding
see) is discovered by replaying the builder with varied answers.
"""

from __future__ import annotations

import inspect
import random
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

from optuna.distributions import (BaseDistribution, CategoricalDistribution,
                                  FloatDistribution, IntDistribution)

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ArchitectureParseError, ConfigError
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.space import changed_decision, contains, draw
from frugalnas.ports.space import describe_distribution as describe
from frugalnas.spaces.define_by_run.replay import (Answers, Drawn, First, Fixed, FromTrial,
                                                   Recorded, replay)

if TYPE_CHECKING:
    import optuna
    from torch import nn

#: The network shape decisions are discovered with; a builder's decisions should not depend
#: on it (its layers may).
DISCOVERY_SHAPE: tuple[int, int, int] = (3, 32, 32)
DISCOVERY_CLASSES = 10


class DefineByRunSpace(SearchSpace):
    """The search space of a builder ``builder(trial, **options) -> nn.Module`` that asks its
    decisions with optuna's ``trial.suggest_categorical/int/float`` (``trial.num_classes``
    and ``trial.input_shape`` give the network's shape). ``discovery`` random replays (plus
    the all-first and all-last ones) find every decision and its choices."""

    #: The builder decides what its networks do: they may classify images or model text.
    tasks = ("image-classification", "language-modelling")

    def __init__(self, builder: Callable[..., Any], name: str | None = None,
                 options: Mapping[str, Any] | None = None, discovery: int = 200,
                 seed: int = 0):
        if not inspect.isfunction(builder):
            raise ConfigError(f"a define-by-run space needs a builder function "
                              f"(def builder(trial, ...)), got {builder!r}")
        self.builder = builder
        self.builder_name = _builder_name(builder)
        self.name = name or builder.__name__
        if not self.name or ":" in self.name or "," in self.name:
            raise ConfigError(f"invalid space name {self.name!r}: a non-empty name without "
                              "':' or ','")
        self.options = dict(options or {})
        self._dists = self._discover(int(discovery), int(seed))

    # -- replays -------------------------------------------------------------------------
    def _replay(self, answers: Answers, *, meta: bool = True,
                num_classes: int = DISCOVERY_CLASSES,
                input_shape: tuple[int, ...] = DISCOVERY_SHAPE) -> Recorded:
        return replay(self.builder, self.options, answers, self.builder_name, num_classes,
                      input_shape, meta=meta)

    def _discover(self, runs: int, seed: int) -> dict[str, BaseDistribution]:
        found: dict[str, BaseDistribution] = {}

        def add(record: Recorded) -> None:
            for key, dist in record.dists.items():
                seen = found.setdefault(key, dist)
                if seen != dist:
                    raise ConfigError(
                        f"builder {self.builder_name} asks for decision {key!r} with choices "
                        f"that depend on other decisions ({describe(seen)} and "
                        f"{describe(dist)}); give each variant its own decision name")

        add(self._replay(First()))
        add(self._replay(_Last()))
        rng = random.Random(f"discover:{seed}")
        for _ in range(runs):
            add(self._replay(Drawn(rng)))
        if not found:
            raise ConfigError(f"builder {self.builder_name} asks for no decision; a search "
                              "space needs at least one trial.suggest_* call")
        return found

    def _arch(self, record: Recorded) -> Architecture:
        for key, dist in record.dists.items():
            if key not in self._dists:  # a decision discovery never reached
                self._dists[key] = dist
        return Architecture(self.name, record.values)

    # -- the SearchSpace contract --------------------------------------------------------
    def distributions(self) -> dict[str, BaseDistribution]:
        return dict(self._dists)

    def active_decisions(self, arch: Architecture) -> dict[str, BaseDistribution]:
        """The decisions ``arch``'s network asks, with their distributions, in order."""
        return self._replay(Fixed(arch.decisions, space_name=self.name)).dists

    def build(self, arch: Architecture, num_classes: int,
              input_shape: tuple[int, ...]) -> nn.Module:
        self.validate(arch)
        record = self._replay(Fixed(arch.decisions, space_name=self.name), meta=False,
                              num_classes=num_classes, input_shape=tuple(input_shape))
        module: nn.Module = record.result
        _materialise_lazy(module, tuple(input_shape))
        return module

    def from_params(self, params: Mapping[str, Any]) -> Architecture:
        """The architecture of ``params``: the decisions the builder asks, taken from
        ``params`` (values of decisions it does not ask are ignored)."""
        return self._arch(self._replay(Fixed(params, space_name=self.name)))

    def suggest(self, trial: optuna.trial.BaseTrial) -> Architecture:
        # Not on the meta device: the trial's sampler runs inside this replay (optuna asks it
        # at the first suggest) and may build and run networks of its own.
        return self._arch(self._replay(FromTrial(trial), meta=False))

    def validate(self, arch: Architecture) -> None:
        if arch.space != self.name:
            raise ArchitectureParseError(
                f"architecture of space {arch.space!r} given to space {self.name!r}")
        decisions = arch.decisions
        asked = self._replay(Fixed(decisions, space_name=self.name)).values
        if list(asked) != list(decisions):
            extra = [k for k in decisions if k not in asked]
            raise ArchitectureParseError(
                f"architecture {arch} has decisions its builder does not ask with these "
                f"values ({extra or 'a different order'}); it asks {list(asked)}")

    def sample(self, rng: random.Random) -> Architecture:
        return self._arch(self._replay(Drawn(rng)))

    def mutate(self, arch: Architecture, rng: random.Random) -> Architecture:
        """Change one active decision to a different valid value; decisions that become
        active are drawn at random, those that become inactive are dropped."""
        change = changed_decision(self.active_decisions(arch), arch, rng)
        if change is None:
            return arch
        key, value = change
        return self._arch(self._replay(Fixed({**arch.decisions, key: value},
                                             fill=Drawn(rng), space_name=self.name)))

    def crossover(self, a: Architecture, b: Architecture, rng: random.Random) -> Architecture:
        """Each asked decision from either parent (from the one that has it when only one
        does; drawn at random when neither does)."""
        da, db = a.decisions, b.decisions
        return self._arch(self._replay(_Either(da, db, rng)))

    def neighbours(self, arch: Architecture) -> list[Architecture]:
        """Every architecture one edit away: one categorical decision changed to another
        choice, or one integer decision one step up or down; decisions that become active
        take their first choice."""
        out: list[Architecture] = []
        seen = {arch.key}
        for key, dist in self.active_decisions(arch).items():
            for value in _one_step(dist, arch[key]):
                other = self._arch(self._replay(Fixed({**arch.decisions, key: value},
                                                      fill=First(), space_name=self.name)))
                if other.key not in seen:
                    seen.add(other.key)
                    out.append(other)
        return out

    def enumerate(self) -> Iterator[Architecture]:
        """Every architecture, depth first over the builder's decision tree (categorical and
        integer decisions only)."""
        pending: list[list[int]] = [[]]
        while pending:
            path = pending.pop()
            answers = _Path(path)
            record = self._replay(answers)
            for depth in range(len(path), len(answers.sizes)):
                for alt in range(answers.sizes[depth] - 1, 0, -1):
                    pending.append(answers.taken[:depth] + [alt])
            yield self._arch(record)


def _materialise_lazy(module: nn.Module, input_shape: tuple[int, ...]) -> None:
    """Give lazy modules (``nn.LazyLinear``, ...) their shapes with one forward pass of a
    zero batch in eval mode, so the network is whole before training, counting or export."""
    import torch
    from torch.nn.parameter import is_lazy

    if not any(is_lazy(p) for p in module.parameters()):
        return
    training = module.training
    module.eval()
    with torch.no_grad():
        module(torch.zeros(2, *input_shape))
    module.train(training)


def _builder_name(builder: Callable[..., Any]) -> str:
    return f"{builder.__module__}:{builder.__qualname__}"


def _one_step(dist: BaseDistribution, value: Any) -> list[Any]:
    if isinstance(dist, CategoricalDistribution):
        return [c for c in dist.choices if c != value]
    if isinstance(dist, IntDistribution) and not dist.log:
        return [v for v in (value - dist.step, value + dist.step) if dist.low <= v <= dist.high]
    return []


class _Last(Answers):
    def answer(self, name: str, dist: BaseDistribution) -> Any:
        if isinstance(dist, CategoricalDistribution):
            return dist.choices[-1]
        if isinstance(dist, IntDistribution):
            return dist.low + (dist.high - dist.low) // dist.step * dist.step
        if isinstance(dist, FloatDistribution):
            return dist.high
        raise TypeError(f"unsupported distribution {dist!r}")


class _Either(Answers):
    def __init__(self, a: Mapping[str, Any], b: Mapping[str, Any], rng: random.Random):
        self.a, self.b, self.rng = a, b, rng

    def answer(self, name: str, dist: BaseDistribution) -> Any:
        options = [v for v in (self.a.get(name), self.b.get(name))
                   if v is not None and contains(dist, v)]
        if options:
            return options[0] if len(options) == 1 else self.rng.choice(options)
        return draw(dist, self.rng)


class _Path(Answers):
    """Answers along an enumeration path: the given choice indices, then the first ones;
    records how many choices each asked decision had."""

    def __init__(self, path: list[int]):
        self.path, self.sizes, self.taken = list(path), [], []

    def answer(self, name: str, dist: BaseDistribution) -> Any:
        if isinstance(dist, CategoricalDistribution):
            values = list(dist.choices)
        elif isinstance(dist, IntDistribution):
            values = list(range(dist.low, dist.high + 1, dist.step))
        else:
            raise ConfigError(f"decision {name!r} is a float: a space with float decisions "
                              "cannot be enumerated")
        depth = len(self.sizes)
        index = self.path[depth] if depth < len(self.path) else 0
        self.sizes.append(len(values))
        self.taken.append(index)
        return values[index]
