"""The ``si-evolution`` strategy: the evolutionary half of SI-EvoNAS (Zhang et al., IEEE TEVC,
arXiv 2003.11613) as an optuna sampler.

The sampler hands each trial the candidate its generation's plan names. The plans (selection,
breeding, the population re-scores) belong to a :class:`GenerationPlans` object that the
sampler shares with the study's estimator (``shared_state``): the ``inherited`` estimator gets
it from the evaluation context to run the sampled training of each generation's population and
record the re-scores the next selection uses. With ``generations`` set, the sampler tells the
study its search is over (``should_stop``) once every planned trial has been handed out.
The plugin registers :func:`si_evolution`, the sampler's factory with its options.
"""

from __future__ import annotations

from typing import Any

import optuna
from optuna.distributions import BaseDistribution
from optuna.samplers import RandomSampler
from optuna.trial import FrozenTrial

from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.strategy import Strategy
from frugalnas.sievo.plan import GenerationPlans, SampledTraining


class SIEvolutionSampler(Strategy):
    """Evolution with sampled training and node inheritance (use with the ``inherited``
    estimator). Options: ``population_size``, ``offspring`` (default: population size),
    ``generations`` (the search ends after this many generations after the initial one;
    ``None``: as many as the trials allow), ``batches_per_generation``, ``batch_size``, ``lr``,
    ``momentum``, ``weight_decay`` (the sampled training), ``warmup_batches`` (before
    generation 0's training, that many steps each on a new uniformly drawn candidate, so every
    node of the space gets trained weights; 0: none, as in the paper), ``crossover_prob``,
    ``mutation_prob``, ``tournament_size`` and ``checkpoint_dir`` (where the weight store is
    saved; default next to a sqlite storage, else a temporary folder)."""

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
        training = SampledTraining(batches=int(batches_per_generation), batch_size=int(batch_size),
                                   lr=float(lr), momentum=float(momentum),
                                   weight_decay=float(weight_decay),
                                   warmup_batches=int(warmup_batches))
        #: The plans this sampler follows, shared with the estimator (``shared_state``).
        self.plans = GenerationPlans(
            space, seed=self.seed, population_size=int(population_size), offspring=offspring,
            generations=None if generations is None else int(generations),
            crossover_prob=crossover_prob, mutation_prob=mutation_prob,
            tournament_size=int(tournament_size), training=training,
            checkpoint_dir=checkpoint_dir)
        self._random = RandomSampler(seed=seed)

    # -- frugalnas strategy protocol ------------------------------------------------------
    def shared_state(self) -> GenerationPlans:
        """The generation plans, for the ``inherited`` estimator."""
        return self.plans

    def planned_trials(self) -> int | None:
        """``population_size + generations * offspring`` with ``generations`` set."""
        return self.plans.total_trials

    def should_stop(self, study: optuna.Study) -> bool:
        """With ``generations`` set: whether every planned trial has been handed out."""
        return self.plans.done(study)

    # -- optuna sampler API --------------------------------------------------------------
    def infer_relative_search_space(self, study: optuna.Study,
                                    trial: FrozenTrial) -> dict[str, BaseDistribution]:
        return self.space.distributions()

    def sample_relative(self, study: optuna.Study, trial: FrozenTrial,
                        search_space: dict[str, BaseDistribution]) -> dict[str, Any]:
        if not search_space:
            return {}
        decisions = self.plans.candidate(study, trial.number).decisions
        return {k: decisions[k] for k in search_space if k in decisions}

    def sample_independent(self, study: optuna.Study, trial: FrozenTrial, param_name: str,
                           param_distribution: BaseDistribution) -> Any:
        return self._random.sample_independent(study, trial, param_name, param_distribution)

    def reseed_rng(self) -> None:
        self._random.reseed_rng()


def si_evolution(space: SearchSpace | None = None, seed: int = 0, population_size: int = 10,
                 offspring: int | None = None, generations: int | None = None,
                 batches_per_generation: int = 50, batch_size: int = 64, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 3e-4, crossover_prob: float = 0.9,
                 mutation_prob: float = 1.0, tournament_size: int = 2,
                 checkpoint_dir: str | None = None,
                 warmup_batches: int = 0) -> SIEvolutionSampler:
    """Evolution with sampled training of the population on shared weights and node
    inheritance for offspring (SI-EvoNAS); use with the 'inherited' estimator."""
    return SIEvolutionSampler(
        space=space, seed=seed, population_size=population_size, offspring=offspring,
        generations=generations, batches_per_generation=batches_per_generation,
        batch_size=batch_size, lr=lr, momentum=momentum, weight_decay=weight_decay,
        crossover_prob=crossover_prob, mutation_prob=mutation_prob,
        tournament_size=tournament_size, checkpoint_dir=checkpoint_dir,
        warmup_batches=warmup_batches)
