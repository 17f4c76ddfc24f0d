"""The proxies of 2021-2024 (ZiCo, MeCo, SWAP, AZ-NAS, TE-NAS, EPE-NAS) on hand-checkable
networks, their seeding and restoration, and the ensembles' log-rank aggregation."""

import math

import numpy as np
import pytest
import torch
from torch import nn

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies.activation import DEAD_SCORE
from frugalnas.proxies.ensemble import aggregate, log_rank_average, rank_average
from frugalnas.proxies.epe import EPSILON
from frugalnas.spaces.nb201.space import NB201Space

HOST = PluginHost()
NEW = ("zico", "meco", "swap", "swap_reg", "az_expressivity", "az_progressivity",
       "az_trainability", "ntk_cond", "linear_regions", "epe_nas")
CELL = ("|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|"
        "skip_connect~2|")


def small_net(cell: str = CELL, seed: int = 0) -> nn.Module:
    space = NB201Space(N=1, C=8)
    torch.manual_seed(seed)
    return space.build(space.parse(cell), 10, (3, 16, 16))


def batch(seed: int = 0, n: int = 16):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, 16, 16, generator=g), torch.randint(0, 10, (n,), generator=g)


def conv1x1(weight) -> nn.Conv2d:
    w = torch.as_tensor(weight, dtype=torch.float32)
    conv = nn.Conv2d(w.shape[1], w.shape[0], 1, bias=False)
    with torch.no_grad():
        conv.weight.copy_(w[:, :, None, None])
    return conv


class Chain(nn.Module):
    """Blocks applied in order; ``forward_blocks()`` lists them (a BlockNetwork, as
    NB201Network is)."""

    def __init__(self, *blocks: nn.Module):
        super().__init__()
        self.seq = nn.Sequential(*blocks)

    def forward_blocks(self):
        return list(self.seq)

    def forward(self, x):
        return self.seq(x)


def test_new_proxies_are_registered_with_their_paper():
    summaries = {c["name"]: c["summary"] for c in HOST.registry("proxies").describe()}
    assert set(NEW) <= set(summaries)
    for name in NEW:  # the first docstring line names the paper and its year
        assert any(f"20{y}" in summaries[name] for y in range(19, 25)), (name, summaries[name])
    assert set(NEW) <= set(HOST.estimators())  # every proxy is an estimator too


@pytest.mark.parametrize("name", NEW)
def test_new_proxy_is_seeded_and_restores_the_network(name):
    # (the full contract, check_proxy, runs for every registered proxy in the conformance suite)
    net, (x, y) = small_net(), batch()
    before = {k: v.clone() for k, v in net.state_dict().items()}
    first = HOST.create("proxies", name).score(net, x, y)
    assert all(torch.equal(before[k], v) for k, v in net.state_dict().items())
    again = HOST.create("proxies", name).score(small_net(), x.clone(), y.clone())
    assert math.isfinite(first) and first == pytest.approx(again, rel=1e-9, abs=1e-12)


@pytest.mark.parametrize("name", ["meco", "swap", "az_expressivity", "linear_regions"])
def test_random_draws_follow_the_seed_option(name):
    net, (x, y) = small_net(), batch()
    a = HOST.create("proxies", name, seed=0).score(net, x, y)
    b = HOST.create("proxies", name, seed=1).score(net, x, y)
    assert a == HOST.create("proxies", name, seed=0).score(net, x, y)
    assert a != b
    state = torch.random.get_rng_state()
    HOST.create("proxies", name).score(net, x, y)
    assert torch.equal(state, torch.random.get_rng_state())  # the global RNG is left alone


# -- hand-checkable values -------------------------------------------------------------------
def test_zico_on_a_zero_linear_model_matches_the_closed_form():
    # W = 0: softmax is uniform, so each half's gradient is mean_i (1/K - e_{y_i}) x_i^T
    g = torch.Generator().manual_seed(3)
    x, y = torch.randn(8, 5, generator=g), torch.tensor([0, 1, 2, 0, 1, 2, 2, 0])
    model = nn.Linear(5, 3, bias=False)
    nn.init.zeros_(model.weight)
    K = 3
    halves = []
    for xs, ys in ((x[:4], y[:4]), (x[4:], y[4:])):
        resid = np.full((4, K), 1.0 / K)
        resid[np.arange(4), ys.numpy()] -= 1.0
        halves.append(resid.T @ xs.numpy().astype(float) / 4)
    G = np.stack(halves)
    std, mean_abs = G.std(axis=0), np.abs(G).mean(axis=0)
    keep = std > 0
    expected = math.log(float((mean_abs[keep] / std[keep]).sum()))
    got = HOST.create("proxies", "zico").score(model, x, y)
    assert got == pytest.approx(expected, rel=1e-6)


