"""The ``pareto-hv`` pruner (hypervolume chance): its rule on plain optuna studies with
recorded learning curves, and on a real training study on digits."""

import optuna
import pytest

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.keys import INTERMEDIATE_ATTR
from frugalnas.host.plugins import PluginHost
from frugalnas.multiobjective.pruning import HypervolumePruner
from frugalnas.testing.pruners import PrunerChecks

OFF = {"disable_plugins": ["mlflow", "progress"]}
TWO = {"objectives": ["value", "params"], "directions": ["maximize", "minimize"]}


pytestmark = pytest.mark.usefixtures("one_thread")


def _curves_study():
    """Three completed trials (accuracy max, size min) with a vector at step 1 and a final one:
    gains from step 1 of 80, 45 and 30 accuracy points. Final front: (90, 20) and (95, 40)."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for first, final in (((10.0, 20.0), (90.0, 20.0)), ((50.0, 40.0), (95.0, 40.0)),
                         ((30.0, 30.0), (60.0, 30.0))):
        t = study.ask()
        t.set_user_attr(INTERMEDIATE_ATTR, {"1": list(first), "2": list(final)})
        study.tell(t, list(final))
    return study


def test_a_large_trial_no_curve_lifts_past_the_front_is_pruned():
    study = _curves_study()
    pruner = HypervolumePruner(n_startup_trials=0)
    # Size 50 at chance level: the best gain gives (92, 50), dominated by (95, 40).
    assert pruner.chance(study, 99, 1, [12.0, 50.0]) == 0.0
    assert pruner.prune_vector(study, 99, 1, [12.0, 50.0])
    # Leading at step 1 does not save it when it is larger than a better result:
    # 88 + 45 points would still be at size 60, but (133, 60) is not dominated: kept.
    assert not pruner.prune_vector(study, 99, 1, [88.0, 60.0])


def test_a_small_trial_at_chance_level_keeps_its_hypervolume_chance():
    study = _curves_study()
    # Size 25 at 12 %, behind the (10, 20) trial at step 1 only in size: with the gain of
    # 80 it would end at (92, 25), above the front's (90, 20) and smaller than (95, 40); the
    # gains of 45 and 30 leave it dominated. One curve of three makes it count.
    pruner = HypervolumePruner(n_startup_trials=0)
    assert pruner.chance(study, 99, 1, [12.0, 25.0]) == pytest.approx(1 / 3)
    assert not pruner.prune_vector(study, 99, 1, [12.0, 25.0])
    # The same trial is stopped when more than half of the curves must make it count.
    assert HypervolumePruner(n_startup_trials=0, min_chance=0.5).prune_vector(
        study, 99, 1, [12.0, 25.0])
    # Smaller than every completed trial: every curve makes it count.
    assert pruner.chance(study, 99, 1, [10.0, 10.0]) == 1.0
    # Dominated at step 1 by (10, 20) and by what it could reach: stopped.
    assert pruner.prune_vector(study, 99, 1, [9.0, 21.0])


def test_warm_up_and_no_curves_mean_no_pruning():
    study = _curves_study()
    assert not HypervolumePruner(n_startup_trials=4).prune_vector(study, 99, 1, [12.0, 50.0])
    assert not HypervolumePruner(n_startup_trials=0, n_warmup_steps=2).prune_vector(
        study, 99, 1, [12.0, 50.0])
    # No completed trial reported step 3: nothing to learn from.
    assert HypervolumePruner(n_startup_trials=0).chance(study, 99, 3, [12.0, 50.0]) is None
    assert not HypervolumePruner(n_startup_trials=0).prune_vector(study, 99, 3, [12.0, 50.0])
    # A pruned trial gives no curve (its end is unknown) but counts as finished.
    t = study.ask()
    t.set_user_attr(INTERMEDIATE_ATTR, {"1": [99.0, 1.0]})
    study.tell(t, state=optuna.trial.TrialState.PRUNED)
    assert HypervolumePruner(n_startup_trials=4).chance(study, 99, 1, [12.0, 50.0]) == 0.0


def test_the_pruner_passes_the_conformance_checks():
    assert PrunerChecks(HypervolumePruner()).run() == ["check_is_pruner", "check_decides"]


def test_bad_settings_are_refused_with_the_valid_range():
    with pytest.raises(ConfigError, match=r"invalid pareto-hv min_chance 1; valid range: "
                                          r"\[0, 1\)"):
        HypervolumePruner(min_chance=1)
    with pytest.raises(ConfigError, match=r"invalid pareto-hv min_chance -0.1; valid range"):
        HypervolumePruner(min_chance=-0.1)
    with pytest.raises(ConfigError, match=r"invalid pareto-hv interval_steps 0; valid range"):
        HypervolumePruner(interval_steps=0)
    with pytest.raises(ConfigError, match="invalid direction 'up'"):
        HypervolumePruner(directions=["up", "minimize"])
    assert "pareto-hv" in PluginHost().registry("pruners").names()


def _replayed(study, number):
    """An in-memory study holding the trials of ``study`` numbered below ``number``, as the
    pruner saw the study when it decided on trial ``number`` (one trial at a time)."""
    copy = optuna.create_study(directions=["maximize", "minimize"])
    for t in study.optuna_study.trials:
        if t.number < number:
            copy.add_trial(t)
    return copy


def test_study_on_digits_prunes_trials_without_a_chance_and_completes():
    study = frugalnas.create_study(
        space_options={"N": 1, "C": 8}, dataset="digits", estimator="train",
        estimator_options={"epochs": 2, "batch_size": 128}, pruner="pareto-hv",
        pruner_options={"n_startup_trials": 3, "min_chance": 0.5}, seed=0, **TWO, **OFF)
    study.optimize(10)
    states = [t.state.name for t in study.trials]
    assert "FAIL" not in states and states.count("PRUNED") >= 1, states
    assert states.count("COMPLETE") >= 4, states
    rule = HypervolumePruner(n_startup_trials=3, min_chance=0.5)
    for t in study.optuna_study.trials:
        first = t.user_attrs[INTERMEDIATE_ATTR]["1"]
        before = _replayed(study, t.number)
        if t.state.name == "PRUNED":
            # Stopped after epoch 1 because at most half of the earlier curves made it count.
            assert list(t.user_attrs[INTERMEDIATE_ATTR]) == ["1"]
            assert rule.chance(before, t.number, 1, first) <= 0.5
        else:
            # Went on: still warming up, or more than half of the curves made it count.
            chance = rule.chance(before, t.number, 1, first)
            assert chance is None or chance > 0.5
            assert t.user_attrs[INTERMEDIATE_ATTR]["2"] == pytest.approx(t.values)
    assert all(t.state.name == "COMPLETE" for t in study.best_trials)
