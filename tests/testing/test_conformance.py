"""The conformance suite (frugalnas.testing): every built-in component passes it, and broken
components fail the relevant check with a message naming the component and the rule."""

import random
import subprocess
import sys

import optuna
import pytest
import torch

import frugalnas
from frugalnas.host.kinds import KINDS
from frugalnas.host.plugins import BUILTIN_PLUGINS, PluginHost
from frugalnas.proxies import ProxyCheckError
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.testing import (CheckSetup, ConformanceError, check_backend, check_component,
                               check_dataset, check_estimator, check_proxy,
                               check_search_space, check_strategy, check_surrogate,
                               check_unknown_option_is_rejected, component_checks,
                               parametrize_with_checks)

#: Built-in plugins only: a plugin installed in the environment is not ours to check here.
HOST = PluginHost(autoload=False)

#: Built-ins that break a check because of code outside the conformance suite; each must be
#: fixed there (strict: the case fails once it passes, so the entry must then be removed).
EXPECTED_FAILURES = {
}


@parametrize_with_checks(HOST, expected_failures=EXPECTED_FAILURES)
def test_builtin_component_conforms(check):
    check()


def test_every_builtin_component_of_every_kind_is_covered():
    cases = component_checks(HOST)
    covered = {(c.kind, c.name) for c in cases}
    for kind in KINDS:
        registry = HOST.estimators() if kind == "estimators" else HOST.registry(kind)
        assert registry.names(), kind
        assert {(kind, n) for n in registry} <= covered
    ids = {c.id for c in cases}
    assert "strategies:random:check_proposals" in ids
    assert "estimators:synflow:check_unknown_option_is_rejected" in ids  # derived estimators
    assert all(c.kind in KINDS and c.id.count(":") == 2 for c in cases)
    assert {c.name for c in component_checks(HOST, ["strategies"], plugins=["random"])} == \
        {"random"}
    assert set(BUILTIN_PLUGINS) >= {HOST.registry(k).get(n).plugin
                                    for k in KINDS if k != "estimators" for n in HOST.registry(k)}


def test_check_component_runs_every_check_of_its_kind():
    ran = check_component(HOST, "search_spaces", "nb201",
                          setup=CheckSetup(options={"N": 1, "C": 4}),
                          checks=["check_round_trips", "check_build",
                                  "check_unknown_option_is_rejected"])
    assert ran == ["check_round_trips", "check_build", "check_unknown_option_is_rejected"]
    assert check_component(HOST, "datasets", "synthetic")[-1] == \
        "check_unknown_option_is_rejected"


def test_expected_failures_must_name_a_case():
    with pytest.raises(ValueError, match="names no case"):
        parametrize_with_checks(HOST, ["backends"],
                                expected_failures={"backends:singel-device": "typo"})


