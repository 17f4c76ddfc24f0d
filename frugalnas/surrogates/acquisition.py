"""Acquisition functions over a surrogate's (mean, std), higher is better."""

from __future__ import annotations

from typing import TYPE_CHECKING

from frugalnas.ports.errors import check_choice

if TYPE_CHECKING:
    import numpy as np

ACQUISITIONS = ("ei", "ucb", "mean", "its")


def acquisition(name: str, mean: np.ndarray, std: np.ndarray, best: float, kappa: float = 2.0,
                rng: np.random.Generator | None = None) -> np.ndarray:
    """``ei`` (expected improvement over ``best``), ``ucb`` (``mean + kappa*std``), ``mean``, or
    ``its`` (independent Thompson sampling: one normal draw per candidate, needs ``rng``)."""
    # Imported here: the surrogates package imports this module when it loads.
    import numpy as np
    from scipy.stats import norm

    check_choice("acquisition", name, ACQUISITIONS)
    mean, std = np.asarray(mean, float), np.maximum(np.asarray(std, float), 1e-12)
    if name == "mean":
        return mean
    if name == "ucb":
        return mean + kappa * std
    if name == "its":
        rng = rng if rng is not None else np.random.default_rng(0)
        return mean + std * rng.standard_normal(len(mean))
    z = (mean - best) / std
    return std * (z * norm.cdf(z) + norm.pdf(z))
