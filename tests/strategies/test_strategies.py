"""Search strategies: resumable from storage, deduplicating, multi-objective, better than random."""

import random

import numpy as np
import optuna
import pytest

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.spaces.nb201.table import nb201_table
from frugalnas.multiobjective.pareto import nondominated_ranks
from frugalnas.strategies.history import fitness
from frugalnas.spaces.nb201.space import NB201Space

FAST = {
    "regularized-evolution": {"population_size": 6, "sample_size": 3},
    "local-search": {"n_init": 3},
    "surrogate-evolution": {"population_size": 6, "sample_size": 3, "n_init": 5,
                            "n_candidates": 8, "quality_every": 4, "quality_holdout": 3,
                            "surrogate_options": {"n_models": 2, "n_estimators": 20}},
    "bananas": {"n_init": 5, "n_candidates": 12, "top_k": 3, "quality_every": 0,
                "surrogate_options": {"n_models": 2, "epochs": 30, "hidden": 8}},
}


def _archs(study):
    return [str(t.architecture) for t in study.trials]


@pytest.mark.slow
@pytest.mark.parametrize("strategy", list(FAST))
def test_strategy_resumes_from_storage_like_an_uninterrupted_run(tmp_path, strategy):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    common = dict(space="nb201", strategy=strategy, estimator="nb201-table", seed=7,
                  strategy_options=FAST[strategy], disable_plugins=["mlflow"], storage=storage)
    whole = frugalnas.create_study(study_name="whole", **common)
    whole.optimize(10)
    part = frugalnas.create_study(study_name="part", **common)
    part.optimize(7)
    del part
    resumed = frugalnas.load_study(study_name="part", storage=storage)
    resumed.optimize(3)
    assert _archs(resumed) == _archs(whole)
    assert len(set(_archs(whole))) == 10  # never the same architecture twice


def test_strategies_are_registered_with_summaries():
    described = {d["name"]: d for d in frugalnas.get_host().registry("strategies").describe()}
    for name in FAST:
        assert described[name]["plugin"] == "strategies" and described[name]["summary"]


def test_unknown_strategy_option_is_a_config_error():
    with pytest.raises(ConfigError, match="valid options: .*population_size"):
        frugalnas.create_component("strategies", "regularized-evolution", space=NB201Space(),
                                   seed=0, populaton_size=5)
    with pytest.raises(ConfigError, match="acquisition"):
        frugalnas.create_component("strategies", "surrogate-evolution", space=NB201Space(),
                                   seed=0, acquisition="pi")


def test_nondominated_ranking_and_fitness():
    obj = np.array([[3.0, 1.0], [1.0, 3.0], [2.0, 2.0], [1.0, 1.0], [0.5, 0.5]])
    assert list(nondominated_ranks(obj)) == [0, 0, 0, 1, 2]
    fit = fitness(obj.tolist(), [optuna.study.StudyDirection.MAXIMIZE] * 2)
    assert fit[:3].min() > fit[3] > fit[4]
    mixed = fitness([[1.0, 5.0], [1.0, 4.0]], [optuna.study.StudyDirection.MAXIMIZE,
                                               optuna.study.StudyDirection.MINIMIZE])
    assert mixed[1] > mixed[0]  # same accuracy, smaller second objective wins


def test_one_dominance_sort_serves_strategies_pruner_and_leaderboard():
    from frugalnas.export import pareto_fronts as leaderboard_fronts
    from frugalnas.multiobjective import pareto, pruning
    from frugalnas.strategies import history

    assert history.nondominated_ranks is pruning.nondominated_ranks is pareto.nondominated_ranks
    assert leaderboard_fronts is pareto.pareto_fronts
    points = [[90.0, 5.0], [95.0, 9.0], [85.0, 6.0], [95.0, 9.0]]
    assert pareto.pareto_fronts(points, ["maximize", "minimize"]) == [1, 1, 2, 1]
    assert pareto.pareto_fronts([], ["maximize"]) == []
    with pytest.raises(ValueError, match="invalid direction 'max'; valid: maximize, minimize"):
        pareto.pareto_fronts(points, ["max", "minimize"])


def test_multi_objective_evolution_finds_a_front(tmp_path):
    study = frugalnas.create_study(
        space="nb201", strategy="regularized-evolution", estimator="nb201-table", seed=1,
        directions=["maximize", "maximize"],
        objectives=["test_accuracy_cifar10", "test_accuracy_imagenet16-120"],
        strategy_options={"population_size": 8, "sample_size": 3}, disable_plugins=["mlflow"])
    study.optimize(30)
    archs = _archs(study)
    assert len(set(archs)) == 30 and len(study.best_trials) >= 1
    # the evolved half is better on average than the random initial population
    first = np.mean([t.values[0] for t in study.trials[:8]])
    later = np.mean([t.values[0] for t in study.trials[15:]])
    assert later > first


def _best_of(sampler, n=100):
    space, table = NB201Space(), nb201_table()[:, 0]
    study = optuna.create_study(direction="maximize", sampler=sampler)
    study.optimize(lambda t: float(table[space.index(space.suggest(t))]), n_trials=n)
    return study.best_value


def test_regularized_evolution_beats_random_on_nb201_table():
    seeds = range(6)
    rea = [_best_of(frugalnas.create_component("strategies", "regularized-evolution",
                                               space=NB201Space(), seed=s)) for s in seeds]
    rnd = [_best_of(optuna.samplers.RandomSampler(seed=s)) for s in seeds]
    assert np.mean(rea) > np.mean(rnd)


