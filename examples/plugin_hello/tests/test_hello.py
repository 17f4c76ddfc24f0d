"""How a plugin author tests a plugin: frugalnas's conformance suite (frugalnas.testing) on
every component the plugin registers, and the fixtures frugalnas exports to pytest."""

from frugalnas import PluginHost
from frugalnas.testing import (check_proxy, check_search_space, check_strategy,
                               parametrize_with_checks)
from frugalnas_hello import HillClimb, LogitSpread, MLPSpace

# "-p hello": the plugin loads even where entry-point autoloading is switched off.
HOST = PluginHost(["hello"])


# One pytest case per component of the plugin and check of its kind, with ids such as
# "search_spaces:hello-mlp:check_build"; the misspelt-option check is among them. The proxy
# is checked twice: as a proxy and as the estimator of the same name every proxy also is.
@parametrize_with_checks(HOST, plugins=["hello"])
def test_component_conforms(check):
    check()


def test_objects_conform_before_registration():
    check_search_space(MLPSpace(max_depth=2, widths=(4, 8)), input_shapes=[(1, 8, 8)])
    # the names of the proxy rules checked; labels-optional because needs_labels is False
    assert check_proxy(LogitSpread(seed=1))[-1] == "labels-optional"
    # a class (called as cls(space=..., seed=..., **options)) or a sampler object
    assert "check_propose" in check_strategy(HillClimb, "nb201", n_trials=5)
    space = HOST.create("search_spaces", "nb201", N=1, C=4)
    assert "check_propose" in check_strategy(HillClimb(space, explore=0.5), space, n_trials=5)


def test_components_are_registered(frugalnas_host):
    assert "hello-mlp" in frugalnas_host.registry("search_spaces")
    assert frugalnas_host.registry("proxies").get("hello-logit-spread").plugin == "hello"
    # the estimator made from the proxy belongs to this plugin too
    assert frugalnas_host.estimators().get("hello-logit-spread").plugin == "hello"
    assert frugalnas_host.registry("strategies").get("hello-climb").plugin == "hello"


def test_the_strategy_searches_the_plugins_space(frugalnas_study_factory):
    study = frugalnas_study_factory(space="hello-mlp", strategy="hello-climb",
                                    strategy_options={"n_init": 2, "explore": 0.0},
                                    estimator="hello-logit-spread", dataset="digits",
                                    disable_plugins=["mlflow"])
    study.optimize(n_trials=5)
    archs = [str(t.architecture) for t in study.completed_trials()]
    assert len(archs) == 5 and len(set(archs)) == 5  # never the same architecture twice


def test_a_study_runs(frugalnas_study_factory):
    study = frugalnas_study_factory(space="hello-mlp", estimator="train", dataset="digits",
                                    estimator_options={"epochs": 1}, disable_plugins=["mlflow"])
    study.optimize(n_trials=2)
    assert len(study.completed_trials()) == 2
    assert study.best_trial.architecture.space == "hello-mlp"
