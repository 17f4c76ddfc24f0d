"""Conformance checks for search spaces (:class:`frugalnas.SearchSpace`)."""

from __future__ import annotations

import random
from typing import Any

from frugalnas.nn.weight_store import WeightStore
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.capabilities import WeightSharing, capability
from frugalnas.ports.errors import ArchitectureParseError
from frugalnas.ports.space import SearchSpace, params_of
from frugalnas.ports.task import IMAGE_CLASSIFICATION, Task
from frugalnas.testing._suite import Suite, describe

#: a decision value no real space offers
_BAD_VALUE = "__frugalnas_invalid_value__"


class SearchSpaceChecks(Suite):
    """The search-space contract: optuna distributions, text/JSON/params round trips,
    validation that rejects foreign architectures, seeded sampling, mutation, crossover,
    neighbours, ``suggest`` on an optuna trial, and ``build`` giving a fresh, seeded
    ``nn.Module`` whose outputs have the shape the space's ``task`` asks for: ``(batch,
    num_classes)`` for image classes (the default), ``(batch, context, num_classes)`` next-token
    logits for language modelling (then ``input_shapes`` are ``(context,)`` and
    ``num_classes`` the vocabulary)."""

    kind = "search_spaces"
    checks = ("check_distributions", "check_round_trips", "check_same_seed_same_sample",
              "check_validate_rejects_bad_architectures", "check_mutate", "check_crossover",
              "check_neighbours", "check_suggest", "check_build", "check_weight_sharing")

    def __init__(self, space: Any, *, name: str | None = None,
                 input_shapes: tuple[tuple[int, ...], ...] = ((3, 8, 8), (1, 8, 8)),
                 num_classes: int = 5, seed: int = 0, samples: int = 6,
                 task: Task = IMAGE_CLASSIFICATION):
        self.space, self.seed, self.samples, self.task = space, seed, samples, task
        self.input_shapes, self.num_classes = tuple(map(tuple, input_shapes)), num_classes
        self.subject = describe("search space", space, name)

    # -- helpers -------------------------------------------------------------------------
    def _sample(self, i: int = 0) -> Any:
        arch = self.space.sample(random.Random(f"{self.seed}:{i}"))
        if not isinstance(arch, Architecture):
            self.fail(f"sample() returned {type(arch).__name__}, not a frugalnas Architecture")
        return arch

    def _inputs(self, shape: tuple[int, ...]) -> Any:
        import torch

        return self.task.example_batch(2, shape, self.num_classes,
                                       torch.Generator().manual_seed(self.seed))[0]

    def _valid(self, arch: Any, what: str) -> None:
        try:
            self.space.validate(arch)
        except ArchitectureParseError as exc:
            self.fail(f"{what} gave an architecture its own validate() rejects: {arch} ({exc})")

    def _expect_parse_error(self, what: str, call: Any) -> None:
        try:
            call()
        except ArchitectureParseError:
            return
        except Exception as exc:
            self.fail(f"{what} raised {type(exc).__name__} ({exc}); it must raise "
                      "frugalnas.ArchitectureParseError")
        self.fail(f"{what} was accepted; it must raise frugalnas.ArchitectureParseError")

    # -- checks --------------------------------------------------------------------------
    def check_distributions(self) -> None:
        from optuna.distributions import (
            CategoricalDistribution,
            FloatDistribution,
            IntDistribution,
        )

        if not isinstance(self.space, SearchSpace):
            self.fail(f"{type(self.space).__name__} does not subclass frugalnas.SearchSpace")
        name = getattr(self.space, "name", None)
        if not isinstance(name, str) or not name or ":" in name:
            self.fail(f"name {name!r} must be a non-empty string without ':' (it prefixes "
                      "the text form of every architecture)")
        dists = self.space.distributions()
        if not isinstance(dists, dict) or not dists:
            self.fail(f"distributions() returned {dists!r}; expected a non-empty dict "
                      "{decision name: optuna distribution}")
        for key, dist in dists.items():
            if not isinstance(key, str) or not key:
                self.fail(f"decision name {key!r} is not a non-empty string")
            if not isinstance(dist, (CategoricalDistribution, IntDistribution,
                                     FloatDistribution)):
                self.fail(f"decision {key!r} has {type(dist).__name__}; expected an optuna "
                          "CategoricalDistribution, IntDistribution or FloatDistribution")
            if isinstance(dist, CategoricalDistribution):
                bad = [c for c in dist.choices if not isinstance(c, (str, int, float, bool))]
                if bad:
                    self.fail(f"decision {key!r} has choices {bad!r}; architectures hold only "
                              "str, int, float and bool values")
        if all(d.single() for d in dists.values()):
            self.fail("every decision has a single value: nothing to search (and mutate() "
                      "cannot change anything)")
        if list(self.space.distributions()) != list(dists):
            self.fail("distributions() returned the decisions in a different order on a second "
                      "call; the order is the genotype order and must be stable")

    def check_round_trips(self) -> None:
        for i in range(self.samples):
            arch = self._sample(i)
            self._valid(arch, "sample()")
            order = list(self.space.active_decisions(arch))
            if arch.space != self.space.name:
                self.fail(f"sample() gave an architecture of space {arch.space!r}, not "
                          f"{self.space.name!r}")
            if list(arch.decisions) != order:
                self.fail(f"sample() gave decisions {list(arch.decisions)}; expected the "
                          f"keys of active_decisions() in order {order}")
            text = str(arch)
            back = self.space.parse(text)
            if back != arch:
                self.fail(f"parse(str(arch)) gave {back} for {text}")
            if back.key != arch.key:
                self.fail(f"parse(str(arch)).key differs from arch.key for {text}")
            params = params_of(self.space, arch)
            again = self.space.from_params(params)
            if again != arch:
                self.fail(f"from_params(to_params(arch)) gave {again} for {text}")
            if Architecture.from_json(arch.to_json()) != arch:
                self.fail(f"Architecture.from_json(arch.to_json()) differs for {text}")

    def check_same_seed_same_sample(self) -> None:
        n = max(self.samples, 16)
        first = [self._sample(i) for i in range(n)]
        second = [self._sample(i) for i in range(n)]
        for a, b in zip(first, second):
            if a != b:
                self.fail(f"sample() with two generators of the same seed gave {a} and {b}")
        if len({a.key for a in first}) < 2:
            self.fail(f"sample() gave the same architecture for {n} different seeds")

    def check_validate_rejects_bad_architectures(self) -> None:
        from optuna.distributions import CategoricalDistribution, IntDistribution

        arch = self._sample()
        decisions = arch.decisions
        other = f"{self.space.name}-other"
        self._expect_parse_error(f"validate() of an architecture of space {other!r}",
                                 lambda: self.space.validate(Architecture(other, decisions)))
        last = list(decisions)[-1]
        partial = {k: v for k, v in decisions.items() if k != last}
        self._expect_parse_error(f"from_params() without decision {last!r}",
                                 lambda: self.space.from_params(partial))
        extra = {**decisions, "__extra_decision__": 1}
        self._expect_parse_error(
            "validate() of an architecture with an unknown decision '__extra_decision__'",
            lambda: self.space.validate(Architecture.create(self.space.name, extra)))
        for key, dist in list(self.space.active_decisions(arch).items())[:4]:
            if isinstance(dist, CategoricalDistribution):
                bad: Any = _BAD_VALUE
            elif isinstance(dist, IntDistribution):
                bad = dist.high + dist.step
            else:
                bad = dist.high + abs(dist.high - dist.low) + 1.0
            broken = Architecture.create(self.space.name, {**decisions, key: bad})
            self._expect_parse_error(f"validate() of an architecture with {key}={bad!r}",
                                     lambda b=broken: self.space.validate(b))
            self._expect_parse_error(f"from_params() with {key}={bad!r}",
                                     lambda k=key, b=bad: self.space.from_params(
                                         {**decisions, k: b}))
        self._expect_parse_error("parse() of the malformed text '!!not an architecture!!'",
                                 lambda: self.space.parse("!!not an architecture!!"))
        # e.g. Architecture.from_json of a stored genotype that lacks a decision
        self._expect_parse_error(
            f"validate() of an architecture without decision {last!r}",
            lambda: self.space.validate(Architecture.create(self.space.name, partial)))

    def check_mutate(self) -> None:
        for i in range(self.samples):
            arch = self._sample(i)
            child = self.space.mutate(arch, random.Random(1000 + i))
            self._valid(child, "mutate()")
            if child == arch:
                self.fail(f"mutate() returned the architecture it was given ({arch}); it must "
                          "change it to a different valid one")
            twin = self.space.mutate(arch, random.Random(1000 + i))
            if twin != child:
                self.fail(f"mutate() of {arch} with two generators of the same seed gave "
                          f"{child} and {twin}")

    def check_crossover(self) -> None:
        for i in range(self.samples):
            a, b = self._sample(2 * i), self._sample(2 * i + 1)
            child = self.space.crossover(a, b, random.Random(2000 + i))
            self._valid(child, "crossover()")
            twin = self.space.crossover(a, b, random.Random(2000 + i))
            if twin != child:
                self.fail(f"crossover() of {a} and {b} with two generators of the same seed "
                          f"gave {child} and {twin}")

    def check_neighbours(self) -> None:
        arch = self._sample()
        try:
            neighbours = list(self.space.neighbours(arch))
        except NotImplementedError:
            return
        keys = set()
        for n in neighbours[:64]:
            self._valid(n, "neighbours()")
            if n == arch:
                self.fail(f"neighbours() of {arch} includes the architecture itself")
            keys.add(n.key)
        if len(keys) != len(neighbours[:64]):
            self.fail(f"neighbours() of {arch} repeats an architecture")

    def check_suggest(self) -> None:
        import optuna

        study = optuna.create_study(sampler=optuna.samplers.RandomSampler(seed=self.seed))
        for _ in range(3):
            trial = study.ask()
            arch = self.space.suggest(trial)
            self._valid(arch, "suggest()")
            params = params_of(self.space, arch)
            if dict(trial.params) != dict(params):
                self.fail(f"suggest() gave {arch}, but the trial holds the parameters "
                          f"{trial.params}; every decision must be asked from the trial")
            study.tell(trial, 0.0)

    def check_build(self) -> None:
        import torch
        from torch import nn

        archs = [self._sample(0), self._sample(1)]
        for shape in self.input_shapes:
            for arch in archs:
                torch.manual_seed(self.seed)
                model = self.space.build(arch, self.num_classes, shape)
                where = f"build({arch}, num_classes={self.num_classes}, input_shape={shape})"
                if not isinstance(model, nn.Module):
                    self.fail(f"{where} returned {type(model).__name__}, not a torch.nn.Module")
                params = list(model.parameters())
                if not params:
                    self.fail(f"{where} has no parameters to train")
                initial = {k: v.detach().clone() for k, v in model.state_dict().items()}
                out = model(self._inputs(shape))
                expected = self.task.output_shape(2, shape, self.num_classes)
                if not isinstance(out, torch.Tensor) or tuple(out.shape) != expected:
                    got = tuple(out.shape) if isinstance(out, torch.Tensor) else type(out).__name__
                    self.fail(f"{where}: a batch of 2 gave output {got}; expected "
                              f"{expected} logits")
                if not torch.isfinite(out).all():
                    self.fail(f"{where} gives non-finite outputs")
                out.sum().backward()
                if all(p.grad is None for p in params):
                    self.fail(f"{where}: no parameter receives a gradient")
                torch.manual_seed(self.seed)
                again = self.space.build(arch, self.num_classes, shape)
                if again is model or any(p is q for p, q in zip(again.parameters(), params)):
                    self.fail(f"{where} returned a network it had built before; every call "
                              "must build a fresh one")
                for (k, v), w in zip(initial.items(), again.state_dict().values()):
                    if v.shape != w.shape or not torch.equal(v, w):
                        self.fail(f"{where} twice under the same torch seed gave different "
                                  f"initial values of {k!r}; initialise from torch's RNG")


    def check_weight_sharing(self) -> None:
        """For a space with a supernet (a ``WeightSharing`` capability): networks built over one weight
        store take every parameter from it, ask only keys the builder lists, share tensors
        between architectures and give ``(batch, num_classes)`` logits."""
        sharing = capability(self.space, WeightSharing)
        if sharing is None:
            return
        import torch

        shape = self.input_shapes[0]
        builder = sharing.shared_builder(self.num_classes, shape)
        listed = {repr(k) for k in builder.keys()}  # noqa: SIM118 - a builder, not a dict
        asked: list[Any] = []
        store = WeightStore(builder.factory, seed=self.seed)

        def get(key: Any) -> Any:
            asked.append(key)
            return store.get(key)

        nets = []
        for i in range(2):
            arch = self._sample(i)
            net = builder.subnet(arch, get)
            owned = {id(p) for p in store.parameters()}
            foreign = [n for n, p in net.named_parameters() if id(p) not in owned]
            if foreign:
                self.fail(f"shared_builder().subnet({arch}) has parameters of its own, not the "
                          f"store's: {foreign[:3]}")
            out = net(self._inputs(shape))
            expected = self.task.output_shape(2, shape, self.num_classes)
            if tuple(out.shape) != expected:
                self.fail(f"the shared network of {arch} gave output {tuple(out.shape)}; "
                          f"expected {expected}")
            nets.append({id(p) for p in net.parameters()})
        unlisted = sorted({repr(k) for k in asked} - listed)
        if unlisted:
            self.fail(f"shared networks asked the store for keys keys() does not list: "
                      f"{unlisted[:3]}")
        if not nets[0] & nets[1]:
            self.fail("the shared networks of two architectures share no parameter: the "
                      "supernet shares no weights")


def check_search_space(space: Any, *, input_shapes: tuple[tuple[int, ...], ...] = (
                           (3, 8, 8), (1, 8, 8)),
                       num_classes: int = 5, seed: int = 0, checks: list[str] | None = None,
                       task: Task = IMAGE_CLASSIFICATION) -> list[str]:
    """Run the search-space checks on ``space`` (a :class:`frugalnas.SearchSpace`); returns
    the names of the checks run, raises :class:`~frugalnas.testing.ConformanceError` at the
    first broken rule. ``input_shapes`` are the inputs ``build`` is tried with (``(C, H, W)``
    images, or ``(context,)`` tokens for ``task=LANGUAGE_MODELLING``)."""
    return SearchSpaceChecks(space, input_shapes=input_shapes, num_classes=num_classes,
                             seed=seed, task=task).run(checks)
