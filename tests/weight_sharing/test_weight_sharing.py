"""Weight sharing: supernet views share tensors, few-shot splits partition the space, SPOS
training and the ``supernet`` estimator (with a resumable checkpoint), and DARTS."""

from __future__ import annotations

import random
from collections import Counter

import numpy as np
import pytest
import torch

from frugalnas.ports.capabilities import DartsRelaxation, capability
import frugalnas
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.keys import METRICS_ATTR
from frugalnas.engine.training import TrainConfig
from frugalnas.datasets.images import digits
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.weight_sharing import FewShotSplit, Supernet, darts_search

SPACE = NB201Space(N=1, C=4)
SHAPE = (1, 8, 8)


def cell(text: str):
    return SPACE.parse(text)


A = cell("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|")
B = cell("|nor_conv_3x3~0|+|nor_conv_1x1~0|nor_conv_3x3~1|+|none~0|nor_conv_1x1~1|nor_conv_3x3~2|")


def pointers(module: torch.nn.Module) -> set[int]:
    return {p.data_ptr() for p in module.parameters()}


def test_subnets_are_views_of_the_supernet():
    supernet = Supernet(SPACE, 10, SHAPE)
    store = pointers(supernet.stores[0])
    a, b = supernet.subnet(A), supernet.subnet(B)
    assert pointers(a) <= store and pointers(b) <= store
    # Both use nor_conv_3x3 on edge 1<-0 of every cell: the very same tensors.
    conv_a = a.cells[0].edges["edge_1_0"][1].weight
    conv_b = b.cells[0].edges["edge_1_0"][1].weight
    assert conv_a is conv_b
    # A step on one candidate moves the supernet that the other reads.
    before = conv_b.detach().clone()
    opt = torch.optim.SGD(a.parameters(), lr=0.1)
    a(torch.randn(4, *SHAPE)).sum().backward()
    opt.step()
    assert not torch.equal(before, conv_b.detach())
    # A different operation on the same edge is a different module.
    assert b.cells[0].edges["edge_2_0"] is not a.cells[0].edges["edge_2_0"]


def test_sharing_across_inputs_shares_one_module_per_operation_and_node():
    per_position = Supernet(SPACE, 10, SHAPE, sharing="operation")
    across = Supernet(SPACE, 10, SHAPE, sharing="operation-across-inputs")
    assert across.num_parameters() < per_position.num_parameters()
    net = across.subnet(cell("|none~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|none~0|none~1|none~2|"))
    assert net.cells[0].edges["edge_2_0"] is net.cells[0].edges["edge_2_1"]
    with pytest.raises(ConfigError, match="'per-layer'"):
        Supernet(SPACE, 10, SHAPE, sharing="per-layer")


@pytest.mark.parametrize("groups, sizes", [(5, [3125] * 5), (2, [9375, 6250]), (1, [15625])])
def test_a_few_shot_split_partitions_the_space(groups, sizes):
    split = FewShotSplit.create(SPACE, ["edge_1_0"], groups)
    counts = Counter(split.group_of(arch, SPACE) for arch in SPACE.enumerate())
    assert [counts[g] for g in range(groups)] == sizes


def test_few_shot_sub_supernets_start_equal_and_own_their_tensors():
    supernet = Supernet(SPACE, 10, SHAPE, few_shot=FewShotSplit.create(SPACE, "edge_1_0", 5))
    supernet.split_now()
    assert len(supernet.stores) == 5
    a, b = supernet.subnet(A), supernet.subnet(B)  # same edge_1_0 op: same sub-supernet
    assert supernet.store_for(A) is supernet.store_for(B)
    other = cell("|skip_connect~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|")
    c = supernet.subnet(other)
    assert not (pointers(a) & pointers(c))
    # The copy keeps the one-shot weights: the same operation starts from the same values.
    assert torch.equal(a.cells[0].edges["edge_2_0"][1].weight, c.cells[0].edges["edge_2_0"][1].weight)
    with pytest.raises(ConfigError, match="'edge_9_0'"):
        FewShotSplit.create(SPACE, ["edge_9_0"], 2)
    with pytest.raises(ConfigError, match="few_shot_groups 7"):
        FewShotSplit.create(SPACE, ["edge_1_0"], 7)


def test_spos_training_lowers_the_loss_and_scores_with_recalibrated_batch_norm():
    data = digits(seed=0).subset(0.5)
    supernet = Supernet(SPACE, data.num_classes, data.input_shape, seed=0)
    backend = SingleDeviceBackend()
    untrained = supernet.accuracy(A, data, backend)
    history = supernet.train(data, backend, TrainConfig(batch_size=32, lr=0.05), epochs=3)
    assert history.one_shot_epochs == 3 and history.losses[-1] < history.losses[0]
    trained = supernet.accuracy(A, data, backend)
    assert trained > untrained + 5
    assert supernet.accuracy(A, data, backend) == trained  # recalibration is deterministic


