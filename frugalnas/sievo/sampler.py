"""The ``si-evolution`` strategy: the evolutionary half of SI-EvoNAS (Zhang et al., IEEE TEVC,
arXiv 2003.11613) as an optuna sampler.

Trials are grouped in generations by number: generation 0 is ``population_size`` random
candidates, each later generation ``offspring`` children. At a generation boundary the sampler
keeps the best ``population_size`` of the previous population and its offspring
(environmental selection), then breeds the new offspring by binary tournaments, node-wise
crossover and mutation. Each generation's plan (population and offspring, as architecture
strings) is stored in the study's user attributes ``sievo:gen:G``, so a resumed study or
another worker sees the same plan. The ``inherited`` estimator reads the plan to run the
sampled training of the population on the shared weights before scoring the offspring; its
re-scores of the population (``sievo:gen:G:fitness``) feed the next selection.
"""

from __future__ import annotations

import random
import threading
from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import BaseSampler, RandomSampler
from optuna.trial import FrozenTrial, TrialState

from frugalnas.core.errors import ConfigError, check_range
from frugalnas.core.space import SearchSpace

PLAN_ATTR = "sievo:gen:{}"
FITNESS_ATTR = "sievo:gen:{}:fitness"


class SIEvolutionSampler(BaseSampler):
    """Evolution with sampled training and node inheritance (use with the ``inherited``
    estimator). Options: ``population_size``, ``offspring`` (default: population size),
    ``generations`` (stop after this many generations after the initial one; ``None``: as many
    as the trials allow), ``batches_per_generation``, ``batch_size``, ``lr``, ``momentum``,
    ``weight_decay`` (the sampled training), ``warmup_batches`` (before generation 0's
    training, that many steps each on a new uniformly drawn candidate, so every node of the
    space gets trained weights; 0: none, as in the paper), ``crossover_prob``,
    ``mutation_prob``, ``tournament_size`` and ``checkpoint_dir`` (where the weight store is saved; default
    next to a sqlite storage, else a temporary folder)."""

    def __init__(self, space: SearchSpace, seed: int = 0, population_size: int = 10,
                 offspring: int | None = None, generations: int | None = None,
                 batches_per_generation: int = 50, batch_size: int = 64, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 3e-4, crossover_prob: float = 0.9,
                 mutation_prob: float = 1.0, tournament_size: int = 2,
                 checkpoint_dir: str | None = None, warmup_batches: int = 0):
        if space is None:
            raise ConfigError("strategy 'si-evolution' needs the study's search space (space=)")
        check_range("population_size", population_size, 2)
        check_range("offspring", offspring if offspring is not None else population_size, 1)
        if generations is not None:
            check_range("generations", generations, 0)
        check_range("batches_per_generation", batches_per_generation, 0)
        check_range("batch_size", batch_size, 1)
        check_range("warmup_batches", warmup_batches, 0)
        check_range("lr", lr, 0)
        check_range("crossover_prob", crossover_prob, 0, 1)
        check_range("mutation_prob", mutation_prob, 0, 1)
        check_range("tournament_size", tournament_size, 1, population_size)
        self.space, self.seed = space, int(seed)
        self.population_size = int(population_size)
        self.offspring = int(offspring if offspring is not None else population_size)
        self.generations = generations
        self.batches_per_generation, self.batch_size = int(batches_per_generation), int(batch_size)
        self.warmup_batches = int(warmup_batches)
        self.lr, self.momentum, self.weight_decay = float(lr), float(momentum), float(weight_decay)
        self.crossover_prob, self.mutation_prob = float(crossover_prob), float(mutation_prob)
        self.tournament_size = int(tournament_size)
        self.checkpoint_dir = checkpoint_dir
        self._random = RandomSampler(seed=seed)
        self._plans: dict[tuple[int, int], dict[str, Any]] = {}
        self._lock = threading.RLock()

    # -- generations ---------------------------------------------------------------------
    def generation_of(self, number: int) -> int:
        """The generation of trial ``number``."""
        if number < self.population_size:
            return 0
        return 1 + (number - self.population_size) // self.offspring

    def first_trial(self, generation: int) -> int:
        return 0 if generation == 0 else self.population_size + (generation - 1) * self.offspring

    def generation_size(self, generation: int) -> int:
        return self.population_size if generation == 0 else self.offspring

    @property
    def total_trials(self) -> int | None:
        """Trials of the whole search when ``generations`` is set."""
        if self.generations is None:
            return None
        return self.population_size + self.generations * self.offspring

    def plan(self, study: optuna.Study, generation: int) -> dict[str, Any]:
        """The population trained in ``generation`` and its offspring (architecture strings),
        computed once and stored in the study."""
        with self._lock:
            cache_key = (study._study_id, generation)
            if cache_key in self._plans:
                return self._plans[cache_key]
            stored = study.user_attrs.get(PLAN_ATTR.format(generation))
            if stored is None:
                stored = self._make_plan(study, generation)
                study.set_user_attr(PLAN_ATTR.format(generation), stored)
            self._plans[cache_key] = stored
            return stored

    def _make_plan(self, study: optuna.Study, generation: int) -> dict[str, Any]:
        rng = random.Random(self.seed * 1_000_003 + generation)
        if generation == 0:
            initial = _unique_samples(self.space, rng, self.population_size)
            return {"generation": 0, "population": initial, "fitness": [None] * len(initial),
                    "offspring": initial}
        pool = self.selection_pool(study, generation - 1)
        if not pool:  # every candidate failed: start again from random ones
            initial = _unique_samples(self.space, rng, self.population_size)
            return {"generation": generation, "population": initial,
                    "fitness": [None] * len(initial), "offspring": initial[:self.offspring]}
        ranked = sorted(pool.items(), key=lambda kv: -kv[1])[:self.population_size]
        population = [self.space.parse(a) for a, _ in ranked]
        fitness = [f for _, f in ranked]
        seen = {a for a in pool} | {a for t in study.get_trials(deepcopy=False)
                                    for a in [t.user_attrs.get("architecture")] if a}
        children: list[str] = []
        for _ in range(self.offspring):
            child = self._breed(population, fitness, rng)
            for _ in range(50):
                if str(child) not in seen:
                    break
                child = self.space.mutate(child, rng)
            seen.add(str(child))
            children.append(str(child))
        return {"generation": generation, "population": [str(a) for a in population],
                "fitness": fitness, "offspring": children}

    def selection_pool(self, study: optuna.Study, generation: int) -> dict[str, float]:
        """Fitness (higher is better) of every candidate of ``generation``: its population
        (re-scored after training where the estimator stored that) and its offspring trials."""
        sign = 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0
        plan = self.plan(study, generation)
        pool: dict[str, float] = {}
        if generation > 0:
            rescored = study.user_attrs.get(FITNESS_ATTR.format(generation)) or plan["fitness"]
            for arch, fit in zip(plan["population"], rescored):
                if fit is not None:
                    pool[arch] = float(fit)
        lo, hi = self.first_trial(generation), self.first_trial(generation) + self.generation_size(generation)
        for t in study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)):
            if lo <= t.number < hi and t.values:
                arch = t.user_attrs.get("architecture") or str(self.space.from_params(t.params))
                pool[arch] = sign * float(t.values[0])
        return pool

    def _breed(self, population: list[Any], fitness: list[float], rng: random.Random) -> Any:
        def tournament() -> Any:
            picks = rng.sample(range(len(population)), min(self.tournament_size, len(population)))
            return population[max(picks, key=lambda i: fitness[i])]

        child = tournament()
        if rng.random() < self.crossover_prob and len(population) > 1:
            child = self.space.crossover(child, tournament(), rng)
        if rng.random() < self.mutation_prob:
            child = self.space.mutate(child, rng)
        return child

    # -- optuna sampler API --------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.space.distributions()

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        generation = self.generation_of(trial.number)
        plan = self.plan(study, generation)
        index = trial.number - self.first_trial(generation)
        if index < len(plan["offspring"]):
            arch = self.space.parse(plan["offspring"][index])
        else:
            arch = self.space.sample(random.Random(self.seed * 7919 + trial.number))
        total = self.total_trials
        if total is not None and trial.number >= total - 1:
            try:
                study.stop()
            except RuntimeError:  # not inside optimize (ask/tell): nothing to stop
                pass
        decisions = arch.decisions
        return {k: decisions[k] for k in search_space if k in decisions}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        self._random.reseed_rng()


def _unique_samples(space: SearchSpace, rng: random.Random, n: int) -> list[str]:
    out: list[str] = []
    for _ in range(n * 20):
        text = str(space.sample(rng))
        if text not in out:
            out.append(text)
        if len(out) == n:
            break
    return out


def find_sievo_sampler(sampler: Any) -> SIEvolutionSampler | None:
    """The SIEvolutionSampler in ``sampler`` or in a wrapper around it (pre-screening)."""
    for _ in range(5):
        if isinstance(sampler, SIEvolutionSampler):
            return sampler
        inner = [getattr(sampler, a, None) for a in ("base_sampler", "sampler", "_sampler", "inner", "_base")]
        sampler = next((s for s in inner if isinstance(s, BaseSampler)), None)
        if sampler is None:
            return None
    return None
