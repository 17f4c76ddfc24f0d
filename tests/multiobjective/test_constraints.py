"""Constraints by metric name: validated before the first trial, recorded on every trial,
stored with the study, preferred by every strategy, and respected by best_trial(s)."""

import math

import numpy as np
import optuna
import pytest
from optuna.study import StudyDirection

import frugalnas
from frugalnas.cli.main import main as cli_main
from frugalnas.ports.config import load_run_file
from frugalnas.ports.errors import ConfigConflictError, ConfigError
from frugalnas.ports.keys import CONSTRAINTS_ATTR, FEASIBLE_ATTR, VIOLATION_ATTR
from frugalnas.strategies.history import fitness

OFF = {"disable_plugins": ["mlflow", "progress"]}
#: The table without its latencies known before evaluation: the strategies learn feasibility.
BLIND = {"estimator_options": {"known_hardware": False}}
PIXEL3 = "latency_ms_pixel3"
EDGE = {PIXEL3: 10.0}


def _metric(trial, name):
    return trial.user_attrs["metrics"].get(name, trial.user_attrs["cost"].get(name))


def _check_records(study):
    for t in study.completed_trials():
        diffs = t.user_attrs[CONSTRAINTS_ATTR]
        assert set(diffs) == set(study.config.constraints)
        for name, bound in study.config.constraints.items():
            assert diffs[name] == pytest.approx(_metric(t, name) - bound)
        feasible = all(d <= 0 for d in diffs.values())
        assert t.user_attrs[FEASIBLE_ATTR] is feasible
        assert (t.user_attrs[VIOLATION_ATTR] == 0) is feasible
        if hasattr(optuna.trial.Trial, "set_constraint"):  # optuna >= 5 reads these
            assert t.frozen.constraints == pytest.approx(diffs)


@pytest.mark.parametrize("strategy,options", [
    ("random", {}), ("regularized-evolution", {"population_size": 10, "sample_size": 3}),
    ("local-search", {}), ("tpe", {}), ("gp", {"n_startup_trials": 5}),
    ("surrogate-evolution", {"population_size": 10, "sample_size": 3, "quality_every": 0,
                             "n_candidates": 5,
                             "surrogate_options": {"n_models": 2, "n_estimators": 20}}),
])
def test_constrained_searches_return_feasible_best_trials(strategy, options):
    n = 12 if strategy == "gp" else 40
    study = frugalnas.create_study(strategy=strategy, strategy_options=options,
                                   constraints={**EDGE, "params": 1e6}, seed=3, **OFF)
    study.optimize(n)
    _check_records(study)
    best = study.best_trial
    assert best.user_attrs[FEASIBLE_ATTR] and _metric(best, PIXEL3) <= 10
    feasible = [t.values[0] for t in study.completed_trials() if t.user_attrs[FEASIBLE_ATTR]]
    assert best.values[0] == max(feasible) == study.best_value


def test_two_objective_constrained_front_is_feasible():
    study = frugalnas.create_study(strategy="nsga2", strategy_options={"population_size": 10},
                                   objectives=["value", PIXEL3],
                                   directions=["maximize", "minimize"], constraints={
                                       "params": 1.0e6}, seed=0, **OFF)
    study.optimize(30)
    front = study.best_trials
    assert front and all(t.user_attrs[FEASIBLE_ATTR] for t in front)
    assert all(t.user_attrs["cost"]["params"] <= 1e6 for t in front)
    with pytest.raises(RuntimeError, match="best_trials"):
        study.best_trial


def test_no_feasible_trial_is_a_clear_error_and_an_empty_front():
    study = frugalnas.create_study(constraints={PIXEL3: 1e-6}, **OFF)
    with pytest.raises(ValueError, match="no trial completed yet"):
        study.best_trial
    study.optimize(4)
    with pytest.raises(ValueError, match=r"no feasible trial: none of the 4 completed trial\(s\) "
                                         r"meets the constraints latency_ms_pixel3 <= 1e-06 "
                                         r"\(closest: trial \d+, latency_ms_pixel3 = "):
        study.best_trial
    assert study.best_trials == []
    two = frugalnas.create_study(objectives=["value", "params"], constraints={PIXEL3: 1e-6},
                                 directions=["maximize", "minimize"], **OFF)
    two.optimize(3)
    assert two.best_trials == []