def test_supernet_estimator_trains_once_and_a_resumed_study_keeps_the_supernet(tmp_path):
    storage = f"sqlite:///{tmp_path / 'ws.db'}"
    options = dict(space="nb201", space_options={"N": 1, "C": 4}, dataset="digits",
                   dataset_options={"valid_fraction": 0.2, "test_fraction": 0.5},
                   strategy="regularized-evolution", strategy_options={"n_init": 3},
                   estimator="supernet", estimator_options={"epochs": 2}, seed=0,
                   storage=storage, study_name="ws", disable_plugins=["mlflow"])
    study = frugalnas.create_study(**options)
    study.optimize(n_trials=4)
    done = study.completed_trials()
    assert len(done) == 4 and all(t.user_attrs[METRICS_ATTR]["supernet_epochs"] == 2 for t in done)
    checkpoints = list(tmp_path.glob("ws.db.ws.*.supernet.pt"))
    assert len(checkpoints) == 1
    first = study.estimator.supernet_
    # A new process would open the study and load, not retrain, the supernet.
    again = frugalnas.create_study(**options, load_if_exists=True)
    again.optimize(n_trials=1)
    second = again.estimator.supernet_
    assert second is not first and second.history.losses == first.history.losses
    # Parameters are the trained ones (batch-norm buffers are recalibrated per candidate).
    for (k1, v1), (k2, v2) in zip(first.stores[0].named_parameters(),
                                  second.stores[0].named_parameters()):
        assert k1 == k2 and torch.equal(v1, v2)
    arch = done[0].architecture
    assert again.evaluate(arch).value == pytest.approx(done[0].value)


def test_hybrid_scoring_ranks_inherited_accuracy_and_proxies_within_the_study():
    study = frugalnas.create_study(
        space="nb201", space_options={"N": 1, "C": 4}, dataset="digits",
        dataset_options={"valid_fraction": 0.2, "test_fraction": 0.5}, strategy="random",
        estimator="supernet", estimator_options={
            "epochs": 1, "hybrid_proxies": ["naswot", "params"], "hybrid_weight": 0.75},
        seed=0, disable_plugins=["mlflow"])
    study.optimize(n_trials=5)
    done = study.completed_trials()
    assert len(done) == 5
    metrics = [t.user_attrs[METRICS_ATTR] for t in done]
    assert [m["population"] for m in metrics] == [1, 2, 3, 4, 5]
    # Each value is the trial's standing among the trials so far: recompute the last one.
    from frugalnas.proxies.ensemble import rank_average

    acc = [m["valid_accuracy"] for m in metrics]
    ensemble = rank_average(np.array([[m["proxy_naswot"], m["proxy_params"]] for m in metrics]))
    expected = rank_average(np.column_stack([acc, ensemble]), [0.75, 0.25])[-1]
    assert done[-1].value == pytest.approx(expected)
    assert all(0.0 <= t.value <= 1.0 for t in done)
    with pytest.raises(ConfigError, match="hybrid_weight"):
        frugalnas.create_study(space="nb201", dataset="digits", estimator="supernet",
                               estimator_options={"hybrid_proxies": ["naswot"],
                                                  "hybrid_weight": 1.5},
                               disable_plugins=["mlflow"])


def test_supernet_estimator_scores_fine_tuned_copies_when_asked():
    study = frugalnas.create_study(
        space="nb201", space_options={"N": 1, "C": 4}, dataset="digits",
        dataset_options={"valid_fraction": 0.2, "test_fraction": 0.5}, strategy="random",
        estimator="supernet", estimator_options={"epochs": 1, "finetune_steps": 5}, seed=0,
        disable_plugins=["mlflow"])
    study.optimize(n_trials=2)
    supernet, data = study.estimator.supernet_, study.load_dataset()
    for t in study.completed_trials():
        tuned = supernet.accuracy(t.architecture, data, SingleDeviceBackend(), batch_size=64,
                                  finetune_steps=5, finetune=study.estimator.config)
        assert t.value == pytest.approx(tuned)
    with pytest.raises(ConfigError, match="finetune_steps"):
        frugalnas.create_study(space="nb201", dataset="digits", estimator="supernet",
                               estimator_options={"finetune_steps": -1},
                               disable_plugins=["mlflow"])


