"""Search strategies (built-in plugin ``strategies``): regularized evolution, local search,
surrogate-assisted evolution, BANANAS, multi-objective evolution and the proxy pre-screen
wrapper, each an optuna sampler that rebuilds its state from the study's storage; and optuna's
TPE, NSGA-II/III and GP samplers by name (``tpe``, ``nsga2``, ``nsga3``, ``gp``). Random search
is the plugin ``random`` (:mod:`frugalnas.strategies.random`)."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory
from frugalnas.multiobjective.hypervolume import check_reference_point

#: name -> (module:factory, summary): the strategies this plugin registers, named so that
#: registering imports none of them (nor optuna, scipy, scikit-learn or torch); the summary is
#: the first paragraph of the factory's docstring.
STRATEGIES: dict[str, tuple[str, str]] = {
    "regularized-evolution": (
        "regularized:RegularizedEvolutionSampler",
        "Regularized (aging) evolution of Real et al. 2019: mutate the best of a random "
        "sample."),
    "local-search": (
        "local_search:LocalSearchSampler",
        "Local search: evaluate unseen one-edit neighbours of the best architecture so far."),
    "surrogate-evolution": (
        "surrogate_search:SurrogateEvolutionSampler",
        "Surrogate-assisted regularized evolution: a surrogate pre-screens the offspring."),
    "bananas": (
        "surrogate_search:BananasSampler",
        "BANANAS (White et al., AAAI 2021): ensemble surrogate, path encoding, mutation "
        "search."),
    "mo-evolution": (
        "mo_evolution:MultiObjectiveEvolutionSampler",
        "Multi-objective regularized evolution (see the module docstring)."),
    "prescreen": (
        "prescreen:prescreen_strategy",
        "Pre-screen: the inner strategy proposes k candidates, a zero-cost proxy (or a rank "
        "ensemble of several, or a member preset such as ``\"selected\"``) keeps the best for "
        "the estimator."),
    "tpe": (
        "optuna_samplers:tpe",
        "optuna's Tree-structured Parzen Estimator (Bergstra et al. 2011; constraints as in "
        "Watanabe & Hutter 2023)."),
    "nsga2": (
        "optuna_samplers:nsga2",
        "optuna's NSGA-II (Deb et al. 2002) with constrained domination; for several "
        "objectives."),
    "nsga3": (
        "optuna_samplers:nsga3",
        "optuna's NSGA-III (Deb & Jain 2014); for many objectives."),
    "gp": (
        "optuna_samplers:gp",
        "optuna's Gaussian-process Bayesian optimisation (constrained expected improvement)."),
}


@hookimpl
def frugalnas_check_config(config: Any, host: Any) -> None:
    """Before the first trial: the reference point of ``mo-evolution``, ``surrogate-evolution``
    and ``bananas`` has one value per objective."""
    if config.strategy in ("mo-evolution", "surrogate-evolution", "bananas"):
        check_reference_point(config.strategy_options.get("reference_point"),
                              len(config.directions))


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {name: LazyFactory(f"frugalnas.strategies.{target}", summary)
            for name, (target, summary) in STRATEGIES.items()}
