"""Performance predictors (surrogates), architecture encodings and acquisition functions.

Every surrogate follows the scikit-learn convention: parameters in ``__init__``,
``fit(X, y)`` returns ``self``, ``predict(X)`` returns ``(mean, std)``. This package is the
built-in plugin ``surrogates``; create one by name with ``host.create("surrogates", NAME)``.
"""

from typing import Any

from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl
from frugalnas.host.registry import LazyFactory
# Eager: the module and this function share the name ``acquisition``, so the function must be
# bound here before anyone imports the module (which is light).
from frugalnas.surrogates.acquisition import ACQUISITIONS, acquisition

# Nothing here imports scikit-learn, LightGBM or torch until a name below is used.
__getattr__ = lazy_attributes(__name__, {
    "Surrogate": "frugalnas.surrogates.base",
    "SurrogateCheckError": "frugalnas.surrogates.checks",
    "check_surrogate": "frugalnas.surrogates.checks",
    "ENCODINGS": "frugalnas.surrogates.encodings",
    "Encoding": "frugalnas.surrogates.encodings",
    "make_encoding": "frugalnas.surrogates.choice",
    "RandomForestSurrogate": "frugalnas.surrogates.forest",
    "LightGBMSurrogate": "frugalnas.surrogates.gbm",
    "GPSurrogate": "frugalnas.surrogates.gp",
    "MLPEnsembleSurrogate": "frugalnas.surrogates.mlp_ensemble",
    "rank_quality": "frugalnas.surrogates.quality",
})

__all__ = [
    "ACQUISITIONS", "ENCODINGS", "Encoding", "GPSurrogate", "LightGBMSurrogate",
    "MLPEnsembleSurrogate", "RandomForestSurrogate", "Surrogate", "SurrogateCheckError",
    "acquisition", "check_surrogate", "make_encoding", "rank_quality",
]


@hookimpl
def frugalnas_surrogates() -> dict[str, Any]:
    return {
        "lightgbm": LazyFactory(
            "frugalnas.surrogates.gbm:LightGBMSurrogate",
            "LightGBM regressor; uncertainty = spread of an ensemble of bagged boosters with "
            "different seeds."),
        "random-forest": LazyFactory(
            "frugalnas.surrogates.forest:RandomForestSurrogate",
            "Random forest regressor; uncertainty = standard deviation over its trees."),
        "gp": LazyFactory(
            "frugalnas.surrogates.gp:GPSurrogate",
            "Gaussian process regressor (Matern 5/2 + white noise, normalised targets); exact "
            "predictive std."),
        "mlp-ensemble": LazyFactory(
            "frugalnas.surrogates.mlp_ensemble:MLPEnsembleSurrogate",
            "Ensemble of independently initialised torch MLPs; uncertainty = spread of their "
            "predictions."),
    }