def test_meco_is_one_minus_the_channel_correlation_of_a_two_channel_map():
    # output channels (a, a + b): corr rho, eigenvalues 1 -+ rho, so lambda_min = 1 - |rho|
    model = nn.Sequential(conv1x1([[1.0, 0.0], [1.0, 1.0]]))
    proxy = HOST.create("proxies", "meco")
    # MeCo draws its own input from the seeded RNG: reproduce the draw
    torch.manual_seed(proxy.seed)
    drawn = torch.randn(1, 2, 6, 6)
    out = model(drawn)[0].reshape(2, -1).detach().double()
    rho = float(torch.corrcoef(out)[0, 1])
    assert proxy.score(model, torch.zeros(4, 2, 6, 6)) == pytest.approx(1 - abs(rho), rel=1e-9)


def test_swap_counts_distinct_sample_wise_patterns():
    model = nn.Sequential(nn.ReLU())
    # 2 samples x 4 units: unit patterns (1,0), (1,0), (0,1), (1,1) -> 3 distinct
    x = torch.tensor([[1.0, 2.0, -1.0, 3.0], [-1.0, -2.0, 1.0, 3.0]]).reshape(2, 1, 1, 4)
    swap = HOST.create("proxies", "swap", init="none", samples=2)
    assert swap.score(model, x) == 3.0
    reg = HOST.create("proxies", "swap_reg", init="none", samples=2, mu=1.0, sigma=2.0)
    assert reg.score(model, x) == pytest.approx(math.log(3) - (0.0 - 1.0) ** 2 / 2.0)
    one = nn.Sequential(conv1x1([[1.0]]), nn.ReLU())  # one parameter: Theta = 0.001
    assert HOST.create("proxies", "swap_reg", init="none", samples=2, mu=1.0, sigma=2.0).score(
        one, x[:, :, :, :1]) == pytest.approx(math.log(1) - (0.001 - 1.0) ** 2 / 2.0)


def test_swap_unit_patterns_use_more_than_62_samples_correctly():
    model = nn.Sequential(nn.ReLU())
    g = torch.Generator().manual_seed(0)
    x = torch.randn(70, 1, 1, 50, generator=g)
    expected = len({tuple((x[:, 0, 0, u] > 0).tolist()) for u in range(50)})
    assert HOST.create("proxies", "swap", init="none", samples=70).score(model, x) == expected


def _entropy(p):
    p = np.asarray(p, dtype=float) / np.sum(p)
    return float(-(p * np.log(p)).sum())


def test_az_expressivity_and_progressivity_from_known_spectra():
    # input channels orthogonal with unit variance: covariance I (entropy log 2); the 1x1
    # conv diag(1, 2) gives covariance diag(1, 4): p = (0.2, 0.8)
    x = torch.tensor([[1.0, -1.0, 1.0, -1.0], [1.0, 1.0, -1.0, -1.0]]).reshape(1, 2, 1, 4)
    model = Chain(nn.Identity(), conv1x1([[1.0, 0.0], [0.0, 2.0]]))
    e = HOST.create("proxies", "az_expressivity", init="none").score(model, x)
    p = HOST.create("proxies", "az_progressivity", init="none").score(model, x)
    assert e == pytest.approx(math.log(2) + _entropy([1, 4]), rel=1e-9)
    assert p == pytest.approx(_entropy([1, 4]) - math.log(2), rel=1e-9)
    dead = Chain(nn.Identity(), conv1x1([[0.0, 0.0], [0.0, 0.0]]))
    assert HOST.create("proxies", "az_expressivity", init="none").score(dead, x) == DEAD_SCORE


@pytest.mark.parametrize("w", [2.0, 0.5, -3.0])
def test_az_trainability_of_a_scaling_block_is_2_minus_sigma_minus_its_inverse(w):
    # g_in = w g_out and E[g_out^2] = 1 exactly for a Rademacher vector: sigma = |w|
    model = Chain(nn.Identity(), conv1x1([[w]]))
    x = torch.randn(3, 1, 4, 4)
    got = HOST.create("proxies", "az_trainability", init="none").score(model, x)
    assert got == pytest.approx(2 - abs(w) - 1 / abs(w), rel=1e-9)


def test_az_trainability_penalises_an_identity_block():
    model = Chain(nn.Identity(), conv1x1([[1.0]]))
    assert HOST.create("proxies", "az_trainability", init="none").score(
        model, torch.randn(2, 1, 3, 3)) == DEAD_SCORE


def test_ntk_condition_number_of_a_linear_model():
    # f = W x, summed over 2 outputs: each sample's gradient is (x, x), NTK = 2 X X^T
    model = nn.Linear(3, 2, bias=False)
    x = torch.tensor([[1.0, 0.0, 0.0], [0.0, 2.0, 0.0]])
    assert HOST.create("proxies", "ntk_cond", samples=2).score(model, x) == pytest.approx(-4.0)
    x = torch.tensor([[1.0, 1.0, 0.0], [1.0, -1.0, 0.0], [0.0, 0.0, 3.0]])
    assert HOST.create("proxies", "ntk_cond", samples=3).score(model, x) == pytest.approx(-4.5)


