"""Surrogates: encodings, proxy features, acquisition, and the check failing broken ones (the
conformance suite, tests/testing/test_conformance.py, checks every registered surrogate)."""

import numpy as np
import pytest
from optuna.distributions import CategoricalDistribution, IntDistribution

from frugalnas.ports.capabilities import OwnEncodings, capability
import frugalnas
from frugalnas.ports.cost import count_params
from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.space import SearchSpace
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.surrogates import (Encoding, LightGBMSurrogate, RandomForestSurrogate, Surrogate,
                                  SurrogateCheckError, acquisition,
                                  check_surrogate, make_encoding, rank_quality)
from frugalnas.surrogates.proxy_features import ProxyEncoding, ProxyScorer


def test_at_least_the_four_builtin_surrogates_are_registered():
    assert {"lightgbm", "random-forest", "gp", "mlp-ensemble"} <= set(
        frugalnas.list_components("surrogates"))


class NegativeStd(Surrogate):
    def __init__(self, seed: int = 0):
        self.seed = seed

    def _fit(self, X, y):
        self.w_ = np.linalg.lstsq(X, y, rcond=None)[0]

    def _predict(self, X):
        return X @ self.w_, -np.ones(len(X))

    def predict(self, X):  # bypasses the base class's clipping on purpose
        self.n_features_in_  # noqa: B018 - AttributeError before fit mentions nothing useful
        return self._predict(np.asarray(X, float))


class MutatesParams(LightGBMSurrogate):
    def __init__(self, n_models: int = 2, seed: int = 0):
        self.n_models = n_models * 2  # work in __init__: breaks get_params/clone
        self.seed = seed


class Unseeded(Surrogate):
    def __init__(self):
        pass

    def _fit(self, X, y):
        self.w_ = np.linalg.lstsq(X, y, rcond=None)[0] + np.random.default_rng().normal(size=X.shape[1])

    def _predict(self, X):
        return X @ self.w_, np.zeros(len(X))


class Constant(Surrogate):
    def __init__(self, value: float = 0.0):
        self.value = value

    def _fit(self, X, y):
        pass

    def _predict(self, X):
        return np.full(len(X), self.value), np.zeros(len(X))


@pytest.mark.parametrize("broken, check", [
    (NegativeStd, "predict-before-fit"), (MutatesParams, "clone"),
    (Unseeded, "deterministic"), (Constant, "learns")])
def test_broken_surrogates_fail_the_check_naming_it(broken, check):
    with pytest.raises(SurrogateCheckError, match=check):
        check_surrogate(broken)


def test_negative_std_is_caught_once_fit_works():
    class FittedNegative(NegativeStd):
        def predict(self, X):
            if not hasattr(self, "w_"):
                raise RuntimeError("call fit first")
            return self._predict(np.asarray(X, float))

    with pytest.raises(SurrogateCheckError, match="std-non-negative"):
        check_surrogate(FittedNegative)


def test_predict_before_fit_says_to_fit():
    with pytest.raises(Exception, match="fit"):
        LightGBMSurrogate().predict(np.zeros((2, 3)))


def test_nb201_encodings_have_the_expected_features():
    space = NB201Space()
    all_skip = space.parse("|skip_connect~0|+|skip_connect~0|skip_connect~1|+"
                           "|skip_connect~0|skip_connect~1|skip_connect~2|")
    empty = space.parse("|none~0|+|none~0|none~1|+|none~0|none~1|none~2|")
    assert make_encoding("onehot", space).encode([all_skip]).shape == (1, 30)
    adj = make_encoding("adjacency", space).encode([all_skip, empty])
    assert adj.shape == (2, 36) and adj[0, :6].sum() == 6 and adj[1, :6].sum() == 0
    path = make_encoding("path", space).encode([all_skip, empty])
    assert path.shape == (2, 4 + 16 + 64)
    assert path[1].sum() == 0  # every path runs through a 'none' edge
    assert sorted(path[0][path[0] > 0]) == [1, 1, 2]  # 1-, 2- (twice) and 3-edge skip paths


class TinySpace(SearchSpace):
    name = "tiny"

    def distributions(self):
        return {"act": CategoricalDistribution(("relu", "gelu", "tanh")),
                "width": IntDistribution(8, 64, log=True)}

    def build(self, arch, num_classes, input_shape):
        import torch

        return torch.nn.Sequential(torch.nn.Flatten(), torch.nn.Linear(
            int(np.prod(input_shape)), arch["width"]), torch.nn.Linear(arch["width"], num_classes))


def test_generic_spaces_get_a_onehot_encoding():
    space = TinySpace()
    x = make_encoding("onehot", space).encode([space.from_params({"act": "gelu", "width": 64}),
                                               space.from_params({"act": "relu", "width": 8})])
    np.testing.assert_allclose(x, [[0, 1, 0, 1.0], [1, 0, 0, 0.0]])


