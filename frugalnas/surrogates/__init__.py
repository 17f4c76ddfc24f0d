"""Performance predictors (surrogates), architecture encodings and acquisition functions.

Every surrogate follows the scikit-learn convention: parameters in ``__init__``,
``fit(X, y)`` returns ``self``, ``predict(X)`` returns ``(mean, std)``. This package is the
built-in plugin ``surrogates``; create one by name with ``host.create("surrogates", NAME)``.
"""

from typing import Any

from frugalnas.core.plugins import hookimpl
from frugalnas.surrogates.acquisition import ACQUISITIONS, acquisition
from frugalnas.surrogates.base import Surrogate
from frugalnas.surrogates.checks import SurrogateCheckError, check_surrogate
from frugalnas.surrogates.encodings import ENCODINGS, Encoding, make_encoding
from frugalnas.surrogates.forest import RandomForestSurrogate
from frugalnas.surrogates.gbm import LightGBMSurrogate
from frugalnas.surrogates.gp import GPSurrogate
from frugalnas.surrogates.mlp_ensemble import MLPEnsembleSurrogate
from frugalnas.surrogates.quality import rank_quality

__all__ = [
    "ACQUISITIONS", "ENCODINGS", "Encoding", "GPSurrogate", "LightGBMSurrogate",
    "MLPEnsembleSurrogate", "RandomForestSurrogate", "Surrogate", "SurrogateCheckError",
    "acquisition", "check_surrogate", "make_encoding", "rank_quality",
]


@hookimpl
def frugalnas_surrogates() -> dict[str, Any]:
    return {"lightgbm": LightGBMSurrogate, "random-forest": RandomForestSurrogate,
            "gp": GPSurrogate, "mlp-ensemble": MLPEnsembleSurrogate}
