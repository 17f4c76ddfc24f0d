"""Performance predictors (surrogates), architecture encodings and acquisition functions.

Every surrogate follows the scikit-learn convention: parameters in ``__init__``,
``fit(X, y)`` returns ``self``, ``predict(X)`` returns ``(mean, std)``. They are registered
by the built-in plugin ``surrogates`` and created by name with
``frugalnas.create_component("surrogates", NAME, **params)``.
"""

from .acquisition import ACQUISITIONS, acquisition
from .base import Surrogate
from .checks import SurrogateCheckError, check_surrogate
from .encodings import ENCODINGS, Encoding, make_encoding
from .forest import RandomForestSurrogate
from .gbm import LightGBMSurrogate
from .gp import GPSurrogate
from .mlp_ensemble import MLPEnsembleSurrogate
from .quality import rank_quality

__all__ = [
    "ACQUISITIONS", "ENCODINGS", "Encoding", "GPSurrogate", "LightGBMSurrogate",
    "MLPEnsembleSurrogate", "RandomForestSurrogate", "Surrogate", "SurrogateCheckError",
    "acquisition", "check_surrogate", "make_encoding", "rank_quality",
]