@pytest.mark.parametrize("constraints,match", [
    ({"latency_ms_pixl3": 10}, "constraint 'latency_ms_pixl3' is not a metric of estimator "
                               "'nb201-table'; valid constraint names: value, .*latency_ms_pixel3"),
    ({PIXEL3: "ten"}, "invalid bound 'ten' for constraint 'latency_ms_pixel3'; expected a "
                      "finite number"),
    ({PIXEL3: math.inf}, "invalid bound inf"),
    ({PIXEL3: True}, "invalid bound True"),
    ([PIXEL3], r"invalid constraints \['latency_ms_pixel3'\]; expected \{metric name: upper "
               r"bound\}"),
])
def test_bad_constraints_are_refused_before_the_first_trial(constraints, match, tmp_path):
    storage = f"sqlite:///{tmp_path / 'c.db'}"
    with pytest.raises(ConfigError, match=match):
        frugalnas.create_study(constraints=constraints, storage=storage, study_name="c", **OFF)
    assert optuna.get_all_study_summaries(storage) == []


def test_constraints_are_stored_with_the_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = frugalnas.create_study(strategy="regularized-evolution", constraints=EDGE,
                                   storage=storage, study_name="s", seed=1, **OFF)
    study.optimize(5)
    again = frugalnas.load_study(study_name="s", storage=storage, **OFF)
    assert again.config.constraints == EDGE
    again.optimize(5)
    _check_records(again)
    assert again.best_trial.user_attrs[FEASIBLE_ATTR]
    with pytest.raises(ConfigConflictError, match="constraints"):
        frugalnas.create_study(strategy="regularized-evolution", constraints={PIXEL3: 5.0},
                               storage=storage, study_name="s", load_if_exists=True, seed=1,
                               **OFF)


def test_ask_tell_records_constraints_from_the_result_or_the_objectives():
    study = frugalnas.create_study(constraints=EDGE, **OFF)
    cand = study.ask()
    study.tell(cand, study.evaluate(cand.architecture))
    _check_records(study)
    two = frugalnas.create_study(objectives=["value", PIXEL3], constraints=EDGE,
                                 directions=["maximize", "minimize"], **OFF)
    cand = two.ask()
    two.tell(cand, [90.0, 12.5])
    assert two.trials[0].user_attrs[CONSTRAINTS_ATTR] == {PIXEL3: 2.5}
    assert two.trials[0].user_attrs[FEASIBLE_ATTR] is False
    cand = study.ask()
    with pytest.raises(ConfigError, match="constraint 'latency_ms_pixel3' is not an objective"):
        study.tell(cand, 90.0)


def test_strategies_rank_infeasible_trials_below_feasible_ones():
    maximize = [StudyDirection.MAXIMIZE]
    f = fitness([[90.0], [95.0], [80.0], [99.0]], maximize, violations=[0, 0.5, 0, 0.1])
    assert list(np.argsort(-f)) == [0, 2, 3, 1]  # feasible by value, then by violation
    two = [StudyDirection.MAXIMIZE, StudyDirection.MINIMIZE]
    f = fitness([[90.0, 5.0], [99.0, 1.0], [80.0, 9.0]], two, violations=[0, 0.2, 0])
    assert f[1] < min(f[0], f[2])  # (99, 1 ms) dominates both but violates a constraint
    assert fitness([[1.0], [2.0]], maximize, violations=[0, 0]).tolist() == [1.0, 2.0]


def test_regularized_evolution_searches_the_feasible_region_more_than_random():
    frac = {}
    for strategy in ("random", "regularized-evolution"):
        runs = []
        for seed in range(3):
            study = frugalnas.create_study(strategy=strategy, constraints=EDGE, seed=seed,
                                           strategy_options={} if strategy == "random" else
                                           {"population_size": 10, "sample_size": 3},
                                           **BLIND, **OFF)
            study.optimize(60)
            runs.append(np.mean([t.user_attrs[FEASIBLE_ATTR] for t in study.trials]))
        frac[strategy] = np.mean(runs)
    assert frac["regularized-evolution"] > frac["random"] + 0.05, frac


