"""SI-EvoNAS without side channels: the generation plans travel in the evaluation context, the
study decides when the search is over, and si-evolution options are checked by name."""

import inspect
import random

import optuna
import pytest

import frugalnas
from frugalnas.ports import strategy as strategy_protocol
from frugalnas.ports.errors import ConfigError
from frugalnas.engine.trial_context import StudyTrialContext
from frugalnas.sievo import GenerationPlans, SIEvolutionSampler, si_evolution

SPACE = {"channels": 4, "nodes": 2, "reductions": 1}
TINY = {"population_size": 3, "offspring": 2, "batches_per_generation": 2, "batch_size": 32}


def _study(strategy="si-evolution", name=None, storage=None, estimator_options=None,
           **strategy_options):
    options = {"strategy_options": {**TINY, **strategy_options}} if strategy == "si-evolution" else {}
    return frugalnas.create_study(
        space="dag", strategy=strategy, estimator="inherited", dataset="digits", storage=storage,
        study_name=name, space_options=SPACE,
        estimator_options={"valid_limit": 32, **(estimator_options or {})},
        disable_plugins=["mlflow"], **options)


class _Trial:
    """The one thing the estimator reads from a trial: its number."""

    def __init__(self, number):
        self.number = number


def _context(study, trial, shared):
    return StudyTrialContext.of(study, trial, shared_states=shared)


def test_the_estimator_takes_the_plan_from_the_context_not_from_the_sampler():
    """A study whose own strategy is a plain optuna sampler: handed plans in the context, the
    estimator trains generation 0's population; without them it only scores (train_steps=0:
    no per-candidate training either)."""
    study = _study(strategy=optuna.samplers.RandomSampler(seed=0), name="sievo-plans-context",
                   estimator_options={"train_steps": 0})
    plans = si_evolution(space=study.space, **TINY).shared_state()
    assert isinstance(plans, GenerationPlans)
    arch = study.space.sample(random.Random(1))

    plain = study.estimator.evaluate(arch, _context(study, _Trial(0), {}))
    assert plain.metrics.keys() == {"inherited_accuracy"} and plain.cost.epochs == 0

    planned = study.estimator.evaluate(arch, _context(study, _Trial(0), {GenerationPlans: plans}))
    assert planned.metrics["generation"] == 0
    assert planned.cost.epochs > 0 and planned.cost.flops > plain.cost.flops
    session = study.estimator.session(_context(study, _Trial(0), {GenerationPlans: plans}))
    assert session.trained_generation == 0
    # the population it trained is the plan's, which the plans object stored in the study
    assert plans.plan(study.optuna_study, 0).population == tuple(
        str(a) for a in plans.population(study.optuna_study, 0))


def test_the_sampler_shares_its_plans_and_the_study_passes_them_on():
    study = _study(name="sievo-plans-shared")
    plans = study.strategy.shared_state()
    assert study.context().shared(GenerationPlans) is plans
    # a plain strategy shares none: asking says which type is missing
    other = _study(strategy=optuna.samplers.RandomSampler(seed=0), name="sievo-plans-other")
    with pytest.raises(ConfigError, match="GenerationPlans"):
        other.context().shared(GenerationPlans)


@pytest.mark.parametrize("generations", [0, 1])
def test_the_study_ends_after_exactly_the_planned_trials(generations):
    study = _study(name=f"sievo-plans-stop{generations}", generations=generations)
    sampler = study.strategy
    planned = 3 + generations * 2
    assert not strategy_protocol.should_stop(sampler, study.optuna_study)
    study.optimize(50)
    trials = study.completed_trials()
    assert len(study.trials) == len(trials) == planned
    assert [t.user_attrs["metrics"]["generation"] for t in trials] == \
        [0, 0, 0] + [g for g in range(1, generations + 1) for _ in range(2)]
    assert sampler.should_stop(study.optuna_study)


def test_the_sampler_never_stops_an_optuna_study_itself():
    """Driven by plain optuna (no frugalnas Study asking should_stop), the sampler hands out
    candidates past its generations instead of stopping the study from sample_relative."""
    study = _study(name="sievo-plans-optuna", generations=1)
    ostudy = optuna.create_study(sampler=study.strategy, direction="maximize")
    ostudy.optimize(lambda trial: float(study.space.suggest(trial).key.count("sep")), n_trials=8)
    assert len(ostudy.trials) == 8


def test_a_second_worker_sees_the_same_plans_and_rescores(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = _study(storage=storage, name="shared")
    first = study.strategy.shared_state()
    plan = first.plan(study.optuna_study, 0)
    first.record_rescores(study.optuna_study, 1, [50.0, 60.0, 70.0])

    # another process: its own plans object, another seed, the same storage
    other = frugalnas.load_study(study_name="shared", storage=storage)
    assert other.strategy.shared_state() is not first
    seen = GenerationPlans(other.space, seed=99, population_size=3, offspring=2)
    assert seen.plan(other.optuna_study, 0) == plan
    assert seen.rescores(other.optuna_study, 1) == [50.0, 60.0, 70.0]
    assert seen.rescores(other.optuna_study, 2) is None


def test_generation_numbering():
    plans = GenerationPlans(space=None, population_size=4, offspring=3, generations=2)
    assert [plans.generation_of(n) for n in range(10)] == [0, 0, 0, 0, 1, 1, 1, 2, 2, 2]
    assert [plans.first_trial(g) for g in range(3)] == [0, 4, 7]
    assert [n for n in range(10) if plans.is_last_trial(n)] == [3, 6, 9]
    assert plans.total_trials == 10


def test_a_misspelt_option_is_a_config_error_naming_the_valid_ones(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    with pytest.raises(ConfigError) as err:
        _study(storage=storage, populaton_size=3)
    message = str(err.value)
    assert "'populaton_size'" in message and "si-evolution" in message
    assert "population_size" in message and "warmup_batches" in message
    # refused before anything was written to the storage
    assert optuna.get_all_study_summaries(storage) == []


def test_the_factory_takes_exactly_the_sampler_options():
    factory = inspect.signature(si_evolution).parameters
    sampler = inspect.signature(SIEvolutionSampler).parameters
    assert not any(p.kind is p.VAR_KEYWORD for p in factory.values())
    assert list(factory) == list(sampler)
    assert all(factory[n].default == sampler[n].default for n in factory if n != "space")


def test_the_estimator_declares_what_it_produces():
    study = _study(name="sievo-plans-declared")
    estimator = study.estimator
    assert set(estimator.provides) == {"inherited_accuracy", "generation"}
    assert set(estimator.measures) == {"seconds", "flops", "params", "epochs"}
