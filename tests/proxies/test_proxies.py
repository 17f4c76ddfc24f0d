import math

import numpy as np
import pytest
import torch

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies import Proxy, ProxyCheckError
from frugalnas.proxies.ensemble import fit_weights, percentile_ranks, rank_average
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.testing import check_proxy

SMALL = {"N": 1, "C": 8}
CELL = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"
HOST = PluginHost()
PROXY_NAMES = HOST.registry("proxies").names()


def small_net(cell: str = CELL, seed: int = 0) -> torch.nn.Module:
    space = NB201Space(**SMALL)
    torch.manual_seed(seed)
    return space.build(space.parse(cell), 10, (3, 16, 16))


def batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(16, 3, 16, 16, generator=g), torch.randint(0, 10, (16,), generator=g)


def test_every_builtin_proxy_is_registered():
    expected = {"synflow", "snip", "grasp", "grad_norm", "fisher", "jacob_cov", "naswot", "zen",
                "params", "flops", "l2_norm", "plain"}
    assert expected <= set(PROXY_NAMES)
    est = HOST.estimators()
    assert {"rank-ensemble", "learned-ensemble", "low-fidelity"} <= set(est)
    assert set(PROXY_NAMES) <= set(est)  # every proxy is an estimator of its own name


def test_proxies_separate_architectures():
    x, y = batch()
    wide = "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|nor_conv_3x3~0|nor_conv_3x3~1|nor_conv_3x3~2|"
    thin = "|avg_pool_3x3~0|+|none~0|skip_connect~1|+|none~0|none~1|avg_pool_3x3~2|"
    for name in ("synflow", "params", "flops", "snip", "naswot"):
        proxy = HOST.create("proxies", name)
        assert proxy.score(small_net(wide), x, y) > proxy.score(small_net(thin), x, y), name


def test_synflow_matches_its_definition_and_ignores_data():
    net = small_net()
    x, y = batch()
    got = HOST.create("proxies", "synflow").score(net, x, y)
    # by hand: |w|, float64, BN in evaluation mode, all-ones input, R = sum of outputs
    import copy

    ref = copy.deepcopy(net).double().eval()
    for p in ref.parameters():
        p.data.abs_()
    ref(torch.ones(1, 3, 16, 16, dtype=torch.float64)).sum().backward()
    convs = [m for m in ref.modules() if isinstance(m, (torch.nn.Conv2d, torch.nn.Linear))]
    expected = sum(float((m.weight.detach() * m.weight.grad).abs().sum()) for m in convs)
    assert got == pytest.approx(expected, rel=1e-12)
    assert next(net.parameters()).dtype == torch.float32 and net.training


def test_naswot_is_log_det_of_activation_code_kernel():
    net, (x, y) = small_net(), batch()
    codes = []
    hooks = [m.register_forward_hook(lambda m, i, o: codes.append((i[0].flatten(1) > 0).double()))
             for m in net.modules() if isinstance(m, torch.nn.ReLU)]
    with torch.no_grad():
        net(x)
    for h in hooks:
        h.remove()
    k = sum(c @ c.T + (1 - c) @ (1 - c).T for c in codes)
    assert HOST.create("proxies", "naswot").score(net, x) == pytest.approx(
        torch.linalg.slogdet(k)[1].item(), rel=1e-9)


class _Broken(Proxy):
    name = "broken"
    needs_data = True
    needs_labels = False

    def compute(self, model, inputs, targets):
        return 1.0


class _NotFinite(_Broken):
    def compute(self, model, inputs, targets):
        return float("nan")


class _Mutates(_Broken):
    def score(self, model, inputs, targets=None):  # bypasses the base class's restore
        with torch.no_grad():
            next(model.parameters()).mul_(2.0)
        return 1.0


class _Random(_Broken):
    def __init__(self):
        self.calls = 0

    def compute(self, model, inputs, targets):
        self.calls += 1
        return float(self.calls)


class _HiddenParam(_Broken):
    def __init__(self, scale: float = 1.0):
        self._scale = scale


class _UsesLabelsSecretly(_Broken):
    def compute(self, model, inputs, targets):
        return float(targets.sum())


class _UndeclaredData(Proxy):
    name = "undeclared"
    needs_labels = False

    def compute(self, model, inputs, targets):
        return 1.0


class _ClaimsDataFree(_Broken):
    needs_data = False

    def compute(self, model, inputs, targets):
        return float(inputs.mean())


@pytest.mark.parametrize("cls, rule", [
    (_NotFinite, "finite-float"), (_Mutates, "no-mutation"), (_Random, "deterministic"),
    (_HiddenParam, "init-params"), (_UsesLabelsSecretly, "labels-optional"),
    (_UndeclaredData, "declares-needs"), (_ClaimsDataFree, "data-free"),
])
def test_conformance_check_rejects_broken_proxies(cls, rule):
    with pytest.raises(ProxyCheckError, match=rule):
        check_proxy(cls())


def test_conformance_check_accepts_a_minimal_third_party_proxy():
    assert "labels-optional" in check_proxy(_Broken())


def test_rank_helpers():
    assert percentile_ranks([3.0, 1.0, 2.0]).tolist() == [1.0, 0.0, 0.5]
    m = np.array([[1.0, 10.0], [2.0, 30.0], [3.0, 20.0]])
    assert rank_average(m).tolist() == pytest.approx([0.0, 0.75, 0.75])
    w = fit_weights(m, [1.0, 2.0, 3.0])
    assert w.sum() == pytest.approx(1.0) and w[0] > w[1]


def test_proxy_estimator_reports_cost_and_metric():
    study = frugalnas.create_study(space="nb201", space_options=SMALL, estimator="snip",
                                   dataset="digits", dataset_options={"resize": 16},
                                   estimator_options={"batch_size": 16}, disable_plugins=["mlflow"], seed=2)
    arch = study.space.parse(CELL)
    first, second = study.evaluate(arch), study.evaluate(arch)
    assert first.value == second.value and first.metrics["proxy_snip"] == first.value
    assert first.cost.seconds > 0 and first.cost.flops > 0 and first.cost.params > 0
    gauss = frugalnas.create_study(space="nb201", space_options=SMALL, estimator="snip",
                                   dataset="digits", dataset_options={"resize": 16},
                                   estimator_options={"batch_size": 16, "data": "gaussian"},
                                   disable_plugins=["mlflow"], seed=2)
    assert gauss.evaluate(arch).value != first.value


def test_data_free_proxy_needs_no_dataset():
    study = frugalnas.create_study(space="nb201", space_options=SMALL, estimator="synflow",
                                   dataset=None, estimator_options={"input_shape": [3, 16, 16]},
                                   disable_plugins=["mlflow"])
    study.optimize(3)
    assert all(math.isfinite(t.value) for t in study.trials)


def test_bad_proxy_options_name_the_valid_choices():
    with pytest.raises(ConfigError, match="gaussian"):
        frugalnas.create_study(space="nb201", estimator="synflow", disable_plugins=["mlflow"],
                               estimator_options={"data": "imagenet"})
    with pytest.raises(ConfigError, match="needs a( study)? dataset"):
        frugalnas.create_study(space="nb201", space_options=SMALL, estimator="snip", dataset=None,
                               disable_plugins=["mlflow"]).optimize(1, catch=())