def test_linear_regions_of_coordinate_relus_are_the_quadrants():
    model = nn.Sequential(conv1x1([[1.0, 0.0], [0.0, 1.0]]), nn.ReLU())
    lr = HOST.create("proxies", "linear_regions", samples=200, size=1, channels=None)
    assert lr.score(model, torch.zeros(1, 2, 1, 1)) == 4.0  # 2 channels: the 4 quadrants
    thin = HOST.create("proxies", "linear_regions", samples=200, size=1, channels=1)
    assert thin.score(model, torch.zeros(1, 2, 1, 1)) == 2.0  # first channel only: 2 half-planes


def test_epe_nas_of_a_linear_model_has_fully_correlated_jacobians():
    # every input Jacobian equals sum_k W_k: all correlations are 1, e_c = n_c^2 log(1 + k)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 4))
    x, _ = batch(n=10)
    x = x[:, :, :2, :2]
    y = torch.tensor([0, 0, 0, 1, 1, 2, 2, 2, 2, 3])
    expected = sum(n * n * math.log(1 + EPSILON) for n in (3, 2, 4, 1))
    assert HOST.create("proxies", "epe_nas").score(model, x, y) == pytest.approx(expected, rel=1e-6)


def test_epe_nas_matches_the_formula_on_a_relu_network():
    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(12, 16), nn.ReLU(), nn.Linear(16, 3))
    x = torch.randn(9, 3, 2, 2)
    y = torch.tensor([0, 1, 2, 0, 1, 2, 0, 1, 2])
    xr = x.clone().requires_grad_(True)
    out = model(xr)
    (jac,) = torch.autograd.grad(out, xr, torch.ones_like(out))
    jac = jac.reshape(9, -1).double().numpy()
    expected = sum(abs(np.log(np.abs(np.corrcoef(jac[y.numpy() == c])) + EPSILON).sum())
                   for c in range(3))
    assert HOST.create("proxies", "epe_nas").score(model, x, y) == pytest.approx(expected, rel=1e-6)


def test_options_are_checked():
    with pytest.raises(ConfigError, match="init"):
        HOST.create("proxies", "swap", init="xavier")
    with pytest.raises(ConfigError, match="splits"):
        HOST.create("proxies", "zico", splits=1)


# -- aggregation -------------------------------------------------------------------------------
def test_log_rank_aggregation_is_the_mean_log_of_rank_over_n():
    m = np.array([[1.0, 10.0], [2.0, 30.0], [3.0, 20.0]])
    expected = [(math.log(1 / 3) + math.log(1 / 3)) / 2, (math.log(2 / 3) + math.log(1)) / 2,
                (math.log(1) + math.log(2 / 3)) / 2]
    assert log_rank_average(m).tolist() == pytest.approx(expected)
    assert aggregate(m, None, "mean-rank").tolist() == rank_average(m).tolist()
    w = log_rank_average(m, [3.0, 1.0])
    assert w[2] > w[1]  # the first column weighs more
    # a low rank on any member pulls a log-rank score down harder than a mean rank
    m2 = np.array([[1.0, 3.0], [2.0, 2.0], [3.0, 1.0], [2.5, 2.5]])
    assert log_rank_average(m2)[3] > log_rank_average(m2)[0]
    with pytest.raises(ConfigError, match="aggregation"):
        aggregate(m, None, "geometric")


def test_rank_ensemble_estimator_with_log_rank_aggregation():
    study = frugalnas.create_study(space="nb201", space_options={"N": 1, "C": 4},
                                   estimator="rank-ensemble", dataset=None,
                                   estimator_options={"proxies": ["params", "synflow"],
                                                      "aggregation": "log-rank",
                                                      "input_shape": [3, 8, 8], "batch_size": 4},
                                   disable_plugins=["mlflow", "progress"], seed=0)
    study.optimize(3)
    values = [t.value for t in study.trials]
    assert values[0] == 0.0 and all(v <= 0.0 for v in values)
    with pytest.raises(ConfigError, match="aggregation"):
        HOST.create_estimator("rank-ensemble", {"aggregation": "median"})


def test_learned_ensemble_declares_only_metrics_every_result_holds():
    est = HOST.create_estimator("learned-ensemble", {"teacher": "nb201-table",
                                                     "proxies": ["params", "zico", "meco"]})
    assert "teacher_value" not in est.provides
    assert not any(m.startswith("weight_") for m in est.provides)
    assert {"proxy_params", "proxy_zico", "proxy_meco", "population"} <= set(est.provides)
