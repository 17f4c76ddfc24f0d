"""The out-of-core backend on real models: gradients equal in-core, budget held, plans chosen."""

from __future__ import annotations

import copy
import io
import math
import random
import warnings

import pytest
import torch
from torch import nn

from frugalnas.ports.errors import ConfigError
from frugalnas.backends.out_of_core.backend import OutOfCoreBackend, find_blocks
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.spaces.nb201.space import NB201Space

CELL = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"
LOSS = nn.CrossEntropyLoss()


pytestmark = pytest.mark.usefixtures("one_thread")


def nb201(N: int = 1, C: int = 4) -> nn.Module:
    torch.manual_seed(0)
    space = NB201Space(N=N, C=C)
    return space.build(space.parse(CELL), 10, (1, 8, 8))


def batch(n: int = 8, shape: tuple[int, ...] = (1, 8, 8)) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1)
    return torch.randn(n, *shape, generator=g), torch.randint(0, 10, (n,), generator=g)


def in_core(model: nn.Module, x: torch.Tensor, y: torch.Tensor, steps: int = 1) -> nn.Module:
    ref = copy.deepcopy(model)
    backend = SingleDeviceBackend("cpu")
    for _ in range(steps):
        backend.forward_backward(ref, LOSS, x, y)
    return ref


def out_of_core(model: nn.Module, x, y, steps: int = 1, **options) -> tuple[nn.Module, OutOfCoreBackend]:
    m = copy.deepcopy(model)
    options.setdefault("profile_repeats", 0)
    backend = OutOfCoreBackend(device="cpu", **options)
    m = backend.prepare(m)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        for _ in range(steps):
            backend.forward_backward(m, LOSS, x, y)
    return m, backend


def assert_same_training_state(a: nn.Module, b: nn.Module) -> None:
    for (name, p), q in zip(a.named_parameters(), b.parameters()):
        assert torch.equal(p.grad, q.grad), f"gradient of {name} differs"
    for (name, p), q in zip(a.named_buffers(), b.buffers()):
        assert torch.equal(p, q), f"buffer {name} differs"


@pytest.mark.parametrize("policy", ["resident", "swap", "recompute", "plan"])
def test_nb201_gradients_and_bn_stats_equal_in_core_bitwise(policy):
    model = nb201()
    x, y = batch()
    ref = in_core(model, x, y, steps=2)
    m, backend = out_of_core(model, x, y, steps=2, policy=policy, budget_fraction=0.5)
    assert_same_training_state(m, ref)
    assert backend.last_plan is not None
    if policy != "plan":
        assert backend.last_plan.policies == [policy] * len(find_blocks(model))


