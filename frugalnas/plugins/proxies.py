"""Built-in plugin: zero-cost proxies, rank ensembles and the low-fidelity estimator."""

from __future__ import annotations

from typing import Any

from ..core.plugins import hookimpl
from ..proxies.activation import JacobCov, Naswot, Zen
from ..proxies.ensemble import LearnedEnsembleEstimator, RankEnsembleEstimator
from ..proxies.gradient import Fisher, Grasp, GradNorm, Plain, Snip, Synflow
from ..proxies.low_fidelity import LowFidelityEstimator
from ..proxies.size import Flops, L2Norm, Params

PROXIES = (Synflow, Snip, Grasp, GradNorm, Fisher, Plain, JacobCov, Naswot, Zen, Params, Flops,
           L2Norm)


@hookimpl
def frugalnas_proxies() -> dict[str, Any]:
    return {cls.name: cls for cls in PROXIES}


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"rank-ensemble": RankEnsembleEstimator, "learned-ensemble": LearnedEnsembleEstimator,
            "low-fidelity": LowFidelityEstimator}
