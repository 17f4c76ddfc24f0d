"""Rank quality of a surrogate's predictions: Kendall tau and Spearman rho."""

from __future__ import annotations

import numpy as np
from scipy.stats import kendalltau, spearmanr


def rank_quality(y_true: np.ndarray, y_pred: np.ndarray) -> dict[str, float]:
    """``{"kendall_tau": ..., "spearman": ...}``; 0.0 where a correlation is undefined
    (constant input)."""
    y_true, y_pred = np.asarray(y_true, float), np.asarray(y_pred, float)
    if len(y_true) < 2 or np.ptp(y_true) == 0 or np.ptp(y_pred) == 0:
        return {"kendall_tau": 0.0, "spearman": 0.0}
    tau = kendalltau(y_true, y_pred).statistic
    rho = spearmanr(y_true, y_pred).statistic
    return {"kendall_tau": float(np.nan_to_num(tau)), "spearman": float(np.nan_to_num(rho))}