def test_warm_start_proposes_the_best_proxy_ranked_architectures_first():
    space = NB201Space(N=1, C=4)
    sampler = frugalnas.create_component(
        "strategies", "regularized-evolution", space=space, seed=0, population_size=4, sample_size=2,
        warm_start_proxy="params", warm_start_pool=8,
        warm_start_options={"input_shape": (3, 8, 8)})
    study = optuna.create_study(direction="maximize", sampler=sampler)
    proposed = []
    study.optimize(lambda t: proposed.append(space.suggest(t)) or random.random(), n_trials=3)
    pool = sampler.warm_pool()
    assert proposed == pool[:3]
    scores = [sampler._scorer.score(a)[0] for a in pool]
    assert scores == sorted(scores, reverse=True)


def test_surrogate_study_logs_trials_and_surrogate_quality_to_mlflow(tmp_path, stores):
    import mlflow

    storage, uri = stores
    study = frugalnas.create_study(
        space="nb201", strategy="surrogate-evolution", estimator="nb201-table", seed=0,
        storage=storage, study_name="surrogate-mlflow", plugin_options={"mlflow": {"tracking_uri": uri}},
        strategy_options=FAST["surrogate-evolution"])
    study.optimize(9)
    quality = [t.system_attrs.get("frugalnas:surrogate_kendall_tau")
               for t in study.optuna_study.trials]
    assert any(q is not None for q in quality)
    client = mlflow.MlflowClient(tracking_uri=uri)
    runs = client.search_runs([client.get_experiment_by_name("surrogate-mlflow").experiment_id])
    trial_runs = [r for r in runs if r.data.tags.get("frugalnas.role") != "study"]
    assert len(trial_runs) == 9
    parent = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"]
    assert len(parent) == 1 and "surrogate_kendall_tau" in parent[0].data.metrics


# -- options are the strategies' real signatures -------------------------------------------
def _arch_sampler_strategies():
    import inspect

    from frugalnas.strategies.base import ArchSampler

    registry = frugalnas.get_host().registry("strategies")
    return {name: registry.get(name) for name in registry
            if inspect.isclass(registry.get(name).factory)
            and issubclass(registry.get(name).factory, ArchSampler)}


def _common_options():
    import inspect

    from frugalnas.strategies.base import ArchSampler

    return {n: p.default for n, p in inspect.signature(ArchSampler).parameters.items()
            if n not in ("space", "seed", "host")}


def test_every_arch_sampler_strategy_lists_the_common_options_with_their_defaults(capsys):
    import json

    from frugalnas.cli.main import main

    builtins = _arch_sampler_strategies()
    assert {"random", "regularized-evolution", "local-search", "surrogate-evolution",
            "bananas", "darts"} <= set(builtins)
    assert main(["plugins", "--json"]) == 0
    listed = {c["name"]: c for c in json.loads(capsys.readouterr().out)["components"]["strategies"]}
    common = _common_options()
    assert {"n_init", "warm_start_proxy", "constraint_model", "violation_penalty"} <= set(common)
    for name, comp in builtins.items():
        cls = comp.factory
        assert "__signature__" not in vars(cls) and not listed[name]["accepts_any_option"]
        options = {o["name"]: o["default"] for o in listed[name]["options"]}
        for option, default in common.items():
            if option in cls.fixed_options:
                assert option not in options, (name, option)
            elif option != "n_init":  # a strategy may choose its own initial design size
                assert options[option] == default, (name, option)
            else:
                assert "n_init" in options, name


@pytest.mark.parametrize("name", sorted(_arch_sampler_strategies()))
def test_an_unknown_strategy_option_is_refused_before_the_first_trial(name, tmp_path):
    comp = _arch_sampler_strategies()[name]
    with pytest.raises(ConfigError) as info:
        frugalnas.create_study(space="nb201", strategy=name, estimator="nb201-table",
                               strategy_options={"not_an_option": 1},
                               storage=f"sqlite:///{tmp_path / 'x.db'}",
                               disable_plugins=["mlflow"])
    message = str(info.value)
    assert "'not_an_option'" in message and f"strategy {name!r}" in message
    for option in comp.user_options():
        assert option in message, (name, option)
    for option in comp.factory.fixed_options:  # set by the strategy itself: refused, saying so
        with pytest.raises(ConfigError, match=f"{option!r} is set by strategy {name!r} itself"):
            comp.check_options({option: 1})


def test_a_subclass_inherits_the_common_options_it_passes_on_and_hides_none():
    from frugalnas.host.registry import Component
    from frugalnas.strategies.base import ArchSampler, strategy_factory
    from frugalnas.strategies.random import RandomArchSampler

    assert strategy_factory(RandomArchSampler) is RandomArchSampler

    class Climb(ArchSampler):
        def __init__(self, space, seed=0, step=2, **common):
            super().__init__(space, seed, **common)

    assert strategy_factory(Climb) is Climb
    options = Component("strategy", "climb", Climb, "test").user_options()
    assert options == {"step": 2, **_common_options()}
    with pytest.raises(ConfigError, match="unknown option 'stpe'.*did you mean 'step'"):
        Component("strategy", "climb", Climb, "test").check_options({"stpe": 3})

    class Loose(ArchSampler):
        def __init__(self, space, seed=0, *args):
            super().__init__(space, seed, *args)

    with pytest.raises(TypeError, match="options"):
        strategy_factory(Loose)
