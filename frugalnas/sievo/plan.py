"""The generation plans of SI-EvoNAS: the object the ``si-evolution`` strategy shares with the
``inherited`` estimator through the evaluation context.

Trials are grouped in generations by number: generation 0 is ``population_size`` random
candidates, each later generation ``offspring`` children. A generation's plan names the
population that is trained on the shared weights at its start and the offspring its trials
evaluate. :class:`GenerationPlans` computes each plan once (environmental selection over the
previous generation, then binary tournaments, node-wise crossover and mutation), keeps the
population re-scores the estimator records after training, and persists both in the study's
storage, so a resumed study or another worker follows the same plan. How they are stored is
this module's business: callers use the typed methods only, with the study as the strategy
sees it (an ``optuna.Study``) or as the estimator does (its
:class:`~frugalnas.ports.estimator.TrialContext`: the study's history and key-value store).
"""

from __future__ import annotations

import random
import threading
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass
from typing import Any, TypeAlias

import optuna
from optuna.trial import TrialState

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.estimator import PastTrial, StudyStore, TrialContext
from frugalnas.ports.space import SearchSpace
from frugalnas.engine.trial_context import OptunaStudyStore, study_directions, study_history

#: The study whose plans a method concerns: the ``optuna.Study`` a sampler is called with, or
#: the :class:`TrialContext` an estimator receives.
PlanStudy: TypeAlias = "optuna.Study | TrialContext"

# Study user attributes (the storage format, unchanged since plans were first stored).
_PLAN_ATTR = "sievo:gen:{}"
_RESCORES_ATTR = "sievo:gen:{}:fitness"


@dataclass(frozen=True)
class SampledTraining:
    """How the population of a generation is trained on the shared weights: ``batches`` steps
    of ``batch_size`` examples, each on one parent drawn at random, with SGD (``lr``,
    ``momentum``, ``weight_decay``); before generation 0, ``warmup_batches`` steps each on a
    new uniformly drawn candidate."""

    batches: int = 50
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 3e-4
    warmup_batches: int = 0

    def optimizer_options(self) -> dict[str, float]:
        return {"batch_size": self.batch_size, "lr": self.lr, "momentum": self.momentum,
                "weight_decay": self.weight_decay}


@dataclass(frozen=True)
class GenerationPlan:
    """One generation: the population trained at its start (architecture strings), their
    fitness at selection time (higher is better; ``None`` for generation 0) and the offspring
    its trials evaluate, in trial order."""

    generation: int
    population: tuple[str, ...]
    fitness: tuple[float | None, ...]
    offspring: tuple[str, ...]

    def to_json(self) -> dict[str, Any]:
        return {"generation": self.generation, "population": list(self.population),
                "fitness": list(self.fitness), "offspring": list(self.offspring)}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> GenerationPlan:
        return cls(int(data["generation"]), tuple(data["population"]), tuple(data["fitness"]),
                   tuple(data["offspring"]))


@dataclass(frozen=True)
class _Records:
    """What the plans read and write of a study: its key-value store, whether it maximises
    its first objective, and its trials."""

    store: StudyStore
    maximize: bool
    history: Callable[[Sequence[TrialState] | None], list[PastTrial]]


