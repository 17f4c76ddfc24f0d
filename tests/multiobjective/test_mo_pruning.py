"""Multi-objective pruning: the ``pareto`` pruner on real training studies (digits, a one-cell
NB201 network with 8 channels), with the single-device and the virtual-node backends, the
``train`` and ``low-fidelity`` estimators, and every kind of strategy."""

import numpy as np
import optuna
import pytest

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.keys import INTERMEDIATE_ATTR
from frugalnas.host.plugins import PluginHost
from frugalnas.multiobjective.pruning import ParetoHalvingPruner, ParetoPruner, nondominated_rank

OFF = {"disable_plugins": ["mlflow", "progress"]}
TINY = {"N": 1, "C": 8}
TWO = {"objectives": ["value", "params"], "directions": ["maximize", "minimize"]}


pytestmark = pytest.mark.usefixtures("one_thread")


def _dominated_at_step(study, trial) -> bool:
    """The pruner's rule, checked from the storage: the pruned trial's vector at its last
    step is dominated by a vector another trial reported at that step."""
    steps = trial.user_attrs[INTERMEDIATE_ATTR]
    step = max(steps, key=int)
    mine = np.array(steps[step]) * [1, -1]
    for other in study.trials:
        vec = (other.user_attrs.get(INTERMEDIATE_ATTR) or {}).get(step)
        if other.number != trial.number and vec is not None:
            theirs = np.array(vec) * [1, -1]
            if (theirs >= mine).all() and (theirs > mine).any():
                return True
    return False


def _study(**kwargs):
    options = dict(space_options=TINY, dataset="digits", estimator="train",
                   estimator_options={"epochs": 2, "batch_size": 128}, pruner="pareto",
                   pruner_options={"n_startup_trials": 3}, seed=0, **TWO, **OFF)
    options.update(kwargs)
    return frugalnas.create_study(**options)


def test_pareto_pruning_study_on_digits_prunes_dominated_trials_and_completes(tmp_path):
    storage = f"sqlite:///{tmp_path / 'mo.db'}"
    study = _study(storage=storage, study_name="mo")
    study.optimize(10)
    states = [t.state.name for t in study.trials]
    assert states.count("PRUNED") >= 1 and states.count("COMPLETE") >= 4, states
    assert "FAIL" not in states
    for t in study.trials:
        steps = t.user_attrs[INTERMEDIATE_ATTR]
        if t.state.name == "PRUNED":
            assert list(steps) == ["1"]  # stopped after the first of two epochs
            assert _dominated_at_step(study, t)
        else:
            assert sorted(steps) == ["1", "2"]
            assert steps["2"] == pytest.approx(t.values)  # the last report is the result
    assert study.best_trials and all(t.state.name == "COMPLETE" for t in study.best_trials)
    # The pruner is part of the stored configuration: a reopened study prunes the same way.
    again = frugalnas.load_study(study_name="mo", storage=storage, **OFF)
    assert isinstance(again.optuna_study.pruner, ParetoPruner)
    assert again.optuna_study.pruner.n_startup_trials == 3


def test_pareto_pruning_with_the_virtual_node_backend_and_low_fidelity():
    study = _study(backend="virtual-node", backend_options={"virtual_nodes": 2},
                   estimator="low-fidelity", strategy="regularized-evolution",
                   strategy_options={"population_size": 3, "sample_size": 2},
                   estimator_options={"epochs": 2, "subset": 0.5, "batch_size": 64,
                                      "report_every_epoch": True})
    study.optimize(8)
    states = [t.state.name for t in study.trials]
    assert "FAIL" not in states and states.count("PRUNED") >= 1, states
    assert all(_dominated_at_step(study, t) for t in study.trials if t.state.name == "PRUNED")


@pytest.mark.parametrize("strategy", ["nsga2", "tpe", "local-search"])
def test_pareto_pruning_works_with_optuna_and_frugalnas_strategies(strategy):
    study = _study(strategy=strategy, estimator_options={"epochs": 2, "batch_size": 128,
                                                         "max_steps": 12})
    study.optimize(6)
    states = [t.state.name for t in study.trials]
    assert "FAIL" not in states and states.count("COMPLETE") >= 3, states


def test_rule_and_warm_up_on_a_plain_optuna_study():
    study = optuna.create_study(directions=["maximize", "minimize"])
    pruner = ParetoPruner(n_startup_trials=2, n_warmup_steps=2)
    for acc, size in ((90.0, 10.0), (80.0, 5.0)):
        t = study.ask()
        t.set_user_attr(INTERMEDIATE_ATTR, {"1": [acc - 10, size], "2": [acc, size]})
        study.tell(t, [acc, size])
    assert not pruner.prune_vector(study, 99, 2, [85.0, 7.0])  # on the front: goes on
    assert pruner.prune_vector(study, 99, 2, [79.0, 6.0])      # dominated by (80, 5)
    assert not pruner.prune_vector(study, 99, 1, [0.0, 99.0])  # warm-up step
    assert not ParetoPruner(n_startup_trials=3).prune_vector(study, 99, 2, [79.0, 6.0])
    # keep_fronts=2 lets the second front go on.
    assert not ParetoPruner(keep_fronts=2).prune_vector(study, 99, 2, [79.0, 6.0])
    assert nondominated_rank(np.array([[1.0, 1.0], [0.0, 0.0], [2.0, 0.0]]), 1) == 1