def test_darts_returns_a_valid_architecture_read_off_the_mixing_weights():
    data = digits(seed=0).subset(0.1)
    result = darts_search(SPACE, data, SingleDeviceBackend(), epochs=2, batch_size=32, seed=0)
    SPACE.validate(result.architecture)
    assert result.alphas.shape == (6, 5) and len(result.valid_accuracies) == 2
    assert not torch.equal(result.alphas, result.initial_alphas)  # the mixing weights learned
    assert result.architecture == SPACE.from_params(
        {k: SPACE.distributions()[k].choices[int(i)]
         for k, i in zip(SPACE.distributions(), result.alphas.argmax(1))})


def test_the_darts_strategy_proposes_its_choice_first_and_keeps_it_in_a_checkpoint(tmp_path):
    options = dict(space="nb201", space_options={"N": 1, "C": 4}, dataset="digits",
                   dataset_options={"valid_fraction": 0.3, "test_fraction": 0.6}, strategy="darts",
                   strategy_options={"epochs": 1, "batch_size": 32,
                                     "checkpoint": str(tmp_path / "darts.pt")},
                   # DARTS trains the small networks; the table scores its cells as in the
                   # benchmark network
                   estimator="nb201-table", estimator_options={"any_network": True}, seed=0,
                   disable_plugins=["mlflow"])
    study = frugalnas.create_study(**options)
    study.optimize(n_trials=3)
    archs = [t.architecture for t in study.trials]
    assert archs[0] == study.strategy.result.architecture
    assert len({a.key for a in archs}) == 3
    again = frugalnas.create_study(**options)  # a new study reads the search's result back
    again.optimize(n_trials=1)
    assert torch.equal(again.strategy.result.alphas, study.strategy.result.alphas)
    assert again.trials[0].architecture == archs[0]


def test_darts_refuses_a_space_it_cannot_relax():
    from optuna.distributions import CategoricalDistribution

    from frugalnas.ports.space import SearchSpace
    from frugalnas.weight_sharing.darts import DartsSampler

    class Uneven(SearchSpace):
        name = "uneven"

        def distributions(self):
            return {"width": CategoricalDistribution([8, 16]),
                    "depth": CategoricalDistribution([1, 2, 3])}

        def build(self, arch, num_classes, input_shape):
            return torch.nn.Linear(1, num_classes)

    with pytest.raises(ConfigError, match="same number of choices"):
        DartsSampler(Uneven())


def test_darts_on_the_dag_space_mixes_inputs_operations_and_attention():
    from frugalnas.host.plugins import PluginHost

    dag = PluginHost().create("search_spaces", "dag", nodes=2, channels=4, reductions=1)
    relaxation = capability(dag, DartsRelaxation)
    # One row per (cell, node, input) over the operations, one per (cell, node) for attention.
    assert relaxation.shape == (2 * (2 + 3) + 2 * 2, len(dag.ops))
    result = darts_search(dag, digits(seed=0).subset(0.1), SingleDeviceBackend(), epochs=1,
                          batch_size=32, seed=0)
    dag.validate(result.architecture)
    assert not torch.equal(result.alphas, result.initial_alphas)
    # Read-off by hand: each node keeps its two strongest inputs, each with its best operation.
    w = relaxation.weights(result.alphas)
    d = result.architecture.decisions
    for ctype in ("normal", "reduce"):
        for n in (2, 3):
            rows = {src: w[relaxation.index[("edge", ctype, n, src)]] for src in range(n)}
            best = sorted(rows, key=lambda s: -float(rows[s].max()))[:2]
            assert [d[f"{ctype}_node{n}_in0"], d[f"{ctype}_node{n}_in1"]] == best
            assert d[f"{ctype}_node{n}_op0"] == dag.ops[int(rows[best[0]].argmax())]
            off, on = w[relaxation.index[("se", ctype, n)], :2]
            assert d[f"{ctype}_node{n}_se"] == bool(on > off)
    # The masked attention columns carry no weight.
    assert float(w[relaxation.index[("se", "normal", 2)], 2:].sum()) == 0.0
    sampled = relaxation.sample(result.alphas, random.Random(0))
    dag.validate(sampled)


def test_darts_without_a_dataset_is_refused_before_any_trial():
    study = frugalnas.create_study(space="nb201", strategy="darts", estimator="nb201-table",
                                   dataset=None, disable_plugins=["mlflow"])
    with pytest.raises(ConfigError, match="has none"):
        study.optimize(n_trials=1)
    assert study.trials == []


def test_spaces_without_weight_sharing_say_so():
    from optuna.distributions import CategoricalDistribution

    from frugalnas.ports.space import SearchSpace

    class Plain(SearchSpace):
        name = "plain"

        def distributions(self):
            return {"width": CategoricalDistribution([8, 16])}

        def build(self, arch, num_classes, input_shape):
            return torch.nn.Linear(1, num_classes)

    with pytest.raises(ConfigError, match="needs a search space with weight sharing; "
                                          "search space 'plain' has none"):
        Supernet(Plain(), 10, SHAPE)


