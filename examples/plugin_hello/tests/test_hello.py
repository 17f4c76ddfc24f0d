"""How a plugin author tests a plugin with the fixtures frugalnas exports to pytest."""

import frugalnas


def test_components_are_registered(frugalnas_host):
    assert "hello-mlp" in frugalnas_host.registry("search_spaces")
    assert frugalnas_host.registry("proxies").get("hello-logit-spread").plugin == "hello"


def test_proxy_passes_the_conformance_check():
    from frugalnas.proxies.checks import check_proxy

    check_proxy("hello-logit-spread")


def test_a_study_runs(frugalnas_study_factory):
    study = frugalnas_study_factory(space="hello-mlp", estimator="train", dataset="digits",
                                    estimator_options={"epochs": 1}, disable_plugins=["mlflow"])
    study.optimize(n_trials=2)
    assert len(study.completed_trials()) == 2
    assert study.best_trial.architecture.space == "hello-mlp"