def test_generic_sequential_and_dag_network_gradients_equal():
    torch.manual_seed(0)
    seq = nn.Sequential(nn.Conv2d(1, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(),
                        nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(), nn.Flatten(), nn.Linear(8 * 64, 10))
    x, y = batch()
    for policy in ("swap", "recompute"):
        m, backend = out_of_core(seq, x, y, policy=policy)
        assert len(backend.last_plan.policies) == 7
        assert_same_training_state(m, in_core(seq, x, y))

    from frugalnas.spaces.dag.space import DagSpace

    space = DagSpace(channels=4)
    torch.manual_seed(0)
    dag = space.build(space.sample(random.Random(3)), 10, (1, 8, 8))
    assert len(find_blocks(dag)) == 1 + len(dag.cells)
    ref = in_core(dag, x, y)
    for policy in ("swap", "recompute"):
        m, _ = out_of_core(dag, x, y, policy=policy)
        for p, q in zip(m.parameters(), ref.parameters()):
            torch.testing.assert_close(p.grad, q.grad, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("fraction", [0.35, 0.6])
def test_saved_bytes_on_device_stay_under_budget(fraction):
    model = nb201(N=2, C=4)
    x, y = batch()
    m, backend = out_of_core(model, x, y, steps=2, budget_fraction=fraction)
    plan = backend.last_plan
    assert plan.feasible, plan.table()
    assert plan.budget == int(fraction * plan.profile.incore_peak)
    assert 0 < backend.max_step_peak <= plan.budget
    assert backend.max_step_peak <= plan.peak          # the model is an upper bound
    assert set(plan.policies) != {"resident"}
    assert_same_training_state(m, in_core(model, x, y, steps=2))
    # the in-core run of the same model holds more than the budget
    _, resident = out_of_core(model, x, y, policy="resident")
    assert resident.max_step_peak > plan.budget


def test_all_resident_when_budget_allows_and_plan_is_cached():
    model = nb201()
    x, y = batch()
    m, backend = out_of_core(model, x, y, steps=2, budget=1 << 40)
    assert backend.last_plan.policies == ["resident"] * len(find_blocks(model))
    assert backend.profiles_run == 1
    other = backend.prepare(copy.deepcopy(nb201()))   # same architecture: no new profile
    backend.forward_backward(other, LOSS, x, y)
    assert backend.profiles_run == 1
    backend.forward_backward(other, LOSS, *batch(4))  # new micro-batch shape: new profile
    assert backend.profiles_run == 2
    table = backend.plan_table()
    assert "stem" in table and "choice" in table and "cells.0" in table
    assert backend.describe()["plan_feasible"] is True


class Heavy(nn.Module):
    """Much compute, few saved bytes: swapping beats recomputing."""

    def __init__(self):
        super().__init__()
        self.net = nn.Sequential(nn.Conv2d(16, 128, 3, padding=1), nn.ReLU(),
                                 nn.Conv2d(128, 128, 7, padding=3), nn.ReLU(),
                                 nn.Conv2d(128, 16, 3, padding=1))

    def forward(self, x):
        return self.net(x)


class Cheap(nn.Module):
    """Many saved bytes from cheap elementwise work: recomputing beats swapping."""

    def forward(self, x):
        y = x.repeat(1, 16, 1, 1)
        y = torch.tanh(torch.sin(y) * y)
        return y.reshape(x.shape[0], 16, 16, 8, 8).mean(1)


def test_real_model_gets_a_mix_where_swap_and_recompute_costs_differ():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(16, 16, 1), Cheap(), Heavy(), Cheap(), nn.Flatten(),
                          nn.Linear(16 * 64, 10))
    x, y = batch(8, (16, 8, 8))
    _, probe = out_of_core(model, x, y, profile_repeats=3)
    prof = probe.last_plan.profile      # bytes are exact; times are measured again below
    # The host link (bytes/s) between the two blocks' break-even points, so that the heavy
    # block recomputes dearer than it swaps and the cheap one the reverse on a machine of
    # any speed: the heavy one's round trip costs 2 * saved / bw against its forward time.
    cheap0, heavy0 = prof.blocks[1], prof.blocks[2]
    bw = math.sqrt((2 * heavy0.saved / heavy0.fwd) * (2 * cheap0.saved / cheap0.fwd))
    # room for one block's working set plus the inputs: the middle blocks cannot stay
    # resident while the last one runs its backward
    budget = prof.fixed + max(b.saved + b.input for b in prof.blocks) + sum(b.input for b in prof.blocks)
    for _attempt in range(3):           # timings on a busy machine are noisy: re-measure
        m, backend = out_of_core(model, x, y, steps=2, budget=budget, host_bandwidth=bw,
                                 profile_repeats=3)
        plan = backend.last_plan
        cheap, heavy = plan.profile.blocks[1], plan.profile.blocks[2]
        if (heavy.fwd > 1.5 * 2 * heavy.saved / bw          # recompute dearer than a round trip
                and cheap.fwd < 0.5 * 2 * cheap.saved / bw):  # and the other way round
            break
    else:
        pytest.fail("the measured costs never differed as constructed:\n" + plan.table())
    assert plan.policies[1:3] == ["recompute", "swap"], plan.table()
    assert backend.max_step_peak <= budget
    assert_same_training_state(m, in_core(model, x, y, steps=2))


@pytest.mark.slow
def test_virtual_nodes_over_out_of_core_match_virtual_nodes_in_core():
    from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
    from frugalnas.host.plugins import PluginHost

    model = nb201()
    x, y = batch(8)
    grads = []
    for inner, opts in (("single-device", {}), ("out-of-core", {"budget_fraction": 0.5, "profile_repeats": 0})):
        backend = VirtualNodeBackend(virtual_nodes=2, inner=inner, inner_options=opts, device="cpu",
                                     host=PluginHost())
        m = backend.prepare(copy.deepcopy(model))
        opt = torch.optim.SGD(m.parameters(), lr=0.0)
        backend.train_step(m, opt, LOSS, x, y, step=0)
        grads.append([p.grad.clone() for p in m.parameters()])
        if inner == "out-of-core":
            plan = backend.inner.last_plan
            assert plan is not None and plan.budget is not None
            assert "(4, 1, 8, 8)" in next(iter(backend.inner._plans))   # planned per micro-batch
        backend.close()
    for a, b in zip(*grads):
        assert torch.equal(a, b)


def test_prepared_model_pickles_copies_and_predicts():
    model = nb201()
    x, y = batch()
    m, backend = out_of_core(model, x, y, policy="swap")
    buf = io.BytesIO()
    torch.save(m, buf)
    loaded = torch.load(io.BytesIO(buf.getvalue()), weights_only=False)
    twin = copy.deepcopy(m)
    for clone in (loaded, twin):
        assert set(clone.state_dict()) == set(model.state_dict())
        torch.testing.assert_close(backend.predict(clone, x), backend.predict(m, x))
    backend.close()
    assert "forward" not in m.stem.__dict__


def test_study_trains_through_out_of_core():
    import frugalnas

    study = frugalnas.create_study(space="nb201", strategy="random", estimator="train", dataset="digits",
                                   backend="out-of-core", space_options={"N": 1, "C": 4},
                                   backend_options={"budget_fraction": 0.5, "profile_repeats": 0},
                                   estimator_options={"epochs": 1, "max_steps": 2}, disable_plugins=["mlflow"], seed=0)
    study.optimize(1)
    assert study.completed_trials and study.backend.last_plan is not None
    assert 0 < study.backend.peak_memory() <= study.backend.last_plan.budget


@pytest.mark.parametrize("options", [{"policy": "disk"}, {"planner": "dp"}, {"budget": -1},
                                     {"budget": 10, "budget_fraction": 0.5}, {"budget_fraction": -0.1}])
def test_bad_options_name_the_value(options):
    with pytest.raises(ConfigError) as err:
        OutOfCoreBackend(device="cpu", **options)
    assert str(next(iter(options.values()))) in str(err.value)
