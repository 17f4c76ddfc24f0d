"""SharedPasses: proxies that share a pass give bitwise the values they give alone, in any
order, and the sharing is scoped to one network and batch."""

import math

import pytest
import torch
from torch import nn

from frugalnas.ports.cost import count_params
from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies import Proxy
from frugalnas.proxies.base import score_with
from frugalnas.proxies.runner import ProxyRunner
from frugalnas.proxies.shared import SharedPasses, shared_value
from frugalnas.proxies.swap import pack_bits, sample_wise_patterns
from frugalnas.spaces.nb201.space import NB201Space

HOST = PluginHost()
SHARING = ["az_expressivity", "az_progressivity", "swap", "swap_reg", "jacob_cov", "epe_nas"]
#: the 16 proxies of the 1,000-cell NB201 measurement (docs/benchmarks.md)
PROTOCOL = ["synflow", "naswot", "jacob_cov", "params", "flops", "l2_norm", "zico", "meco",
            "swap", "swap_reg", "az_expressivity", "az_progressivity", "az_trainability",
            "ntk_cond", "linear_regions", "epe_nas"]
SPACE = NB201Space(N=1, C=4)
CELLS = [3, 6311, 12418]  # convolutions only; pooling, skips and zeros; a mix


def batch(n=8, size=8, seed=0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, 3, size, size, generator=g), torch.randint(0, 10, (n,), generator=g)


def network(index):
    torch.manual_seed(0)
    return SPACE.build(SPACE.from_index(index), 10, (3, 8, 8))


@pytest.mark.parametrize("index, order", [(3, "forward"), (6311, "reversed"),
                                          (12418, "forward")])
def test_every_proxy_gives_the_same_bits_with_and_without_sharing(index, order):
    x, y = batch()
    proxies = {n: HOST.create("proxies", n) for n in PROTOCOL}
    model = network(index)
    alone = {n: p.score(model, x, y) for n, p in proxies.items()}
    shared = SharedPasses(model, x, y)
    names = PROTOCOL if order == "forward" else PROTOCOL[::-1]
    together = {n: score_with(proxies[n], model, x, y, shared) for n in names}
    for n in PROTOCOL:  # bitwise, not approximately (nan never occurs here)
        assert together[n] == alone[n] or (math.isnan(alone[n]) and math.isnan(together[n])), n
    assert shared.misses == 3 and shared.hits == 3  # one pass per sharing pair, reused once
    again = {n: p.score(model, x, y) for n, p in proxies.items()}
    assert again == alone  # the network was left as it was


def test_a_proxy_reads_the_shared_value_only_under_its_own_key():
    x, y = batch()
    model = network(CELLS[0])
    shared = SharedPasses(model, x, y)
    a = HOST.create("proxies", "swap", samples=8).score(model, x, y, shared=shared)
    b = HOST.create("proxies", "swap", samples=4).score(model, x, y, shared=shared)
    c = HOST.create("proxies", "swap", samples=8, seed=1).score(model, x, y, shared=shared)
    assert shared.misses == 3 and shared.hits == 0  # other options, other keys
    assert b == HOST.create("proxies", "swap", samples=4).score(model, x, y)
    assert c == HOST.create("proxies", "swap", samples=8, seed=1).score(model, x, y)
    reg = HOST.create("proxies", "swap_reg", samples=8, mu=1.0, sigma=2.0)
    value = reg.score(model, x, y, shared=shared)  # swap_reg reuses swap's count
    assert shared.hits == 1
    assert value == math.log(a) - (count_params(model) / 1e3 - 1.0) ** 2 / 2.0
    assert value == reg.score(model, x, y)


def test_shared_passes_belong_to_one_network_and_batch():
    x, y = batch()
    model = network(CELLS[0])
    shared = SharedPasses(model, x, y)
    proxy = HOST.create("proxies", "jacob_cov")
    with pytest.raises(ConfigError, match="another network"):
        proxy.score(network(CELLS[1]), x, y, shared=shared)
    with pytest.raises(ConfigError, match="another network"):
        proxy.score(model, x.clone(), y, shared=shared)
    assert len(shared) == 0


def test_a_failed_shared_computation_is_not_stored():
    shared = SharedPasses(nn.Identity(), torch.zeros(1))
    calls = []

    def boom():
        calls.append(1)
        raise RuntimeError("no")

    for _ in range(2):
        with pytest.raises(RuntimeError):
            shared.get("k", boom)
    assert len(calls) == 2 and "k" not in shared
    assert shared_value(None, "k", lambda: 5) == 5 and shared.get("k", lambda: 6) == 6
    assert shared.get("k", lambda: 7) == 6 and shared.hits == 1


def test_a_proxy_that_replaces_score_is_scored_without_sharing():
    class Old(Proxy):  # a third-party proxy with the old score signature
        name, needs_data, needs_labels = "old", False, False

        def compute(self, model, inputs, targets):
            return 1.0

        def score(self, model, inputs, targets=None):
            return 2.0

    x, y = batch()
    model = network(CELLS[0])
    assert score_with(Old(), model, x, y, SharedPasses(model, x, y)) == 2.0


def test_swap_counts_one_word_patterns_as_rows_would():
    x, _ = batch(n=16)
    model = network(CELLS[1])
    keys = []

    def hook(module, inp, out):
        if inp[0].dim() == 4:
            keys.append(pack_bits((out.detach().reshape(out.shape[0], -1) > 0).T))

    handles = [m.register_forward_hook(hook) for m in model.modules() if isinstance(m, nn.ReLU)]
    model.train()
    with torch.no_grad():
        model(x)
    for h in handles:
        h.remove()
    rows = int(torch.unique(torch.cat(keys), dim=0).shape[0])  # the row-wise reference
    assert sample_wise_patterns(model, x) == rows > 1


def test_the_runner_gives_the_same_values_with_and_without_sharing():
    x, y = batch(n=8, size=8)
    space = NB201Space(N=1, C=4)
    archs = [str(space.from_index(i)) for i in (7, 4567, 15000)]
    opts = dict(space="nb201", space_options={"N": 1, "C": 4}, proxies=SHARING + ["naswot"],
                data=(x, y), seed=0, cache_dir=None, workers=1, progress=False, num_classes=10)
    with_sharing = ProxyRunner(**opts).run(archs)
    without = ProxyRunner(share=False, **opts).run(archs)
    assert all(with_sharing.complete) and with_sharing.values == without.values
