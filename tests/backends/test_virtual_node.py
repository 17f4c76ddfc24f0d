"""Virtual-node backend: hardware-independent training with real gloo worker processes."""

from __future__ import annotations

import threading

import pytest
import torch
from torch import nn

import frugalnas
from frugalnas.ports.errors import ConfigError, TrialFailure
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
from frugalnas.backends.virtual_node.engine import num_threads
from frugalnas.backends.virtual_node.plan import shares_from_speed, split_sizes, vn_seed

STEPS, BATCH, V = 20, 32, 8


def small_net(dropout: float = 0.3) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(
        nn.Conv2d(1, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.Conv2d(6, 6, 3, padding=1), nn.BatchNorm2d(6), nn.ReLU(),
        nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(dropout), nn.Linear(6, 10))


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 + step)
    return torch.randn(BATCH, 1, 8, 8, generator=g), torch.randint(0, 10, (BATCH,), generator=g)


def train_steps(backend, model: nn.Module, opt: torch.optim.Optimizer, steps: range) -> list[float]:
    loss_fn = nn.CrossEntropyLoss()
    return [backend.train_step(model, opt, loss_fn, *batch(s), s) for s in steps]


def run(steps: range = range(STEPS), state: dict | None = None, **options) -> tuple[dict, list[float]]:
    """Train ``small_net`` for ``steps`` under a fresh backend, optionally resuming ``state``."""
    backend = VirtualNodeBackend(virtual_nodes=V, device="cpu", **options)
    try:
        model = backend.prepare(small_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        if state is not None:
            model.load_state_dict(state["model"])
            opt.load_state_dict(state["opt"])
        losses = train_steps(backend, model, opt, steps)
        return {"model": model.state_dict(), "opt": opt.state_dict()}, losses
    finally:
        backend.close()


def assert_bitwise(a: dict, b: dict) -> None:
    assert a.keys() == b.keys()
    for k in a:
        assert torch.equal(a[k], b[k]), f"{k} differs"


@pytest.fixture(scope="module")
def reference():
    """The one-process run every multi-process run must reproduce bit for bit."""
    return run()


@pytest.fixture(scope="module")
def even_two():
    """Two processes, even split (shared by two tests to save a launch)."""
    return run(nproc=2)


def test_plan_helpers():
    assert split_sizes(10, 4) == [3, 3, 2, 2]
    assert split_sizes(3, 5) == [1, 1, 1, 0, 0]
    assert shares_from_speed(8, [3.0, 1.0]) == [6, 2]
    assert shares_from_speed(8, [1.0, 1.0, 1.0]) == [3, 3, 2]
    assert sum(shares_from_speed(7, [0.3, 2.0, 0.9])) == 7
    seeds = {vn_seed(0, s, v) for s in range(50) for v in range(8)}
    assert len(seeds) == 400 and vn_seed(1, 0, 0) != vn_seed(0, 0, 0)


def test_bad_options_raise_config_error():
    with pytest.raises(ConfigError, match="virtual_nodes"):
        VirtualNodeBackend(virtual_nodes=0)
    with pytest.raises(ConfigError, match="sum to 7"):
        VirtualNodeBackend(virtual_nodes=8, nproc=2, shares=[4, 3])
    assert VirtualNodeBackend(virtual_nodes=8, nproc=2, shares="5,3").shares == [5, 3]
    with pytest.raises(ConfigError, match="throughput"):
        VirtualNodeBackend(virtual_nodes=8, throughput="fast")
    with pytest.raises(ConfigError, match="inner"):
        VirtualNodeBackend(inner="virtual-node")


def test_one_node_matches_single_device_training():
    """V=1 is ordinary training (up to the batch-norm variance formula, hence allclose)."""
    ref_model = small_net(dropout=0.0)
    single = SingleDeviceBackend("cpu")
    opt = torch.optim.SGD(ref_model.parameters(), lr=0.1, momentum=0.9)
    with num_threads(1):
        train_steps(single, ref_model, opt, range(5))
    vn = VirtualNodeBackend(virtual_nodes=1, device="cpu")
    model = vn.prepare(small_net(dropout=0.0))
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    train_steps(vn, model, opt, range(5))
    for (k, a), b in zip(ref_model.state_dict().items(), model.state_dict().values()):
        assert torch.allclose(a.float(), b.float(), rtol=1e-4, atol=1e-5), k


def test_virtual_nodes_give_the_full_batch_gradient():
    """Without batch norm or dropout, V nodes accumulate to the full-batch mean gradient."""
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.Tanh(), nn.Linear(16, 10))
    x, y = batch(0)
    nn.CrossEntropyLoss()(model(x), y).backward()
    full = [p.grad.clone() for p in model.parameters()]
    vn = VirtualNodeBackend(virtual_nodes=5, device="cpu")
    model.zero_grad()
    loss = vn.engine.compute(model, nn.CrossEntropyLoss(), x, y, step=0)
    with torch.no_grad():
        assert loss == pytest.approx(float(nn.CrossEntropyLoss()(model(x), y)), rel=1e-5)
    for g, p in zip(full, model.parameters()):
        assert torch.allclose(g, p.grad, atol=1e-6)


