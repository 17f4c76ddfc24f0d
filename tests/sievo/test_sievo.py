"""SI-evolution with inherited weights: a small study end to end, MLflow, resume."""

import ast

import mlflow
import pytest
import torch

import frugalnas
from frugalnas.sievo import retrain, weight_store_of
from frugalnas.sievo.session import checkpoint_path
from frugalnas.testing import fresh_mlflow_uri

SPACE = {"channels": 4, "nodes": 2, "reductions": 1}
STRATEGY = {"population_size": 3, "offspring": 2, "batches_per_generation": 4, "batch_size": 32}
ESTIMATOR = {"valid_limit": 96}


def _study(storage, name, tracking_uri=None, **strategy):
    return frugalnas.create_study(
        space="dag", strategy="si-evolution", estimator="inherited", dataset="digits",
        storage=storage, study_name=name, space_options=SPACE,
        strategy_options={**STRATEGY, **strategy}, estimator_options=ESTIMATOR,
        **tracking(tracking_uri))


def _saved(path):
    """A sievo checkpoint (a Supernet file with one store) read directly: meta, keys, tensors."""
    data = torch.load(path, weights_only=True)
    (store,) = data["stores"]
    return {"meta": ast.literal_eval(data["meta"]), "keys": store["keys"], "state": store["state"]}


def tracking(uri):
    """Study options that log to ``uri``, or turn tracking off when it is None."""
    if uri is None:
        return {"disable_plugins": ["mlflow"]}
    return {"plugin_options": {"mlflow": {"tracking_uri": uri}}}


@pytest.mark.slow
def test_small_study_runs_end_to_end_with_mlflow(tmp_path, monkeypatch):
    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")  # a copy of an empty sqlite store
    monkeypatch.setenv("MLFLOW_TRACKING_URI", uri)
    study = _study(f"sqlite:///{tmp_path}/optuna.db", "sievo-e2e", uri, generations=2)
    study.optimize(50)  # the study stops when the strategy's generations are done
    trials = study.completed_trials()
    assert len(trials) == 3 + 2 * 2
    gens = [t.user_attrs["metrics"]["generation"] for t in trials]
    assert gens == [0, 0, 0, 1, 1, 2, 2]
    # training cost is charged to the first trial of each generation
    flops = [t.user_attrs["cost"]["flops"] for t in trials]
    assert flops[0] > flops[1] and flops[3] > flops[4] and flops[5] > flops[6]
    # offspring are children of the selected population and new
    plan = study.strategy.shared_state().plan(study.optuna_study, 1)
    assert len(plan.population) == 3 and len(plan.offspring) == 2
    assert set(plan.offspring).isdisjoint(str(t.architecture) for t in trials[:3])
    assert [str(t.architecture) for t in trials[3:5]] == list(plan.offspring)
    # each trial's metrics are the estimator's declared ones
    for t in trials:
        assert set(t.user_attrs["metrics"]) == set(study.estimator.provides)

    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name(study.name) or client.search_experiments()[-1]
    runs = client.search_runs([exp.experiment_id])
    parents = [r for r in runs if r.data.tags.get("frugalnas.role") == "study"]
    children = [r for r in runs if r.data.tags.get("mlflow.parentRunId")]
    assert len(parents) == 1 and len(children) == 7
    parent = parents[0].info.run_id
    for name in ("sievo_population_mean", "sievo_population_max", "sievo_best_so_far",
                 "sievo_store_params"):
        steps = [m.step for m in client.get_metric_history(parent, name)]
        assert sorted(set(steps)) == [0, 1, 2], name
    best = client.get_metric_history(parent, "sievo_best_so_far")
    # re-scored parents count too, so the curve is at least the best trial
    assert max(m.value for m in best) >= study.best_value - 1e-6
    assert [m.value for m in sorted(best, key=lambda m: m.step)] == sorted(m.value for m in best)

    # the winner retrains from scratch with the train estimator
    result = retrain(study, epochs=0.2)
    assert result.cost.epochs == pytest.approx(0.2, abs=0.05) and 0 <= result.value <= 100


@pytest.mark.slow
def test_resume_keeps_the_trained_store(tmp_path):
    storage = f"sqlite:///{tmp_path}/optuna.db"
    study = _study(storage, "sievo-resume")
    study.optimize(4)  # generation 0 and the first trial of generation 1
    path = checkpoint_path(study.optuna_study)
    assert path.parent == tmp_path / "optuna-sievo" and path.exists()
    saved = _saved(path)
    assert saved["meta"]["generation"] == 1
    first_store = weight_store_of(study)

    resumed = frugalnas.load_study(study_name="sievo-resume", storage=storage)
    store = weight_store_of(resumed)
    assert store is not first_store and len(store) == len(saved["keys"])
    state = store.state_dict()
    assert state.keys() == saved["state"].keys()
    for name, tensor in saved["state"].items():
        assert torch.equal(state[name], tensor)
    # the last trial of generation 1 needs no training; generation 2 trains from the loaded weights
    resumed.optimize(2)
    trials = resumed.completed_trials()
    assert [t.user_attrs["metrics"]["generation"] for t in trials] == [0, 0, 0, 1, 1, 2]
    assert trials[4].user_attrs["cost"]["epochs"] == 0
    assert trials[5].user_attrs["cost"]["epochs"] > 0
    after = _saved(path)
    assert after["meta"]["generation"] == 2
    changed = [n for n, t in saved["state"].items() if not torch.equal(after["state"][n], t)]
    assert changed  # trained further, starting from the checkpoint


