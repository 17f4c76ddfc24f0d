"""The ``inherited`` estimator with strategies other than si-evolution, on NB201: every trial
trains its candidate on the shared store, the store is checkpointed beside the study, and a
reopened study continues it. SievoSession's networks are views of its Supernet."""

import ast
import random

import pytest
import torch

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.sievo import supernet_of, weight_store_of
from frugalnas.sievo.session import SievoSession, checkpoint_path
from frugalnas.spaces.nb201.space import NB201Space

NB201 = {"N": 1, "C": 4}
TRAIN = {"train_steps": 3, "batch_size": 32, "valid_limit": 64}


def _study(strategy="random", storage=None, name=None, estimator_options=TRAIN, **options):
    return frugalnas.create_study(
        space="nb201", space_options=NB201, dataset="digits", strategy=strategy,
        estimator="inherited", estimator_options=estimator_options, storage=storage,
        study_name=name, seed=0, disable_plugins=["mlflow"], **options)


def _snapshot(study):
    return {k: v.detach().clone() for k, v in weight_store_of(study).state_dict().items()}


def _changed(before, after):
    return [k for k, v in before.items() if k in after and not torch.equal(v, after[k])]


@pytest.mark.parametrize("strategy, options", [
    ("random", {}),
    ("regularized-evolution", {"strategy_options": {"population_size": 3, "sample_size": 2,
                                                     "n_init": 2}}),
])
def test_each_trial_trains_its_candidate_on_the_shared_store(strategy, options):
    study = _study(strategy, **options)
    snapshots = []
    for _ in range(4):
        study.optimize(1)
        snapshots.append(_snapshot(study))
    trials = study.completed_trials()
    assert len(trials) == 4
    for before, after in zip(snapshots, snapshots[1:]):
        assert _changed(before, after), "a trial left the shared store untouched"
    train_size = len(study.load_dataset().train_x)
    for t in trials:
        assert 0.0 <= t.value <= 100.0
        assert set(t.user_attrs["metrics"]) == {"inherited_accuracy"}
        assert t.user_attrs["cost"]["epochs"] * train_size == pytest.approx(3 * 32)
    session = study.estimator.session(study.context())
    assert session.candidate_steps == 4 * 3 and session.trained_generation == -1


def test_train_steps_zero_only_scores():
    study = _study(estimator_options={**TRAIN, "train_steps": 0})
    study.optimize(1)
    before = _snapshot(study)
    study.optimize(2)
    assert not _changed(before, _snapshot(study))
    assert all(t.user_attrs["cost"]["epochs"] == 0 for t in study.completed_trials())


def test_a_reopened_sqlite_study_continues_the_checkpointed_store(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = _study(storage=storage, name="inherited-resume")
    study.optimize(3)
    path = checkpoint_path(study.optuna_study)
    assert path.parent == tmp_path / "optuna-sievo" and path.exists()
    saved = torch.load(path, weights_only=True)
    assert ast.literal_eval(saved["meta"])["candidate_steps"] == 3 * 3
    end_of_first = _snapshot(study)

    resumed = frugalnas.load_study(study_name="inherited-resume", storage=storage)
    assert weight_store_of(resumed) is not weight_store_of(study)
    loaded = _snapshot(resumed)
    assert loaded.keys() == end_of_first.keys()
    assert all(torch.equal(loaded[k], v) for k, v in end_of_first.items())
    resumed.optimize(1)
    assert len(resumed.completed_trials()) == 4
    assert _changed(loaded, _snapshot(resumed))
    assert ast.literal_eval(torch.load(path, weights_only=True)["meta"])["candidate_steps"] == 4 * 3


def test_scores_outside_trials_do_not_train_and_do_not_depend_on_the_order():
    """Batch norm is recalibrated per candidate (NB201's ordinary batch norms included), so a
    candidate's score does not depend on which candidates were scored before it."""
    study = _study()
    rng = random.Random(0)
    a, b = study.space.sample(rng), study.space.sample(rng)
    before = _snapshot(study)
    first = study.evaluate(a).value
    study.evaluate(b)
    assert study.evaluate(a).value == first
    assert not _changed(before, _snapshot(study))


@pytest.mark.parametrize("space, options", [("nb201", NB201),
                                            ("dag", {"channels": 4, "nodes": 2, "reductions": 1})])
def test_session_networks_are_made_of_the_supernets_tensors(space, options):
    study = frugalnas.create_study(space=space, space_options=options, dataset="digits",
                                   estimator="inherited", disable_plugins=["mlflow"])
    context = study.context()
    session = study.estimator.session(context)
    supernet = supernet_of(study)
    assert session.supernet is supernet and weight_store_of(study) is supernet.stores[0]
    rng = random.Random(1)
    nets = [session.network(study.space.sample(rng)) for _ in range(2)]
    store_params = {id(p) for p in supernet.stores[0].parameters()}  # keys created on first use
    for net in nets:
        params = list(net.parameters())
        assert params and all(id(p) in store_params for p in params)
    # two candidates hold the same tensors wherever they use the same module (the stem at least)
    assert {id(p) for p in nets[0].parameters()} & {id(p) for p in nets[1].parameters()}
    # and the supernet built by weight_sharing for the same space has the same keys
    assert set(supernet.builder.keys()) >= set(supernet.stores[0].keys())


class PlainNB201(NB201Space):
    """NB201 without weight sharing: it declares no capability."""

    name = "plain-nb201"
    capabilities = {}


class PlainSpacePlugin:
    @frugalnas.hookimpl
    def frugalnas_search_spaces(self):
        return {"plain-nb201": PlainNB201}


def test_a_space_without_weight_sharing_is_refused_before_the_first_trial():
    with pytest.raises(ConfigError, match="space 'plain-nb201' has none; built-in spaces that "
                                          "have one: nb201, dag"):
        frugalnas.create_study(space="plain-nb201", space_options=NB201, dataset="digits",
                               estimator="inherited", plugins=[PlainSpacePlugin()],
                               disable_plugins=["mlflow"])
    with pytest.raises(ConfigError, match="has none"):
        SievoSession(PlainNB201(**NB201), _study().load_dataset(), None)


@pytest.mark.parametrize("option, value, message", [
    ("train_steps", -1, r"invalid train_steps -1; valid range: \[0, inf\]"),
    ("train_steps", 2.5, "invalid train_steps 2.5; expected a whole number"),
    ("momentum", 1.5, r"invalid momentum 1.5; valid range: \[0, 1\]"),
    ("batch_size", 1, r"invalid batch_size 1; valid range: \[2, inf\]"),
])
def test_bad_training_options_name_the_value_and_the_valid_range(option, value, message):
    with pytest.raises(ConfigError, match=message):
        _study(estimator_options={option: value})