def test_run_file_and_command_line(tmp_path, capsys):
    path = tmp_path / "edge.toml"
    path.write_text('strategy = "tpe"\nn_trials = 12\n[constraints]\nlatency_ms_pixel3 = 10\n')
    config, run = load_run_file(path)
    assert config.constraints == {PIXEL3: 10.0}
    assert cli_main(["run", str(path), "--no-tracking", "-q", "--constraint",
                     "params<=1e6"]) == 0
    out = capsys.readouterr().out
    assert "best trial" in out
    assert cli_main(["run", "--constraint", "latency_ms_pixel3=10", "--dry-run"]) == 2
    assert "malformed constraint 'latency_ms_pixel3=10'; expected NAME<=VALUE" in \
        capsys.readouterr().err
    assert cli_main(["run", "--constraint", "latency_ms_pixel3<=10", "--constraint",
                     "params<=1e6", "--dry-run"]) == 0
    assert '"latency_ms_pixel3": "<= 10"' in capsys.readouterr().out


def test_edge_search_example_runs_constrained(capsys):
    from pathlib import Path

    example = Path(__file__).parents[2] / "examples" / "edge_search.toml"
    config, _ = load_run_file(example)
    assert config.constraints == EDGE and config.objectives == ["value", PIXEL3]
    assert cli_main(["run", str(example), "--no-tracking", "-q", "--n-trials", "30"]) == 0


# -- the constraint model of frugalnas's strategies ------------------------------------------
def _table_latency():
    from frugalnas.spaces.nb201.space import NB201Space
    from frugalnas.spaces.nb201.table import nb201_data
    from frugalnas.surrogates.encodings import OneHotEncoding

    space = NB201Space()
    archs = list(space.enumerate())
    return space, archs, OneHotEncoding(space).encode(archs), nb201_data().latency("pixel3")


def test_constraint_model_predicts_pixel3_feasibility_from_few_cells():
    from frugalnas.multiobjective.feasibility import ConstraintModel

    _, _, X, latency = _table_latency()
    rng = np.random.default_rng(0)
    train = rng.choice(len(X), 60, replace=False)
    test = np.setdiff1d(np.arange(len(X)), train)
    model = ConstraintModel().fit(X[train], latency[train] - 10.0)
    mean, std = model.predict(X[test])
    assert mean.shape == std.shape == (len(test), 1) and (std > 0).all()
    prob = model.prob_feasible(X[test])
    feasible = latency[test] <= 10.0
    accuracy = np.mean((prob >= 0.5) == feasible)
    assert accuracy > max(feasible.mean(), 1 - feasible.mean()) + 0.2, accuracy
    # Calibrated enough to rank: feasible cells get higher probabilities on average.
    assert prob[feasible].mean() > prob[~feasible].mean() + 0.3


def test_constraint_model_bad_input():
    from frugalnas.multiobjective.feasibility import ConstraintModel

    with pytest.raises(ConfigError, match="invalid constraint model alpha 0"):
        ConstraintModel(alpha=0)
    with pytest.raises(ValueError, match=r"matching non-empty X \(3, 2\) and diffs \(2, 1\)"):
        ConstraintModel().fit(np.zeros((3, 2)), np.zeros((2, 1)))
    with pytest.raises(RuntimeError, match="before fit"):
        ConstraintModel().predict(np.zeros((1, 2)))


def test_violation_penalty_keeps_near_feasible_parents_and_prefers_feasible_ties():
    maximize = [StudyDirection.MAXIMIZE]
    values = [[90.0], [93.0], [80.0], [93.0]]
    deb = fitness(values, maximize, violations=[0, 0.01, 0, 0.0])
    assert deb[1] < deb[2]  # Deb's rule: 1 % over the bound ranks below 80 %
    soft = fitness(values, maximize, violations=[0, 0.01, 0, 0.0], penalty=5.0)
    assert soft[2] < soft[1] < soft[3]  # above 80 %, below the feasible 93 %
    far = fitness(values, maximize, violations=[0, 1.0, 0, 0.0], penalty=5.0)
    assert far[1] < far[2]  # twice the bound: below every feasible trial here