class GenerationPlans:
    """The generation plans and population re-scores of one SI-EvoNAS search.

    Methods take the study whose plans they concern (:data:`PlanStudy`: the strategy's
    ``optuna.Study`` or the estimator's :class:`TrialContext`); plans are computed once per
    study, cached, and stored in that study (``plan``); re-scores are recorded by the
    estimator after the sampled training (``record_rescores``) and read back by the next
    selection (``rescores``)."""

    def __init__(self, space: SearchSpace, seed: int = 0, population_size: int = 10,
                 offspring: int | None = None, generations: int | None = None,
                 crossover_prob: float = 0.9, mutation_prob: float = 1.0,
                 tournament_size: int = 2, training: SampledTraining | None = None,
                 checkpoint_dir: str | None = None):
        self.space, self.seed = space, int(seed)
        self.population_size = int(population_size)
        self.offspring = int(offspring if offspring is not None else population_size)
        self.generations = generations
        self.crossover_prob, self.mutation_prob = float(crossover_prob), float(mutation_prob)
        self.tournament_size = int(tournament_size)
        self.training = training if training is not None else SampledTraining()
        #: Where the weight store is saved (``None``: next to a sqlite storage, else a
        #: temporary folder; see :func:`frugalnas.sievo.session.checkpoint_path`).
        self.checkpoint_dir = checkpoint_dir
        self._plans: dict[tuple[Hashable, int], GenerationPlan] = {}
        self._lock = threading.RLock()

    def _records(self, study: PlanStudy) -> _Records:
        if isinstance(study, TrialContext):
            return _Records(study.store, study.directions[0] == "maximize", study.history)
        return _Records(OptunaStudyStore(study), study_directions(study)[0] == "maximize",
                        lambda states: study_history(study, self.space, states))

    # -- trial numbers and generations -------------------------------------------------
    def generation_of(self, number: int) -> int:
        """The generation of trial ``number``."""
        if number < self.population_size:
            return 0
        return 1 + (number - self.population_size) // self.offspring

    def first_trial(self, generation: int) -> int:
        """The number of the first trial of ``generation``."""
        return 0 if generation == 0 else self.population_size + (generation - 1) * self.offspring

    def generation_size(self, generation: int) -> int:
        """How many trials ``generation`` has."""
        return self.population_size if generation == 0 else self.offspring

    def is_first_trial(self, number: int) -> bool:
        return number == self.first_trial(self.generation_of(number))

    def is_last_trial(self, number: int) -> bool:
        generation = self.generation_of(number)
        return number == self.first_trial(generation) + self.generation_size(generation) - 1

    @property
    def total_trials(self) -> int | None:
        """Trials of the whole search when ``generations`` is set (``None``: unbounded)."""
        if self.generations is None:
            return None
        return self.population_size + self.generations * self.offspring

    def done(self, study: optuna.Study) -> bool:
        """Whether every planned trial of the configured generations has been handed out
        (counted in the storage, so every worker agrees)."""
        total = self.total_trials
        return total is not None and len(study.get_trials(deepcopy=False)) >= total

    # -- fitness -----------------------------------------------------------------------
    def sign(self, study: PlanStudy) -> float:
        """``+1`` when the study maximises its first objective, ``-1`` when it minimises it:
        fitness is ``sign * value``, higher is better."""
        return 1.0 if self._records(study).maximize else -1.0

    def record_rescores(self, study: PlanStudy, generation: int,
                        values: Sequence[float]) -> None:
        """Store the objective values of ``generation``'s population measured after its
        training (in population order); the next selection ranks the population by them."""
        records = self._records(study)
        sign = 1.0 if records.maximize else -1.0
        records.store.write(_RESCORES_ATTR.format(generation), [sign * float(v) for v in values])

    def rescores(self, study: PlanStudy, generation: int) -> list[float | None] | None:
        """The fitness of ``generation``'s population after its training (population order),
        ``None`` when it has not been recorded."""
        return self.all_rescores(study, [generation]).get(generation)

    def all_rescores(self, study: PlanStudy,
                     generations: Sequence[int]) -> dict[int, list[float | None]]:
        """The recorded re-scores of several generations, read from the storage at once."""
        attrs = self._records(study).store.read()
        found = {}
        for g in generations:
            value = attrs.get(_RESCORES_ATTR.format(g))
            if value is not None:
                found[g] = list(value)
        return found

    # -- plans ---------------------------------------------------------------------------
    def plan(self, study: PlanStudy, generation: int) -> GenerationPlan:
        """The plan of ``generation``: read from the study's storage when some process made it
        already, else made now (from the finished trials of the previous generation) and
        stored."""
        return self._plan_from(self._records(study), generation)

    def _plan_from(self, records: _Records, generation: int) -> GenerationPlan:
        with self._lock:
            key = (records.store.identity, generation)
            if key in self._plans:
                return self._plans[key]
            stored = records.store.get(_PLAN_ATTR.format(generation))
            if stored is None:
                plan = self._make_plan(records, generation)
                records.store.write(_PLAN_ATTR.format(generation), plan.to_json())
            else:
                plan = GenerationPlan.from_json(stored)
            self._plans[key] = plan
            return plan

    def candidate(self, study: PlanStudy, number: int) -> Architecture:
        """The architecture trial ``number`` evaluates: its generation's offspring in order;
        a random one if the plan has fewer (a space too small for distinct candidates)."""
        generation = self.generation_of(number)
        plan = self.plan(study, generation)
        index = number - self.first_trial(generation)
        if index < len(plan.offspring):
            return self.space.parse(plan.offspring[index])
        return self.space.sample(random.Random(self.seed * 7919 + number))

    def population(self, study: PlanStudy, generation: int) -> list[Architecture]:
        """The population trained at the start of ``generation``."""
        return [self.space.parse(a) for a in self.plan(study, generation).population]

    def selection_pool(self, study: PlanStudy, generation: int) -> dict[str, float]:
        """Fitness (higher is better) of every candidate of ``generation``: its population
        (re-scored after training where that was recorded) and its finished offspring."""
        return self._selection_pool(self._records(study), generation)

    def _selection_pool(self, records: _Records, generation: int) -> dict[str, float]:
        sign = 1.0 if records.maximize else -1.0
        plan = self._plan_from(records, generation)
        pool: dict[str, float] = {}
        if generation > 0:
            attrs = records.store.read()
            rescored = attrs.get(_RESCORES_ATTR.format(generation)) or list(plan.fitness)
            for arch, fit in zip(plan.population, rescored):
                if fit is not None:
                    pool[arch] = float(fit)
        lo = self.first_trial(generation)
        hi = lo + self.generation_size(generation)
        for t in records.history((TrialState.COMPLETE,)):
            if lo <= t.number < hi and t.values and t.architecture:
                pool[t.architecture] = sign * float(t.values[0])
        return pool

    def _make_plan(self, records: _Records, generation: int) -> GenerationPlan:
        rng = random.Random(self.seed * 1_000_003 + generation)
        if generation == 0:
            initial = tuple(_unique_samples(self.space, rng, self.population_size))
            return GenerationPlan(0, initial, (None,) * len(initial), initial)
        pool = self._selection_pool(records, generation - 1)
        if not pool:  # every candidate failed: start again from random ones
            initial = tuple(_unique_samples(self.space, rng, self.population_size))
            return GenerationPlan(generation, initial, (None,) * len(initial),
                                  initial[:self.offspring])
        ranked = sorted(pool.items(), key=lambda kv: -kv[1])[:self.population_size]
        population = [self.space.parse(a) for a, _ in ranked]
        fitness = [f for _, f in ranked]
        seen = set(pool) | {t.architecture for t in records.history(None) if t.architecture}
        children: list[str] = []
        for _ in range(self.offspring):
            child = self._breed(population, fitness, rng)
            for _ in range(50):
                if str(child) not in seen:
                    break
                child = self.space.mutate(child, rng)
            seen.add(str(child))
            children.append(str(child))
        return GenerationPlan(generation, tuple(str(a) for a in population), tuple(fitness),
                              tuple(children))

    def _breed(self, population: list[Architecture], fitness: list[float],
               rng: random.Random) -> Architecture:
        def tournament() -> Architecture:
            picks = rng.sample(range(len(population)), min(self.tournament_size, len(population)))
            return population[max(picks, key=lambda i: fitness[i])]

        child = tournament()
        if rng.random() < self.crossover_prob and len(population) > 1:
            child = self.space.crossover(child, tournament(), rng)
        if rng.random() < self.mutation_prob:
            child = self.space.mutate(child, rng)
        return child


def _unique_samples(space: SearchSpace, rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    for _ in range(n * 20):
        text = str(space.sample(rng))
        if text not in out:
            out.append(text)
        if len(out) == n:
            break
    return out
