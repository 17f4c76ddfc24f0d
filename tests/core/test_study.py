import numpy as np
import optuna
import pytest

import frugalnas
from frugalnas import ConfigError, EstimateResult
from frugalnas.spaces.nb201.table import nb201_data, nb201_table
from frugalnas.spaces.nb201.space import NB201Space


def test_random_study_on_the_table_records_architectures():
    study = frugalnas.create_study(disable_plugins=["mlflow"], seed=3)
    study.optimize(n_trials=15)
    best = study.best_trial
    space = NB201Space()
    # Selection is on CIFAR-10 validation accuracy; test accuracies are separate metrics.
    index = space.index(best.architecture)
    assert best.value == pytest.approx(float(nb201_data().valid_accuracy_cifar10[index]))
    assert best.user_attrs["metrics"]["test_accuracy_cifar10"] == pytest.approx(
        float(nb201_table()[index, 0]))
    assert best.user_attrs["metrics"]["test_accuracy_cifar100"] > 0
    df = study.trials_dataframe()
    assert list(df["architecture"]) == [str(t.architecture) for t in study.trials]
    assert len(df) == 15


def test_same_seed_same_trials():
    a = frugalnas.create_study(disable_plugins=["mlflow"], seed=7)
    b = frugalnas.create_study(disable_plugins=["mlflow"], seed=7)
    a.optimize(10)
    b.optimize(10)
    assert [str(t.architecture) for t in a.trials] == [str(t.architecture) for t in b.trials]


def test_ask_and_tell():
    study = frugalnas.create_study(disable_plugins=["mlflow"])
    cand = study.ask()
    result = study.evaluate(cand.architecture)
    assert isinstance(result, EstimateResult)
    frozen = study.tell(cand, result)
    assert frozen.state == optuna.trial.TrialState.COMPLETE
    assert frozen.user_attrs["architecture"] == str(cand.architecture)
    cand2 = study.ask()
    study.tell(cand2, 50.0)
    assert [t.value for t in study.trials] == [result.value, 50.0]


def test_plain_optuna_sampler_and_storage_round_trip(stores):
    storage, _ = stores
    study = frugalnas.create_study(strategy=optuna.samplers.TPESampler(seed=0), storage=storage,
                                   study_name="tpe", disable_plugins=["mlflow"])
    study.optimize(5)
    with pytest.raises(ConfigError, match="pass strategy="):
        frugalnas.load_study(study_name="tpe", storage=storage)
    again = frugalnas.load_study(study_name="tpe", storage=storage,
                                 strategy=optuna.samplers.TPESampler(seed=1))
    again.optimize(3)
    assert len(again.trials) == 8
    assert again.config.strategy == "TPESampler"


def test_load_study_continues_with_stored_config(stores):
    storage, _ = stores
    study = frugalnas.create_study(storage=storage, study_name="s", disable_plugins=["mlflow"], seed=5,
                                   estimator_options={"dataset": "cifar100", "select_on": "test"})
    study.optimize(4)
    again = frugalnas.load_study(study_name="s", storage=storage)
    assert again.config.estimator_options == {"dataset": "cifar100", "select_on": "test"}
    again.optimize(2)
    assert len(again.trials) == 6
    with pytest.raises(ConfigError, match="no study named 'nope'.*studies there: s"):
        frugalnas.load_study(study_name="nope", storage=storage)
    with pytest.raises(ConfigError, match="different configuration"):
        frugalnas.create_study(storage=storage, study_name="s", disable_plugins=["mlflow"], seed=6,
                               load_if_exists=True)


def test_train_estimator_on_digits_reports_cost():
    study = frugalnas.create_study(estimator="train", dataset="digits", disable_plugins=["mlflow"],
                                   space_options={"N": 1, "C": 4},
                                   estimator_options={"epochs": 1, "batch_size": 128})
    study.optimize(2)
    for t in study.trials:
        cost = t.user_attrs["cost"]
        assert cost["params"] > 0 and cost["flops"] > 0 and cost["seconds"] > 0
        assert cost["epochs"] == pytest.approx(1.0)
        assert 0 <= t.value <= 100


def test_multi_objective_accuracy_vs_params():
    study = frugalnas.create_study(directions=["maximize", "minimize"],
                                   objectives=["value", "test_accuracy_cifar100"], disable_plugins=["mlflow"])
    study.optimize(10)
    assert study.best_trials and all(len(t.values) == 2 for t in study.best_trials)


def test_failing_candidate_becomes_a_fail_trial():
    study = frugalnas.create_study(estimator="train", dataset="digits", disable_plugins=["mlflow"],
                                   space_options={"N": 1, "C": 2},
                                   estimator_options={"epochs": 1, "lr": 1e30, "batch_size": 256})
    study.optimize(2)
    states = {t.state.name for t in study.trials}
    assert "FAIL" in states
    failed = [t for t in study.trials if t.state.name == "FAIL"][0]
    assert "non-finite" in failed.user_attrs["fail_reason"]


def _best_of(study, n):
    return max(t.value for t in study.trials[:n])


@pytest.mark.slow
def test_tpe_is_at_least_as_good_as_random_on_nb201():
    """50 trials, 5 seeds: TPE's best >= the best of 50 random cells on average."""
    tpe, rnd = [], []
    for seed in range(5):
        s = frugalnas.create_study(strategy=optuna.samplers.TPESampler(seed=seed), disable_plugins=["mlflow"])
        s.optimize(50)
        tpe.append(_best_of(s, 50))
        r = frugalnas.create_study(strategy="random", seed=seed, disable_plugins=["mlflow"])
        r.optimize(50)
        rnd.append(_best_of(r, 50))
    assert np.mean(tpe) >= np.mean(rnd)
