"""How a plugin author tests a plugin: frugalnas's conformance suite (frugalnas.testing) on
every component the plugin registers, and the fixtures frugalnas exports to pytest."""

from frugalnas import PluginHost
from frugalnas.testing import (CheckSetup, check_proxy, check_search_space,
                               parametrize_with_checks)
from frugalnas_hello import LogitSpread, MLPSpace

# "-p hello": the plugin loads even where entry-point autoloading is switched off.
HOST = PluginHost(["hello"])


# One pytest case per component of the plugin and check of its kind, with ids such as
# "search_spaces:hello-mlp:check_build"; the misspelt-option check is among them.
@parametrize_with_checks(HOST, plugins=["hello"])
def test_component_conforms(check):
    check()


# The proxy is also an estimator of the same name (registered by the ``proxies`` plugin);
# check it on this plugin's own space and on the digits, not on the default tiny NB201 space.
@parametrize_with_checks(HOST, ["estimators"], names=["hello-logit-spread"], setups={
    ("estimators", "hello-logit-spread"): CheckSetup(space="hello-mlp", space_options={},
                                                     dataset="digits", dataset_options={})})
def test_proxy_estimator_conforms(check):
    check()


def test_objects_conform_before_registration():
    check_search_space(MLPSpace(max_depth=2, widths=(4, 8)), input_shapes=[(1, 8, 8)])
    assert "no-mutation" in check_proxy(LogitSpread(seed=1))


def test_components_are_registered(frugalnas_host):
    assert "hello-mlp" in frugalnas_host.registry("search_spaces")
    assert frugalnas_host.registry("proxies").get("hello-logit-spread").plugin == "hello"


def test_a_study_runs(frugalnas_study_factory):
    study = frugalnas_study_factory(space="hello-mlp", estimator="train", dataset="digits",
                                    estimator_options={"epochs": 1}, disable_plugins=["mlflow"])
    study.optimize(n_trials=2)
    assert len(study.completed_trials()) == 2
    assert study.best_trial.architecture.space == "hello-mlp"
