"""The fast paths of ensemble scoring give bitwise the scores and cost of the reference path.

A proxy scored with a ``SharedPasses`` (the ensembles, ``score_network``, the runner) takes
its fast path: meco's batched eigenvalues, swap's table count, ntk_cond's Jacobian written
in place, and ``score_network`` counts FLOPs without per-module tracking. Scored alone, each
proxy runs the reference code. Equality here is ``==`` on the float values, not a tolerance.
"""

import random

import pytest
import torch
from torch import nn

import frugalnas
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.cost import count_flops
from frugalnas.proxies.base import forward_flops, score_network, score_with
from frugalnas.proxies.ensemble import SELECTED_MEMBERS
from frugalnas.proxies.meco import min_correlation_eigenvalue, min_correlation_eigenvalues
from frugalnas.proxies.shared import SharedPasses
from frugalnas.proxies.swap import (TABLE_SAMPLES, sample_wise_pattern_count,
                                    sample_wise_patterns)
from frugalnas.spaces.nb201.space import NB201Space

HOST = PluginHost()
BENCHMARK = NB201Space(N=5, C=16)
SMALL = NB201Space(N=1, C=8)


def images(n: int, size: int = 32, seed: int = 0) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


def built(space: NB201Space, index: int, size: int) -> nn.Module:
    torch.manual_seed(0)
    return space.build(space.from_index(index), 10, (3, size, size))


def both_paths(model: nn.Module, x: torch.Tensor, y: torch.Tensor,
               names=SELECTED_MEMBERS) -> tuple[dict[str, float], dict[str, float]]:
    proxies = {n: HOST.create("proxies", n) for n in names}
    alone = {n: p.score(model, x, y) for n, p in proxies.items()}
    shared = SharedPasses(model, x, y)
    return alone, {n: score_with(p, model, x, y, shared) for n, p in proxies.items()}


# a mix with pooling and zeros; convolutions only
@pytest.mark.parametrize("index", [1462, pytest.param(11089, marks=pytest.mark.slow)])
def test_selected_members_on_benchmark_cells_give_the_same_bits_on_both_paths(index):
    x, y = images(64)
    alone, fast = both_paths(built(BENCHMARK, index, 32), x, y)
    assert fast == alone


def test_selected_members_agree_on_many_small_cells():
    x, y = images(16, size=16, seed=1)
    for index in random.Random(0).sample(range(15625), 6):
        alone, fast = both_paths(built(SMALL, index, 16), x, y)
        assert fast == alone, SMALL.from_index(index)


def test_batched_eigenvalues_match_one_map_at_a_time_including_degenerate_maps():
    g = torch.Generator().manual_seed(0)
    maps = [torch.randn(8, 4, 4, generator=g) for _ in range(3)]
    maps += [torch.zeros(8, 4, 4), torch.randn(1, 4, 4, generator=g),
             torch.randn(8, 1, 1, generator=g), torch.randn(16, 2, 2, generator=g)]
    maps[1][3] = 2.5  # a constant channel: undefined correlations count 0
    assert min_correlation_eigenvalues(maps) == [min_correlation_eigenvalue(m) for m in maps]


def test_meco_keeps_feature_maps_that_a_later_in_place_module_overwrites():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Conv2d(3, 8, 3, padding=1), nn.BatchNorm2d(8), nn.ReLU(inplace=True),
                          nn.Conv2d(8, 8, 3, padding=1), nn.ReLU(inplace=True))
    x, y = images(4, size=8)
    alone, fast = both_paths(model, x, y, ["meco"])
    assert fast == alone


@pytest.mark.parametrize("samples", [2, 16, TABLE_SAMPLES + 2])
def test_the_table_count_is_the_sorting_count(samples):
    x, _ = images(samples, size=16)
    model = built(SMALL, 6311, 16)
    assert sample_wise_pattern_count(model, x) == sample_wise_patterns(model, x) > 1
    assert sample_wise_pattern_count(nn.Flatten(), x) == sample_wise_patterns(nn.Flatten(), x) == 0


def test_forward_flops_is_count_flops():
    for index in (1462, 15624):
        model = built(BENCHMARK, index, 32)
        assert forward_flops(model, images(1)[0]) == count_flops(model, images(1)[0])
    mlp = nn.Sequential(nn.Flatten(), nn.Linear(48, 20), nn.ReLU(), nn.Linear(20, 10))
    assert forward_flops(mlp, images(1, size=4)[0]) == count_flops(mlp, images(1, size=4)[0]) > 0
    assert mlp.training  # the mode is restored


def test_score_network_gives_the_same_values_and_cost_on_both_paths():
    study = frugalnas.create_study(space="nb201", space_options={"N": 1, "C": 8},
                                   estimator="rank-ensemble", dataset=None,
                                   estimator_options={"proxies": "selected", "data": "gaussian",
                                                      "batch_size": 16, "input_shape": [3, 16, 16]},
                                   disable_plugins=["mlflow", "progress"], seed=0)
    est, context = study.estimator, study.context()
    for index in (7, 4567, 15000):
        arch = study.space.from_index(index)
        runs = [score_network(est.members, arch, context, est.batch, need_dataset=False,
                              share=share) for share in (False, True)]
        (before, cost_before), (after, cost_after) = runs
        assert after == before
        assert (cost_after.flops, cost_after.params) == (cost_before.flops, cost_before.params)


def test_ntk_cond_batched_backward_gives_the_per_sample_gradients():
    """The batched backward (one pass over the samples' one-hot cotangents), taken on CUDA,
    gives the gradients of the per-sample loop on real NB201 networks."""
    from frugalnas.proxies.tenas import NTKCondition
    from frugalnas.spaces.nb201.space import NB201Space

    space = NB201Space(N=1, C=8)
    proxy = NTKCondition()
    for seed in range(3):
        torch.manual_seed(seed)
        net = space.build(space.sample(random.Random(seed)), 10, (3, 16, 16))
        x = torch.randn(8, 3, 16, 16)
        rows = {}
        for batched in (False, True):
            got = []
            proxy._gradients(net, x, lambda i, g: got.append(
                torch.cat([t.reshape(-1) for t in g])), batched=batched)
            rows[batched] = torch.stack(got)
        torch.testing.assert_close(rows[True], rows[False], rtol=1e-5, atol=1e-6)