def test_importing_frugalnas_testing_stays_light():
    code = ("import sys, frugalnas.testing as t; "
            "print(sorted(m for m in ('mlflow', 'frugalnas.testing.components', "
            "'frugalnas.testing.spaces') if m in sys.modules)); "
            "print(t.check_search_space.__module__)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.split()
    assert out == ["[]", "frugalnas.testing.spaces"]


# -- broken components fail the relevant check ------------------------------------------
class StuckSpace(NB201Space):
    """mutate() gives the parent back."""

    def mutate(self, arch, rng):
        return arch


class WrongOutputSpace(NB201Space):
    """build() ignores num_classes."""

    def build(self, arch, num_classes=10, input_shape=(3, 32, 32)):
        return super().build(arch, 3, input_shape)


class UnseededSpace(NB201Space):
    """sample() ignores the generator it is given."""

    def sample(self, rng):
        return super().sample(random.Random())


@pytest.mark.parametrize("space, check, message", [
    (StuckSpace(N=1, C=4), "check_mutate", "returned the architecture it was given"),
    (WrongOutputSpace(N=1, C=4), "check_build", r"expected \(2, 5\) logits"),
    (UnseededSpace(N=1, C=4), "check_same_seed_same_sample", "same seed"),
])
def test_broken_search_space_fails(space, check, message):
    with pytest.raises(ConformanceError, match=message) as info:
        check_search_space(space, checks=[check])
    assert info.value.check == check
    assert "search space 'nb201' (" in str(info.value)


class Bragging(frugalnas.Estimator):
    """Declares a metric it never produces."""

    name = "bragging"
    needs_dataset = False
    provides = ("accuracy",)
    measures = ("seconds",)

    def evaluate(self, arch, context):
        return frugalnas.EstimateResult(value=1.0, cost=frugalnas.Cost(seconds=0.1))


class SecretlyNeedsData(Bragging):
    """Says it needs no dataset, then reads it."""

    provides = ()

    def evaluate(self, arch, context):
        return frugalnas.EstimateResult(value=float(len(context.dataset.train_x)),
                                        cost=frugalnas.Cost(seconds=0.1))


class Noisy(Bragging):
    """Scores at random."""

    provides = ()

    def evaluate(self, arch, context):
        return frugalnas.EstimateResult(value=random.random(), cost=frugalnas.Cost(seconds=0.1))


@pytest.mark.parametrize("estimator, check, message", [
    (Bragging(), "check_evaluate", r"lacks the metric\(s\) \['accuracy'\]"),
    (SecretlyNeedsData(), "check_needs_dataset", "needs_dataset is False"),
    (Noisy(), "check_reproducible", "same seed"),
])
def test_broken_estimator_fails(estimator, check, message):
    with pytest.raises(ConformanceError, match=message) as info:
        check_estimator(estimator, checks=[check])
    assert str(info.value).startswith(f"estimator 'bragging' ({type(estimator).__name__}) "
                                      f"fails {check}")


class Repeating(optuna.samplers.RandomSampler):
    """propose() gives k copies of one architecture."""

    def __init__(self, space, seed=0):
        super().__init__(seed=seed)
        self.space = space

    def propose(self, study, trial, k):
        return [self.space.sample(random.Random(0))] * k


def unseeded(space=None, seed=0):
    """Ignores its seed."""
    return optuna.samplers.RandomSampler(seed=None)


@pytest.mark.parametrize("strategy, check, message", [
    (Repeating, "check_propose", "repeated an architecture"),
    (unseeded, "check_reproducible", "diverge at trial 0"),
])
def test_broken_strategy_fails(strategy, check, message):
    with pytest.raises(ConformanceError, match=message):
        check_strategy(strategy, NB201Space(N=1, C=4), n_trials=3, checks=[check])


def test_plain_optuna_sampler_passes_and_has_nothing_to_propose():
    factory = lambda space, seed: optuna.samplers.TPESampler(seed=seed)  # noqa: E731
    ran = check_strategy(factory, "nb201", host=HOST, n_trials=3)
    assert ran == ["check_is_sampler", "check_proposals", "check_reproducible"]


class Lazy(frugalnas.Backend):
    """train_step never steps the optimizer; trial_outputs returns a list."""

    name = "lazy"
    device = torch.device("cpu")

    def train_step(self, model, optimizer, loss_fn, inputs, targets, step):
        return float(loss_fn(model(inputs), targets).detach())

    def trial_outputs(self):
        return [{}, {}]


@pytest.mark.parametrize("check, message", [
    ("check_training_reduces_loss", "did not reduce the loss"),
    ("check_trial_outputs", r"expected a tuple \(metrics, artifacts\)"),
])
def test_broken_backend_fails(check, message):
    with pytest.raises(ConformanceError, match=message):
        check_backend(Lazy(), checks=[check])


def _data(seed, leak=False, bad_label=False):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(40, 1, 4, 4, generator=g)
    y = torch.arange(40) % 3
    if bad_label:
        y[0] = 3
    valid = slice(0, 10) if leak else slice(30, 40)
    return frugalnas.Dataset("toy", x[:30], y[:30], x[valid], y[valid], 3)


@pytest.mark.parametrize("dataset, check, message", [
    (lambda seed: _data(seed, leak=True), "check_splits_disjoint", "10 of 10 validation"),
    (lambda seed: _data(seed, bad_label=True), "check_labels", r"outside \[0, num_classes=3\)"),
    (lambda seed: _data(0), "check_seeded", "give the same split"),
])
def test_broken_dataset_fails(dataset, check, message):
    assert check_dataset(lambda seed: _data(seed)) == list(
        ("check_shapes", "check_labels", "check_splits_disjoint", "check_seeded"))
    with pytest.raises(ConformanceError, match=message):
        check_dataset(dataset, checks=[check])


class Meddling(frugalnas.proxies.Proxy):
    """Scores by changing the network's weights."""

    name = "meddling"
    needs_data = False
    needs_labels = False

    def compute(self, model, inputs, targets):
        for p in model.parameters():
            p.data.mul_(2.0)
        return 1.0

    def score(self, model, inputs, targets=None):  # no restoring wrapper
        return float(self.compute(model, inputs, targets))


def test_broken_proxy_fails_as_conformance_and_proxy_check_error():
    with pytest.raises(ConformanceError, match="rule 'no-mutation'") as info:
        check_proxy(Meddling())
    assert isinstance(info.value, ProxyCheckError)
    assert "proxy 'meddling' (Meddling) fails check_proxy_contract" in str(info.value)


class Overconfident:
    """A surrogate with negative uncertainty."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def get_params(self, deep=True):
        return {"seed": self.seed}

    def set_params(self, **params):
        self.seed = params.get("seed", self.seed)
        return self

    def fit(self, X, y):
        self.mean_ = float(y.mean())
        return self

    def predict(self, X):
        if not hasattr(self, "mean_"):
            raise RuntimeError("call fit first")
        return X[:, 0] * 0 + X[:, 0], -X[:, 0] - 1


def test_broken_surrogate_fails():
    with pytest.raises(ConformanceError, match="std-non-negative"):
        check_surrogate(Overconfident())


# -- options ----------------------------------------------------------------------------
def swallowing_space(**options):
    """A factory that swallows every option."""
    return NB201Space(N=1, C=4)


def typed_space(N: int = 1, **options):
    """A factory that passes unknown options on, so they end as a TypeError."""
    return NB201Space(N=N, C=4, **options)


class BrokenPlugin:
    @frugalnas.hookimpl
    def frugalnas_search_spaces(self):
        return {"swallowing": swallowing_space, "typed": typed_space, "stuck": StuckSpace}


BROKEN_HOST = PluginHost([BrokenPlugin()], autoload=False)


@pytest.mark.parametrize("name, message", [
    ("swallowing", "was accepted silently"), ("typed", "raised TypeError")])
def test_a_misspelt_option_must_be_a_config_error(name, message):
    with pytest.raises(ConformanceError, match=message) as info:
        check_unknown_option_is_rejected(BROKEN_HOST, "search_spaces", name)
    assert "registered by plugin 'BrokenPlugin'" in str(info.value)
    assert check_unknown_option_is_rejected(BROKEN_HOST, "search_spaces", "stuck") == "Nx"


def test_a_plugin_component_is_checked_by_name():
    cases = {c.id: c for c in component_checks(BROKEN_HOST, ["search_spaces"],
                                               plugins=["BrokenPlugin"])}
    assert "search_spaces:stuck:check_mutate" in cases and len(cases) == 3 * 11
    cases["search_spaces:stuck:check_round_trips"]()
    with pytest.raises(ConformanceError, match="mutate"):
        cases["search_spaces:stuck:check_mutate"]()
    with pytest.raises(ConformanceError, match="search space 'stuck'"):
        check_component(BROKEN_HOST, "search_spaces", "stuck",
                        setup=CheckSetup(options={"N": 1, "C": 4}))