def test_the_dag_space_shares_weights_too():
    from frugalnas.host.plugins import PluginHost

    dag = PluginHost().create("search_spaces", "dag", nodes=2, channels=4, reductions=1)
    data = digits(seed=0).subset(0.15)
    per_position = Supernet(dag, 10, data.input_shape)
    across = Supernet(dag, 10, data.input_shape, sharing="operation-across-inputs")
    assert across.num_parameters() < per_position.num_parameters()
    rng = random.Random(0)
    a, b = dag.sample(rng), dag.sample(rng)
    store = pointers(per_position.stores[0])
    assert pointers(per_position.subnet(a)) <= store and pointers(per_position.subnet(b)) <= store
    history = per_position.train(data, SingleDeviceBackend(), TrainConfig(batch_size=32), epochs=1)
    assert history.one_shot_epochs == 1 and 0 <= per_position.accuracy(a, data, SingleDeviceBackend()) <= 100


@pytest.mark.parametrize("space_name", ["nb201", "dag"])
def test_inherited_accuracy_is_recalibrated_per_candidate_on_every_space(space_name):
    """On both spaces a candidate's logits come from statistics of the fixed training
    batches, not of the examples being scored (a subset scores as in the whole split), and
    scoring leaves the store's own statistics as they were."""
    from frugalnas.host.plugins import PluginHost
    from frugalnas.weight_sharing.batch_norm import calibration_batches, recalibrated

    space = (SPACE if space_name == "nb201" else
             PluginHost().create("search_spaces", "dag", nodes=2, channels=4, reductions=1))
    data = digits(seed=0).subset(0.3)
    supernet = Supernet(space, 10, data.input_shape, seed=0)
    backend = SingleDeviceBackend()
    supernet.train(data, backend, TrainConfig(batch_size=32, lr=0.05), epochs=1)
    arch = space.sample(random.Random(3))
    before = {k: v.clone() for k, v in supernet.stores[0].state_dict().items()}
    x, y = data.split("valid")
    model = supernet.subnet(arch)
    batches = calibration_batches(data, 4, 64, seed=supernet.seed + 1, epoch=0)
    with recalibrated(model, batches):
        whole = backend.predict(model, x)
        part = backend.predict(model, x[:5])
    assert torch.allclose(whole[:5], part, atol=1e-5)
    expected = float((whole.argmax(1) == y).float().mean() * 100)
    assert supernet.accuracy(arch, data, backend) == pytest.approx(expected)
    # Without recalibration the dag space normalises with the scored batch itself.
    if space_name == "dag":
        assert not torch.allclose(backend.predict(model, x)[:5], backend.predict(model, x[:5]),
                                  atol=1e-5)
    after = supernet.stores[0].state_dict()
    assert before.keys() == after.keys() and all(torch.equal(before[k], after[k]) for k in before)


def test_fine_tuned_scoring_trains_a_private_copy_and_leaves_the_supernet_unchanged():
    data = digits(seed=0).subset(0.5)
    supernet = Supernet(SPACE, data.num_classes, data.input_shape, seed=0)
    backend = SingleDeviceBackend()
    before = {k: v.clone() for k, v in supernet.stores[0].state_dict().items()}
    tuned = supernet.finetuned(A, data, backend, 30, TrainConfig(batch_size=32, lr=0.05))
    assert pointers(tuned).isdisjoint(pointers(supernet.stores[0]))
    assert all(torch.equal(v, before[k]) for k, v in supernet.stores[0].state_dict().items())
    inherited = supernet.accuracy(A, data, backend)
    scored = supernet.accuracy(A, data, backend, finetune_steps=30,
                               finetune=TrainConfig(batch_size=32, lr=0.05))
    assert scored > inherited + 10  # 30 steps from an untrained store learn digits
    assert scored == supernet.accuracy(A, data, backend, finetune_steps=30,
                                       finetune=TrainConfig(batch_size=32, lr=0.05))


def test_training_on_an_empty_training_split_is_refused_not_endless():
    import dataclasses

    data = digits(seed=0)
    empty = dataclasses.replace(data, train_x=data.train_x[:0], train_y=data.train_y[:0])
    supernet = Supernet(SPACE, data.num_classes, data.input_shape, seed=0)
    with pytest.raises(ConfigError, match="training split is empty"):
        supernet.accuracy(A, empty, SingleDeviceBackend(), finetune_steps=5)
