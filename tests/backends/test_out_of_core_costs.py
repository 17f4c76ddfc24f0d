"""The out-of-core cost model counts what it measured: on the CPU every block is profiled
under every policy, a plan's predicted step is the sum of its choices' measured costs plus
the backend's own per-step cost, the error against the timed steps is reported beside the
plan, and a budget no plan meets fails the trial before training, naming the least budget."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from frugalnas.backends.out_of_core.backend import OutOfCoreBackend
from frugalnas.backends.out_of_core.cost import BlockProfile, Profile, step_time
from frugalnas.backends.out_of_core.planner import make_plan
from frugalnas.ports.errors import TrialFailure
from frugalnas.spaces.nb201.space import NB201Space

MB = 1 << 20


def _network() -> tuple[nn.Module, torch.Tensor, torch.Tensor]:
    torch.manual_seed(0)
    space = NB201Space(N=1, C=4)
    net = space.build(space.parse(
        "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|"
        "skip_connect~2|"), 10, (3, 8, 8))
    return net, torch.randn(16, 3, 8, 8), torch.randint(0, 10, (16,))


def _steps(backend: OutOfCoreBackend, net: nn.Module, x, y, steps: int = 3) -> None:
    model = backend.prepare(net)
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        backend.forward_backward(model, nn.functional.cross_entropy, x, y)


def test_a_plan_under_a_budget_is_priced_from_every_policy_measured_and_reports_its_error():
    net, x, y = _network()
    backend = OutOfCoreBackend(device="cpu", budget_fraction=0.5, profile_repeats=1)
    _steps(backend, net, x, y)
    plan = backend.last_plan
    profile = plan.profile
    assert set(profile.measured) == {"resident", "swap", "recompute"}
    n = len(profile.blocks)
    assert all(len(fwd) == len(bwd) == n for fwd, bwd in profile.measured.values())
    assert profile.step_overhead > 0
    swap_fwd, swap_bwd = profile.measured["swap"]
    expected = (profile.head_fwd + profile.head_bwd + profile.step_overhead
                + sum(max(f + b, blk.fwd + blk.bwd)
                      for f, b, blk in zip(swap_fwd, swap_bwd, profile.blocks)))
    assert step_time(profile, ["swap"] * n) == pytest.approx(expected)
    assert len(plan.measured) == 3 and plan.prediction_error() is not None
    assert "prediction error" in plan.table()
    metrics, _ = backend.trial_outputs()
    assert metrics["ooc_prediction_error_pct"] == pytest.approx(100 * plan.prediction_error())


def test_without_a_budget_or_with_a_modelled_host_link_only_the_resident_profile_is_taken():
    net, x, y = _network()
    for options in ({}, {"budget_fraction": 0.5, "host_bandwidth": 1e9}):
        backend = OutOfCoreBackend(device="cpu", profile_repeats=0, **options)
        _steps(backend, net, x, y, steps=1)
        assert set(backend.last_plan.profile.measured) == {"resident"}


def test_a_measurement_that_makes_swapping_look_faster_than_resident_does_not_choose_it():
    blocks = [BlockProfile("a", fwd=0.01, bwd=0.02, saved=4 * MB, input=MB),
              BlockProfile("b", fwd=0.01, bwd=0.02, saved=4 * MB, input=MB)]
    profile = Profile(blocks=blocks, measured={
        "resident": ([0.01, 0.01], [0.02, 0.02]),
        "swap": ([0.005, 0.005], [0.01, 0.01]),          # noise: faster than resident
        "recompute": ([0.01, 0.01], [0.03, 0.03])})
    assert make_plan(profile, budget=10 * MB).policies == ["resident", "resident"]
    assert step_time(profile, ["swap", "swap"]) == pytest.approx(step_time(profile, ["resident"] * 2))


def test_a_budget_no_plan_meets_fails_before_training_naming_the_least_budget():
    net, x, y = _network()
    backend = OutOfCoreBackend(device="cpu", budget=1, profile_repeats=0)
    model = backend.prepare(net)
    before = [p.detach().clone() for p in model.parameters()]
    with pytest.raises(TrialFailure, match=r"no plan keeps this network's saved activations "
                                           r"within the budget of 0\.00 MiB \(1 bytes\) .* needs "
                                           r"[0-9.]+ MiB \((\d+) bytes\)") as failure:
        backend.forward_backward(model, nn.functional.cross_entropy, x, y)
    assert all(torch.equal(a, b) for a, b in zip(before, model.parameters()))
    least = int(failure.value.args[0].split("MiB (")[-1].split(" bytes")[0])
    net2, _, _ = _network()
    enough = OutOfCoreBackend(device="cpu", budget=least, profile_repeats=0)
    _steps(enough, net2, x, y, steps=1)
    assert enough.last_plan.feasible
