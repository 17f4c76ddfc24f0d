"""EPE-NAS: how uncorrelated the input Jacobians are within each class.

Lopes, Santos, Alexandre, "EPE-NAS: Efficient Performance Estimation Without Training for
Neural Architecture Search", ICANN 2021. With ``J_i = d(sum_k f_k(x_i)) / d x_i`` the input
Jacobian of sample ``i`` (flattened) and ``Sigma_c`` the correlation matrix of the
Jacobians of the samples of class ``c``:

    e_c = sum_{i, j} log(|Sigma_c[i, j]| + k),   k = 1e-5
    EPE = sum_c |e_c|                                   (at most 100 classes)
    EPE = (1 / C) sum_c sum_c' |e_c - e_c'|             (more than 100 classes)

A network whose Jacobians are less correlated within a class (it tells samples apart)
scores higher. It extends jacob_cov (Mellor et al. 2020) with the labels.
"""

from __future__ import annotations

import numpy as np
from frugalnas.proxies.activation import input_jacobians
from frugalnas.proxies.base import Proxy

EPSILON = 1e-5


def class_correlation_score(jac: np.ndarray) -> float:
    """sum of log(|corr| + k) over the correlation matrix of the rows of ``jac``; undefined
    correlations (a constant row) count as 1, no information."""
    if len(jac) < 2:
        return float(np.log(1.0 + EPSILON))
    centred = jac - jac.mean(axis=1, keepdims=True)
    norm = np.linalg.norm(centred, axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        corr = (centred @ centred.T) / np.outer(norm, norm)
    corr = np.where(np.isfinite(corr), corr, 1.0)
    return float(np.sum(np.log(np.abs(corr) + EPSILON)))


def epe_score(jac: np.ndarray, labels: np.ndarray, num_classes: int) -> float:
    """EPE-NAS from per-sample input Jacobians ``(n, d)`` and their labels."""
    per_class = [class_correlation_score(jac[labels == c]) for c in np.unique(labels)]
    if num_classes <= 100:
        return float(np.sum(np.abs(per_class)))
    e = np.asarray(per_class)
    return float(np.abs(e[:, None] - e[None, :]).sum() / len(e))


class EpeNas(Proxy):
    """epe_nas: sum over classes of |sum log(|corr| + 1e-5)| of the per-class input-Jacobian
    correlations (Lopes et al., ICANN 2021)."""

    name = "epe_nas"
    needs_data = True
    needs_labels = True
    passes = 3.0

    def compute(self, model, inputs, targets) -> float:
        return self.compute_shared(model, inputs, targets, None)

    def compute_shared(self, model, inputs, targets, shared) -> float:
        jac, outputs = input_jacobians(model, inputs, shared)  # shared with jacob_cov
        return epe_score(jac, targets.detach().cpu().numpy(), outputs)
