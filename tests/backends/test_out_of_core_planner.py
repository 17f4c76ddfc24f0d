"""The out-of-core cost model and planner on constructed cost tables."""

from __future__ import annotations

import itertools

import pytest

from frugalnas.backends.out_of_core.cost import (BlockProfile, Profile, isolated_costs, peak_bytes,
                                                 step_time)
from frugalnas.backends.out_of_core.planner import make_plan

MB = 1 << 20


def table(overlap: bool = False) -> Profile:
    """Block 'conv' computes a lot and saves little (swap is cheap); block 'act' computes
    little and saves a lot (recompute is cheap); 'tail' is small."""
    return Profile(blocks=[BlockProfile("conv", fwd=0.050, bwd=0.100, saved=4 * MB, input=1 * MB),
                           BlockProfile("act", fwd=0.002, bwd=0.004, saved=6 * MB, input=1 * MB),
                           BlockProfile("tail", fwd=0.001, bwd=0.002, saved=3 * MB, input=1 * MB)],
                   head_fwd=0.001, head_bwd=0.001, fixed=MB // 4, bandwidth=1e9, overlap=overlap)


def test_costs_differ_by_block_as_constructed():
    prof = table()
    swap_conv, rec_conv = isolated_costs(prof, 0)
    swap_act, rec_act = isolated_costs(prof, 1)
    assert swap_conv == pytest.approx(2 * 4 * MB / 1e9) and rec_conv == pytest.approx(0.050)
    assert swap_act == pytest.approx(2 * 6 * MB / 1e9) and rec_act == pytest.approx(0.002)


def test_overlap_hides_transfers_behind_later_compute():
    prof = table(overlap=True)
    # the conv block's offload (4.19 ms) hides behind the later forwards and the head; its
    # prefetch is issued when the act block's backward (4 ms) starts, so 0.19 ms shows
    assert isolated_costs(prof, 0)[0] == pytest.approx(4 * MB / 1e9 - 0.004)
    assert isolated_costs(table(overlap=False), 0)[0] == pytest.approx(2 * 4 * MB / 1e9)


@pytest.mark.parametrize("planner", ["exact", "greedy"])
def test_mix_under_a_tight_budget_and_resident_under_a_loose_one(planner):
    prof = table()
    loose = make_plan(prof, budget=100 * MB, planner=planner)
    assert loose.policies == ["resident"] * 3 and loose.feasible
    budget = prof.fixed + 8 * MB
    plan = make_plan(prof, budget=budget, planner=planner)
    assert plan.feasible and plan.peak <= budget
    assert plan.policies == ["swap", "recompute", "resident"], plan.table()
    # the chosen plan is no slower than either uniform plan that also fits
    for uniform in ("swap", "recompute"):
        pol = [uniform] * 3
        if peak_bytes(prof, pol) <= budget:
            assert plan.time <= step_time(prof, pol) + 1e-12


def test_exact_is_optimal_and_greedy_close_on_random_tables():
    import random

    rng = random.Random(0)
    for _ in range(20):
        blocks = [BlockProfile(f"b{i}", fwd=rng.uniform(1e-3, 5e-2), bwd=rng.uniform(1e-3, 1e-1),
                               saved=rng.randint(1, 16) * MB, input=rng.randint(1, 4) * MB)
                  for i in range(5)]
        prof = Profile(blocks, fixed=MB, bandwidth=rng.choice([5e8, 5e9]), overlap=rng.random() < 0.5)
        budget = int(sum(b.saved for b in blocks) * rng.uniform(0.3, 0.8))
        exact = make_plan(prof, budget, planner="exact")
        greedy = make_plan(prof, budget, planner="greedy")
        feasible = [step_time(prof, p) for p in itertools.product(("resident", "swap", "recompute"), repeat=5)
                    if peak_bytes(prof, p) <= budget]
        if not feasible:
            assert not exact.feasible and not greedy.feasible
            continue
        assert exact.time == pytest.approx(min(feasible))
        if greedy.feasible:
            assert greedy.peak <= budget and greedy.time <= 1.5 * exact.time


def test_table_explains_each_block():
    plan = make_plan(table(), budget=table().fixed + 8 * MB)
    text = plan.table()
    for name in ("conv", "act", "tail", "swap", "recompute", "fwd ms", "budget"):
        assert name in text
