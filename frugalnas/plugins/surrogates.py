"""Built-in plugin: performance predictors (LightGBM, random forest, GP, MLP ensemble)."""

from __future__ import annotations

from typing import Any

from ..core.plugins import hookimpl
from ..surrogates import (GPSurrogate, LightGBMSurrogate, MLPEnsembleSurrogate,
                          RandomForestSurrogate)


@hookimpl
def frugalnas_surrogates() -> dict[str, Any]:
    return {"lightgbm": LightGBMSurrogate, "random-forest": RandomForestSurrogate,
            "gp": GPSurrogate, "mlp-ensemble": MLPEnsembleSurrogate}