@pytest.mark.parametrize("name", ["adjacency", "path"])
def test_an_encoding_the_space_lacks_is_refused_naming_the_ones_it_has(name):
    with pytest.raises(ConfigError, match=rf"encoding '{name}' for search space 'tiny'; its "
                                          r"encodings: onehot, proxy$"):
        make_encoding(name, TinySpace())


def test_a_space_declares_its_own_encodings():
    class CountedEncodings:
        def __init__(self, space):
            self.space = space

        def encodings(self):
            return {"width-only": lambda space: WidthOnly(space)}

    class Counted(TinySpace):
        capabilities = {OwnEncodings: CountedEncodings}

    class WidthOnly(Encoding):
        def encode_one(self, arch):
            return np.asarray([float(arch["width"])])

    space = Counted()
    assert make_encoding("width-only", space).encode(
        [space.from_params({"act": "gelu", "width": 64})]).tolist() == [[64.0]]
    assert set(capability(NB201Space(), OwnEncodings).encodings()) == {"adjacency", "path"}


def test_surrogate_strategies_default_to_an_encoding_the_space_has():
    from frugalnas.spaces.dag.space import DagSpace
    from frugalnas.strategies.surrogate_search import BananasSampler, SurrogateEvolutionSampler

    assert SurrogateEvolutionSampler(NB201Space(), surrogate=RandomForestSurrogate()).encoding == "adjacency"
    assert BananasSampler(NB201Space(), surrogate=RandomForestSurrogate()).encoding == "path"
    assert BananasSampler(DagSpace(), surrogate=RandomForestSurrogate()).encoding == "onehot"
    with pytest.raises(ConfigError, match="search space 'dag'; its encodings: onehot, proxy"):
        BananasSampler(DagSpace(), surrogate=RandomForestSurrogate(), encoding="path")


def test_unknown_encoding_names_the_choices():
    with pytest.raises(ConfigError, match="path"):
        make_encoding("graph", NB201Space())


def test_proxy_encoding_falls_back_to_params_and_flops_without_proxy_plugins():
    host = PluginHost(disable_plugins=["proxies"])
    assert "synflow" not in host.registry("proxies")
    space = NB201Space(N=1, C=4)
    enc = ProxyEncoding(space, host=host, input_shape=(3, 8, 8))
    assert enc.names == ["params", "flops"]
    a = space.parse("|nor_conv_3x3~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|")
    b = space.parse("|none~0|+|none~0|none~1|+|skip_connect~0|none~1|none~2|")
    x = enc.encode([a, b])
    assert x.shape == (2, 2) and np.all(x[0] > x[1])  # a conv adds params and FLOPs
    assert np.isclose(x[1, 0], np.log1p(count_params(space.build(b, 10, (3, 8, 8)))))


def test_proxy_encoding_uses_registered_data_free_proxies_by_default():
    registered = set(frugalnas.list_components("proxies"))
    scorer = ProxyScorer(NB201Space(N=1, C=4), host=frugalnas.PluginHost(), input_shape=(3, 8, 8))
    expected = [p for p in ("synflow", "params", "flops") if p in registered] or ["params", "flops"]
    assert scorer.names == expected
    arch = NB201Space().parse("|nor_conv_3x3~0|+|nor_conv_1x1~0|skip_connect~1|+"
                              "|skip_connect~0|none~1|avg_pool_3x3~2|")
    assert np.all(np.isfinite(scorer.score(arch)))


def test_unknown_proxy_is_a_config_error():
    with pytest.raises(ConfigError, match="unknown proxy 'telepathy'"):
        ProxyScorer(NB201Space(), ["telepathy"], host=frugalnas.PluginHost())


def test_acquisitions_rank_as_expected():
    mean, std = np.array([1.0, 1.0, 2.0]), np.array([0.1, 1.0, 0.1])
    ei = acquisition("ei", mean, std, best=1.5)
    assert ei[2] > ei[1] > ei[0] >= 0
    assert np.argmax(acquisition("ucb", mean, std, best=0, kappa=3.0)) == 1
    assert np.argmax(acquisition("mean", mean, std, best=0)) == 2
    with pytest.raises(ConfigError, match="ucb"):
        acquisition("pi", mean, std, best=0)


def test_rank_quality():
    assert rank_quality([1, 2, 3], [10, 20, 30]) == {"kendall_tau": 1.0, "spearman": 1.0}
    assert rank_quality([1, 2, 3], [3, 2, 1])["kendall_tau"] == -1.0
    assert rank_quality([1, 1, 1], [1, 2, 3]) == {"kendall_tau": 0.0, "spearman": 0.0}
