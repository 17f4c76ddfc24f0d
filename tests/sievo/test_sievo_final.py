"""Choosing SI-EvoNAS's result from the last generation's pool, with and without proxies."""

import numpy as np
import pytest

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.proxies.ensemble import percentile_ranks
from frugalnas.sievo.final import final_choice, last_pool
from frugalnas.sievo.plan import GenerationPlans

SPACE = {"channels": 4, "nodes": 2, "reductions": 1}
STRATEGY = {"population_size": 4, "offspring": 3, "generations": 2,
            "batches_per_generation": 4, "batch_size": 32}


@pytest.fixture(scope="module")
def study():
    study = frugalnas.create_study(space="dag", strategy="si-evolution", estimator="inherited",
                                   dataset="digits", space_options=SPACE,
                                   strategy_options=STRATEGY, estimator_options={"valid_limit": 96},
                                   disable_plugins=["mlflow"], seed=3)
    study.optimize(4 + 2 * 3)
    return study


def test_the_pool_is_the_last_population_rescored_and_its_offspring(study):
    generation, pool = last_pool(study)
    plans = study.context().shared(GenerationPlans)
    plan = plans.plan(study.optuna_study, 2)
    assert generation == 2
    offspring = {str(t.architecture): t.value for t in study.completed_trials() if t.number >= 7}
    assert set(pool) == set(plan.population) | set(offspring)
    rescored = plans.rescores(study.optuna_study, 2)
    for arch, fit in zip(plan.population, rescored):
        if arch not in offspring:
            assert pool[arch] == pytest.approx(fit)


def test_without_proxies_the_best_fitness_of_the_pool_wins(study):
    _, pool = last_pool(study)
    choice = final_choice(study)
    assert str(choice.architecture) == max(pool, key=pool.get)
    assert choice.proxy_scores == () and choice.cost.flops == 0


def test_proxies_rank_the_pool_and_their_weight_sets_the_mix(study):
    only_proxies = final_choice(study, ["synflow", "params"], proxy_weight=1.0)
    fitness = np.array(only_proxies.fitness)
    proxy = np.array(only_proxies.proxy_scores)
    assert len(proxy) == len(only_proxies.candidates) and only_proxies.cost.flops > 0
    # weight 1: the choice is the proxy ensemble's favourite
    assert only_proxies.scores == pytest.approx(list(percentile_ranks(proxy)))
    assert str(only_proxies.architecture) == only_proxies.candidates[int(np.argmax(proxy))]
    # weight 0: the inherited fitness alone decides
    only_fitness = final_choice(study, ["synflow", "params"], proxy_weight=0.0)
    assert str(only_fitness.architecture) == only_fitness.candidates[int(np.argmax(fitness))]
    half = final_choice(study, ["synflow", "params"], proxy_weight=0.5)
    expected = 0.5 * percentile_ranks(fitness) + 0.5 * percentile_ranks(proxy)
    assert half.scores == pytest.approx(list(expected))


def test_one_proxy_name_or_a_preset_names_the_members(study):
    one = final_choice(study, "synflow", proxy_weight=1.0)
    listed = final_choice(study, ["synflow"], proxy_weight=1.0)
    assert one.proxy_scores == listed.proxy_scores and one.architecture == listed.architecture
    with pytest.raises(ConfigError, match="unknown proxy 'synflw'"):
        final_choice(study, "synflw")


def test_a_study_of_another_strategy_or_a_bad_weight_is_refused(study):
    with pytest.raises(ConfigError, match="proxy_weight"):
        final_choice(study, "selected", proxy_weight=1.5)
    other = frugalnas.create_study(space="dag", strategy="random", estimator="inherited",
                                   dataset="digits", space_options=SPACE,
                                   disable_plugins=["mlflow"])
    with pytest.raises(ConfigError, match="GenerationPlans"):
        final_choice(other)
