"""Constraints by metric name: validated before the first trial, recorded on every trial,
stored with the study, preferred by every strategy, and respected by best_trial(s)."""

import math

import numpy as np
import optuna
import pytest
from optuna.study import StudyDirection

import frugalnas
from frugalnas.core.cli import main as cli_main
from frugalnas.core.config import load_run_file
from frugalnas.core.errors import ConfigConflictError, ConfigError
from frugalnas.core.keys import CONSTRAINTS_ATTR, FEASIBLE_ATTR, VIOLATION_ATTR
from frugalnas.strategies.base import fitness

OFF = {"disable_plugins": ["mlflow", "progress"]}
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
                                           {"population_size": 10, "sample_size": 3}, **OFF)
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

    example = Path(__file__).parents[1] / "examples" / "edge_search.toml"
    config, _ = load_run_file(example)
    assert config.constraints == EDGE and config.objectives == ["value", PIXEL3]
    assert cli_main(["run", str(example), "--no-tracking", "-q", "--n-trials", "30"]) == 0