def test_batchnorm_running_stats_follow_node_order():
    """Running estimates equal sequential momentum updates with each node's own statistics."""
    bn = nn.BatchNorm2d(3, momentum=0.2)
    model = nn.Sequential(bn, nn.Flatten(), nn.Linear(3 * 8 * 8, 10))
    bn.running_mean.fill_(0.5)
    x = torch.randn(12, 3, 8, 8) * 2 + 1
    y = torch.randint(0, 10, (12,))
    vn = VirtualNodeBackend(virtual_nodes=3, device="cpu")
    vn.engine.compute(model, nn.CrossEntropyLoss(), x, y, step=0)
    mean, var = torch.full((3,), 0.5), torch.ones(3)
    for chunk in x.split(4):
        mean = 0.8 * mean + 0.2 * chunk.mean(dim=(0, 2, 3))
        var = 0.8 * var + 0.2 * chunk.var(dim=(0, 2, 3), unbiased=True)
    assert torch.allclose(bn.running_mean, mean, atol=1e-6)
    assert torch.allclose(bn.running_var, var, atol=1e-6)
    assert int(bn.num_batches_tracked) == 3


def test_dropout_masks_depend_on_step_and_node_only():
    """Same (step, node) -> same mask wherever it runs; a different step -> a different one."""
    vn = VirtualNodeBackend(virtual_nodes=2, device="cpu")
    model = nn.Sequential(nn.Flatten(), nn.Dropout(0.5), nn.Linear(64, 10))
    x, y = batch(0)
    grads = []
    for step in (3, 3, 4):
        model.zero_grad()
        vn.engine.compute(model, nn.CrossEntropyLoss(), x, y, step=step)
        grads.append(model[2].weight.grad.clone())
    assert torch.equal(grads[0], grads[1])
    assert not torch.equal(grads[0], grads[2])


@pytest.mark.slow
def test_worlds_of_1_2_4_processes_are_bitwise_equal(reference, even_two):
    four, losses4 = run(nproc=4)
    for state, losses in (even_two, (four, losses4)):
        assert_bitwise(reference[0]["model"], state["model"])
        assert losses == reference[1]
    assert reference[0]["model"]["1.num_batches_tracked"] == STEPS * V


@pytest.mark.slow
def test_elastic_resize_2_4_1_is_bitwise_equal(reference, tmp_path):
    state, _ = run(range(0, 7), nproc=2)
    torch.save(state, tmp_path / "ckpt.pt")  # checkpoint at a step boundary, then relaunch
    state, _ = run(range(7, 14), state=torch.load(tmp_path / "ckpt.pt"), nproc=4)
    state, _ = run(range(14, STEPS), state=state, nproc=1)
    assert_bitwise(reference[0]["model"], state["model"])


@pytest.mark.slow
def test_heterogeneous_shares_equal_an_even_split(reference, even_two):
    uneven, _ = run(nproc=2, shares=[5, 3])
    assert_bitwise(even_two[0]["model"], uneven["model"])
    assert_bitwise(reference[0]["model"], uneven["model"])


@pytest.mark.slow
def test_measured_throughput_split_and_failures(reference):
    backend = VirtualNodeBackend(virtual_nodes=V, nproc=2, throughput="measure", device="cpu")
    try:
        model = backend.prepare(small_net())
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        train_steps(backend, model, opt, range(STEPS))
        shares = backend.describe()["shares"]
        assert sum(shares) == V and len(shares) == 2
        assert_bitwise(reference[0]["model"], model.state_dict())

        class Broken(nn.Module):
            def __init__(self):
                super().__init__()
                self.lin = nn.Linear(64, 10)

            def forward(self, x):
                raise RuntimeError("boom")

        lock = threading.Lock()

        def unpicklable_loss(out, y):
            with lock:
                return nn.functional.cross_entropy(out, y)

        with pytest.raises(ConfigError, match="picklable"):
            backend.train_step(model, opt, unpicklable_loss, *batch(0), 0)
        broken = backend.prepare(Broken())
        with pytest.raises(TrialFailure, match="failed"):
            backend.train_step(broken, torch.optim.SGD(broken.parameters(), lr=0.1),
                               nn.CrossEntropyLoss(), *batch(0), 0)
        # the workers survive a failed trial and take the next model
        model2 = backend.prepare(small_net())
        opt2 = torch.optim.SGD(model2.parameters(), lr=0.1, momentum=0.9, weight_decay=1e-4)
        assert train_steps(backend, model2, opt2, range(2)) == reference[1][:2]
    finally:
        backend.close()
    assert backend._world is None or not backend._world.running


@pytest.mark.slow
def test_study_trial_end_to_end_on_digits():
    def study(nproc: int):
        return frugalnas.create_study(
            space="nb201", strategy="random", estimator="train", dataset="digits", seed=3,
            space_options={"N": 1, "C": 4}, estimator_options={"epochs": 1, "max_steps": 6},
            backend="virtual-node", backend_options={"virtual_nodes": 4, "nproc": nproc},
            disable_plugins=["mlflow"])

    two = study(2)
    two.optimize(1)
    assert two.trials[0].state.name == "COMPLETE"
    assert two.backend.describe()["world_size"] == 2
    assert not two.backend._world.running  # released when the study finished
    one = study(1)
    one.optimize(1)
    assert two.trials[0].value == one.trials[0].value
    assert two.trials[0].params == one.trials[0].params
