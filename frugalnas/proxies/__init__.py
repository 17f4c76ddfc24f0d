"""Zero-cost proxies and rank ensembles (built-in plugin ``proxies``): each proxy scores an
untrained network, and every proxy is also an estimator of its own name."""

from __future__ import annotations

import functools
from typing import Any

from frugalnas.core.plugins import PluginHost, hookimpl
from frugalnas.proxies.activation import JacobCov, Naswot, Zen
from frugalnas.proxies.aznas import AZExpressivity, AZProgressivity, AZTrainability
from frugalnas.proxies.base import LatencyProbe, Proxy, ProxyBatch, ProxyEstimator
from frugalnas.proxies.checks import ProxyCheckError
from frugalnas.proxies.ensemble import LearnedEnsembleEstimator, RankEnsembleEstimator
from frugalnas.proxies.epe import EpeNas
from frugalnas.proxies.gradient import Fisher, Grasp, GradNorm, Plain, Snip, Synflow
from frugalnas.proxies.meco import MeCo
from frugalnas.proxies.size import Flops, L2Norm, Params
from frugalnas.proxies.swap import Swap, SwapReg
from frugalnas.proxies.tenas import LinearRegions, NTKCondition
from frugalnas.proxies.zico import ZiCo

__all__ = ["LatencyProbe", "Proxy", "ProxyBatch", "ProxyCheckError", "ProxyEstimator"]

PROXIES = (Synflow, Snip, Grasp, GradNorm, Fisher, Plain, JacobCov, Naswot, Zen, Params, Flops,
           L2Norm,
           # proxies of 2021-2024 (ZiCo, MeCo, SWAP, AZ-NAS, TE-NAS, EPE-NAS)
           ZiCo, MeCo, Swap, SwapReg, AZExpressivity, AZProgressivity, AZTrainability,
           NTKCondition, LinearRegions, EpeNas)


@hookimpl
def frugalnas_proxies() -> dict[str, Any]:
    return {cls.name: cls for cls in PROXIES}


@hookimpl
def frugalnas_derived_estimators(host: PluginHost) -> dict[str, Any]:
    """Every proxy of ``host`` as an estimator of its own name, belonging to the plugin that
    registered the proxy."""
    found = {}
    for component in host.registry("proxies").describe():
        factory = functools.partial(ProxyEstimator, component["name"])
        factory.__doc__ = f"The {component['name']} proxy as an estimator: {component['summary']}"
        factory.derived_from = ("proxies", component["name"])  # type: ignore[attr-defined]
        found[component["name"]] = factory
    return found


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"rank-ensemble": RankEnsembleEstimator, "learned-ensemble": LearnedEnsembleEstimator}