def test_bad_pruner_settings_are_refused_before_the_first_trial(tmp_path):
    storage = f"sqlite:///{tmp_path / 'bad.db'}"
    with pytest.raises(ConfigError, match="unknown pruner 'paretto'.*pareto"):
        _study(pruner="paretto", storage=storage)
    with pytest.raises(ConfigError, match="unknown option 'keep_front'.*keep_fronts"):
        _study(pruner_options={"keep_front": 2}, storage=storage)
    with pytest.raises(ConfigError, match="invalid pareto keep_fronts 0"):
        _study(pruner_options={"keep_fronts": 0}, storage=storage)
    with pytest.raises(ConfigError, match="pruner 'median' prunes on one objective.*'pareto'"):
        _study(pruner="median", pruner_options={}, storage=storage)
    assert optuna.get_all_study_summaries(storage) == []


def test_pruners_are_components_listed_by_name():
    names = PluginHost().registry("pruners").names()
    assert {"pareto", "pareto-halving", "median", "successive-halving", "hyperband",
            "nop"} <= set(names)


def test_every_objective_per_epoch_is_tracked_in_mlflow(tmp_path):
    from mlflow import MlflowClient

    from frugalnas.testing import fresh_mlflow_uri

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    study = _study(plugin_options={"mlflow": {"tracking_uri": uri}}, disable_plugins=["progress"],
                   study_name="mo-tracked")
    study.optimize(4)
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("mo-tracked")
    runs = {int(r.data.tags["frugalnas.trial_number"]): r
            for r in client.search_runs([experiment.experiment_id],
                                        "tags.`frugalnas.role` = 'trial'")}
    assert sorted(runs) == [t.number for t in study.trials]
    for t in study.trials:
        steps = t.user_attrs[INTERMEDIATE_ATTR]
        for i, name in enumerate(["value", "params"]):
            history = client.get_metric_history(runs[t.number].info.run_id, f"intermediate_{name}")
            logged = sorted((m.step, m.value) for m in history)
            stored = sorted((int(s), v[i]) for s, v in steps.items())
            assert [s for s, _ in logged] == [s for s, _ in stored]
            assert [v for _, v in logged] == pytest.approx([v for _, v in stored])


def _plain_study(vectors_at_step):
    """A plain optuna study whose finished trials reported ``vectors_at_step`` at step 1."""
    study = optuna.create_study(directions=["maximize", "minimize"])
    for acc, size in vectors_at_step:
        t = study.ask()
        t.set_user_attr(INTERMEDIATE_ATTR, {"1": [acc, size]})
        study.tell(t, [acc, size])
    return study


def test_margin_gives_the_benefit_of_the_doubt():
    # Accuracies span 60..90 and sizes 1..10 at step 1: a 10 % margin is 3 points and 0.9.
    study = _plain_study([(90.0, 10.0), (80.0, 5.0), (60.0, 1.0)])
    assert ParetoPruner(n_startup_trials=0).prune_vector(study, 99, 1, [79.0, 5.5])
    assert not ParetoPruner(n_startup_trials=0, margin=0.1).prune_vector(study, 99, 1,
                                                                          [79.0, 5.5])
    # Far behind: pruned even with the margin.
    assert ParetoPruner(n_startup_trials=0, margin=0.1).prune_vector(study, 99, 1, [70.0, 6.0])


def test_halving_keeps_the_best_fraction_at_each_rung():
    pruner = ParetoHalvingPruner(n_startup_trials=0, min_resource=1, reduction_factor=2)
    assert [s for s in range(1, 10) if pruner.is_rung(s)] == [1, 2, 4, 8]
    assert [s for s in range(1, 20) if ParetoHalvingPruner(min_resource=2, reduction_factor=3)
            .is_rung(s)] == [2, 6, 18]
    # Three earlier vectors, all on the front; with the newcomer there are four: keep two.
    study = _plain_study([(90.0, 10.0), (80.0, 5.0), (60.0, 1.0)])
    assert pruner.prune_vector(study, 99, 1, [70.0, 8.0])       # dominated by (80, 5)
    assert not pruner.prune_vector(study, 99, 1, [95.0, 0.5])   # dominates everything
    # Not dominated, but third of four in NSGA-II order (least crowded go first): stops,
    # where the dominance rule lets it go on.
    assert pruner.prune_vector(study, 99, 1, [85.0, 7.0])
    assert not ParetoPruner(n_startup_trials=0).prune_vector(study, 99, 1, [85.0, 7.0])
    assert not pruner.prune_vector(study, 99, 3, [0.0, 99.0])   # not a rung
    assert not ParetoHalvingPruner(n_startup_trials=4).prune_vector(study, 99, 1, [70.0, 8.0])


def test_halving_study_on_digits_prunes_and_completes():
    study = _study(pruner="pareto-halving",
                   pruner_options={"n_startup_trials": 3, "reduction_factor": 2})
    study.optimize(10)
    states = [t.state.name for t in study.trials]
    assert "FAIL" not in states and states.count("PRUNED") >= 1, states
    assert states.count("COMPLETE") >= 4, states
    for t in study.trials:
        if t.state.name == "PRUNED":
            assert list(t.user_attrs[INTERMEDIATE_ATTR]) == ["1"]  # stopped at the rung


def test_bad_halving_settings_are_refused_before_the_first_trial():
    with pytest.raises(ConfigError, match=r"invalid pareto-halving reduction_factor 1; valid "
                                          r"range: \[2, inf\]"):
        _study(pruner="pareto-halving", pruner_options={"reduction_factor": 1})
    with pytest.raises(ConfigError, match=r"invalid pareto margin -0.5; valid range"):
        _study(pruner_options={"margin": -0.5})
    with pytest.raises(ConfigError, match="unknown option 'eta'.*reduction_factor"):
        _study(pruner="pareto-halving", pruner_options={"eta": 2})