@pytest.mark.parametrize("options,match", [
    ({"feasibility_threshold": 1.5}, r"invalid feasibility_threshold 1.5; valid range: \[0.0, 1.0\]"),
    ({"screen_size": 0}, r"invalid screen_size 0; valid range: \[1, inf\]"),
    ({"violation_penalty": -1}, r"invalid violation_penalty -1; valid range: \[0.0, inf\]"),
    ({"constraint_model": "yes"}, r"invalid constraint_model 'yes'; valid: True, False"),
    ({"bridge_infeasible": 1}, r"invalid bridge_infeasible 1; valid: True, False"),
])
def test_bad_constraint_options_name_the_value(options, match):
    with pytest.raises(ConfigError, match=match):
        frugalnas.create_study(strategy="regularized-evolution", strategy_options=options,
                               constraints=EDGE, **OFF)


def test_constraint_model_screens_candidates_of_evolution_and_local_search():
    """With the constraint model the strategies evaluate feasible cells more often than
    without it (same seeds, same budget)."""
    frac = {}
    for strategy in ("regularized-evolution", "local-search"):
        for model in (True, False):
            runs = []
            for seed in range(4):
                options = {"constraint_model": model, "violation_penalty": math.inf}
                study = frugalnas.create_study(strategy=strategy, constraints=EDGE, seed=seed,
                                               strategy_options=options, **BLIND, **OFF)
                study.optimize(80)
                runs.append(np.mean([t.user_attrs[FEASIBLE_ATTR] for t in study.trials]))
            frac[strategy, model] = np.mean(runs)
    for strategy in ("regularized-evolution", "local-search"):
        assert frac[strategy, True] > frac[strategy, False] + 0.05, frac


def test_prefer_feasible_picks_the_predicted_feasible_candidate_nearest_the_boundary():
    """On a history of table cells where accuracy grows with latency, the strategy picks,
    among the candidates its model calls feasible, the one predicted closest to the bound."""
    from frugalnas.strategies.history import History
    from frugalnas.strategies.regularized import RegularizedEvolutionSampler

    space, archs, _, latency = _table_latency()
    rng = np.random.default_rng(1)
    idx = rng.choice(len(archs), 80, replace=False)
    hist = History(archs=[archs[i] for i in idx], values=[[float(latency[i])] for i in idx],
                   numbers=list(range(80)), violations=[max(0.0, (latency[i] - 10) / 10)
                                                        for i in idx],
                   constraint_diffs=[(float(latency[i] - 10),) for i in idx])
    sampler = RegularizedEvolutionSampler(space, seed=0)
    study = optuna.create_study(direction="maximize")
    assert sampler.boundary_is_active(study, hist)
    pool = [a for a in archs if latency[space.index(a)] <= 20][:200]
    prob, margin = sampler.constraint_prediction(hist, pool)
    chosen = sampler.prefer_feasible(study, hist, pool)
    ok = [i for i in range(len(pool)) if prob[i] >= 0.5]
    assert chosen.key == pool[max(ok, key=lambda i: margin[i])].key
    # Minimising the same values turns the preference off: the first predicted feasible.
    low = optuna.create_study(direction="minimize")
    assert not sampler.boundary_is_active(low, hist)
    assert sampler.prefer_feasible(low, hist, pool).key == pool[ok[0]].key
    # Without a violation in the history nothing is predicted: the first candidate.
    clean = History(archs=hist.archs[:3], values=hist.values[:3], numbers=[0, 1, 2],
                    violations=[0.0] * 3, constraint_diffs=[(-1.0,)] * 3)
    assert sampler.constraint_prediction(clean, pool) is None
    assert sampler.prefer_feasible(study, clean, pool).key == pool[0].key