def test_inherited_scores_follow_training(tmp_path):
    """Candidates scored after more sampled training are scored with the trained weights:
    a population member's inherited accuracy rises well above chance."""
    study = _study(None, "sievo-learn", batches_per_generation=25, generations=1)
    study.optimize(10)
    rescored = study.strategy.shared_state().rescores(study.optuna_study, 1)
    assert max(rescored) > 30.0  # 10 classes: chance is 10%


def test_flops_of_a_candidate_equal_counting_the_whole_network():
    from frugalnas.ports.cost import count_flops
    from frugalnas.sievo.session import SievoSession
    import random as _random

    study = _study(None, "sievo-flops")
    context = study.context()
    session = SievoSession(study.space, context.dataset, None)
    rng = _random.Random(0)
    for _ in range(4):
        arch = study.space.sample(rng)
        x = context.dataset.train_x
        assert session.flops_per_sample(arch, x) == count_flops(session.network(arch), x[:2]) / 2


def test_counting_flops_neither_adds_to_nor_calls_the_store():
    """The input shapes come from a probe network of its own on the CPU: counting one
    candidate's FLOPs creates only that candidate's store modules (a store module that sits
    on an accelerator is never mixed with a CPU one in the probe)."""
    from frugalnas.sievo.session import SievoSession
    import random as _random

    study = _study(None, "sievo-flops-store")
    context = study.context()
    session = SievoSession(study.space, context.dataset, None)
    arch = study.space.sample(_random.Random(5))
    state = torch.get_rng_state()
    session.flops_per_sample(arch, context.dataset.train_x)
    assert torch.equal(torch.get_rng_state(), state)
    assert set(session.store.keys()) == set(session.macro.arch_keys(arch))


def test_warmup_trains_every_node_and_is_charged(tmp_path):
    """The warm-up trains uniformly drawn candidates on the whole store before generation 0;
    its steps count in the first trial's cost, and scoring recalibrates batch norm."""
    study = _study(None, "sievo-warm", warmup_batches=6, generations=0)
    study.optimize(3)
    store = weight_store_of(study)
    space = study.space
    macro = space.macro(10, (1, 8, 8), shared=True)
    assert len(store) == len(macro.all_keys())  # every key created, so every key can train
    trials = study.completed_trials()
    batches = 6 + STRATEGY["batches_per_generation"]
    samples = batches * STRATEGY["batch_size"]
    train_size = len(study.load_dataset().train_x)
    assert trials[0].user_attrs["cost"]["epochs"] * train_size == pytest.approx(samples, rel=0.01)
    assert trials[1].user_attrs["cost"]["epochs"] == 0
    assert study.estimator.bn_recalibration_batches == 2


def test_a_checkpoint_of_the_old_weight_store_layout_is_migrated(tmp_path):
    """Files written before the session held a Supernet (a bare WeightStore checkpoint) load,
    generation included, and the next save writes the Supernet layout."""
    import random as _random

    from frugalnas.sievo.session import SievoSession
    from frugalnas.spaces.dag.space import DagNetwork
    from frugalnas.nn.weight_store import WeightStore

    study = _study(None, "sievo-migrate")
    data = study.load_dataset()
    old = WeightStore(study.space.macro(data.num_classes, data.input_shape, shared=True).make)
    DagNetwork(study.space, study.space.sample(_random.Random(4)), old.get)  # creates its keys
    with torch.no_grad():  # away from the initial weights, so loading them is visible
        for p in old.parameters():
            p.add_(0.5)
    path = tmp_path / "old.sievo.pt"
    old.save(path, generation=3)

    session = SievoSession(study.space, data, path)
    assert session.trained_generation == 3 and len(session.store) == len(old)
    loaded = session.store.state_dict()
    assert all(torch.equal(loaded[name], t) for name, t in old.state_dict().items())
    session.save(study="sievo-migrate")
    saved = _saved(path)
    assert saved["meta"]["generation"] == 3 and len(saved["keys"]) == len(old)
    assert SievoSession(study.space, data, path).trained_generation == 3


def test_a_checkpoint_of_another_supernet_is_refused(tmp_path):
    from frugalnas.ports.errors import ConfigError
    from frugalnas.sievo.session import SievoSession

    study = _study(None, "sievo-other")
    data = study.load_dataset()
    path = tmp_path / "s.sievo.pt"
    SievoSession(study.space, data, path, seed=0).save()
    with pytest.raises(ConfigError, match=r"holds the weights of another supernet \(differing: "
                                          r"seed\); delete the file or give the estimator "
                                          "another checkpoint_dir"):
        SievoSession(study.space, data, path, seed=1)
