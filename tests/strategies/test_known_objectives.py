"""Objectives an estimator knows before evaluating (``Estimator.known_metrics``): a study with
several objectives hands them to its strategy (``StrategyServices.known_objectives``), and
the surrogate strategies with a reference point then score candidates by their expected
hypervolume improvement with those objectives exact."""

import random

import numpy as np
import pytest

import frugalnas
from frugalnas import ConfigError
from frugalnas.engine.strategy_services import services_of
from frugalnas.ports.strategy import known_objective_values
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.spaces.nb201.table import nb201_data
from frugalnas.strategies.history import read_history

OFF = {"disable_plugins": ["mlflow", "progress"]}
TWO = dict(objectives=["value", "latency_ms_pixel3"], directions=["maximize", "minimize"])
CHEAP = {"surrogate-evolution": {"quality_every": 0, "n_candidates": 8,
                                 "surrogate_options": {"n_models": 2, "n_estimators": 20}},
         "bananas": {"quality_every": 0, "n_candidates": 20,
                     "surrogate_options": {"n_models": 2, "epochs": 20}}}
#: Only cells under 5 ms can add to the hypervolume.
FAST_ONLY = [80.0, 5.0]


def two_objective_study(strategy: str, known: bool = True, **options) -> frugalnas.Study:
    return frugalnas.create_study(
        strategy=strategy, estimator="nb201-table", dataset=None, seed=0,
        strategy_options={**CHEAP.get(strategy, {}), **options},
        estimator_options={"dataset": "cifar10", "known_hardware": known}, **TWO, **OFF)


def test_known_objective_values_follow_the_objective_order():
    assert known_objective_values({"b": 2.0, "a": 1.0}, ["a", "value", "b"]) == (1.0, None, 2.0)
    assert known_objective_values({"a": float("nan")}, ["a"]) == (None,)


def test_the_study_lends_the_known_objectives_to_its_strategy():
    study = two_objective_study("random")
    arch = study.space.sample(random.Random(3))
    latency = nb201_data().latency("pixel3")[study.space.index(arch)]
    assert services_of(study).known_objectives(arch) == pytest.approx((None, latency))
    blind = two_objective_study("random", known=False)
    assert services_of(blind).known_objectives(arch) == (None, None)
    one = frugalnas.create_study(estimator="nb201-table", dataset=None, **OFF)
    assert services_of(one).known_objectives is None


@pytest.mark.parametrize("strategy", ["surrogate-evolution", "bananas"])
def test_known_objectives_are_exact_in_the_expected_hypervolume_improvement(strategy):
    """With the latency known, a candidate slower than the reference point cannot add to the
    hypervolume: its expected improvement is exactly zero, and the fast ones gain. Predicted
    by surrogate-evolution's forest from a dozen cells none of which is that fast, the fast
    ones look less promising (BANANAS's briefly trained networks extrapolate wildly)."""
    space, latency = NB201Space(), nb201_data().latency("pixel3")
    near = np.random.default_rng(7)
    # cells just over the reference latency and cells under it
    over = np.flatnonzero((latency >= 5.0) & (latency < 6.0))
    under = np.flatnonzero((latency > 2.0) & (latency < 5.0))
    cells = np.concatenate([near.choice(over, 30, replace=False),
                            near.choice(under, 30, replace=False)])
    scores = {}
    for known in (True, False):
        study = two_objective_study(strategy, known=known, reference_point=FAST_ONLY)
        study.optimize(n_trials=12)
        sampler = study.strategy
        last = max(study.optuna_study.trials, key=lambda t: t.number)
        hist = read_history(study.optuna_study, space, exclude=-1)
        candidates = [space.from_index(int(c)) for c in cells]
        scores[known] = (sampler.score(study.optuna_study, last, hist, candidates,
                                       random.Random(0)),
                         np.array([latency[space.index(a)] for a in candidates]))
    score, lat = scores[True]
    assert np.all(score[lat >= FAST_ONLY[1]] == 0.0)
    assert np.any(score[lat < FAST_ONLY[1]] > 0.0)
    blind, _ = scores[False]
    if strategy == "surrogate-evolution":
        assert blind[lat < FAST_ONLY[1]].sum() < score[lat < FAST_ONLY[1]].sum()


def test_surrogate_evolution_with_a_reference_point_finds_a_front():
    study = two_objective_study("surrogate-evolution", reference_point=[80.0, 40.0])
    study.optimize(n_trials=25)
    assert len(study.trials) == 25
    assert len({str(t.architecture) for t in study.trials}) == 25
    assert study.best_trials


@pytest.mark.parametrize("strategy", ["surrogate-evolution", "bananas"])
def test_a_bad_reference_point_is_refused_before_the_first_trial(strategy):
    with pytest.raises(ConfigError, match=r"reference_point \[80.0\].*2 objective"):
        two_objective_study(strategy, reference_point=[80])
    with pytest.raises(ConfigError, match="reference_point 'far'.*finite numbers"):
        frugalnas.create_component("strategies", strategy, space=NB201Space(), seed=0,
                                   reference_point="far")
