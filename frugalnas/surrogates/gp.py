"""Gaussian-process surrogate (scikit-learn): Matern 5/2 kernel plus a noise term."""

from __future__ import annotations

import warnings

import numpy as np

from frugalnas.surrogates.base import Surrogate


class GPSurrogate(Surrogate):
    """Gaussian process regressor (Matern 5/2 + white noise, normalised targets); exact predictive std."""

    def __init__(self, length_scale: float = 2.0, noise: float = 0.1, n_restarts: int = 2,
                 seed: int = 0):
        self.length_scale = length_scale
        self.noise = noise
        self.n_restarts = n_restarts
        self.seed = seed

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        from sklearn.gaussian_process import GaussianProcessRegressor
        from sklearn.gaussian_process.kernels import ConstantKernel, Matern, WhiteKernel

        kernel = (ConstantKernel(1.0, (1e-3, 1e3)) * Matern(self.length_scale, (1e-2, 1e3), nu=2.5)
                  + WhiteKernel(self.noise, (1e-6, 1e1)))
        self.model_ = GaussianProcessRegressor(kernel=kernel, normalize_y=True,
                                               n_restarts_optimizer=self.n_restarts,
                                               random_state=self.seed)
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # convergence warnings on tiny training sets
            self.model_.fit(X, y)

    def _predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        mean, std = self.model_.predict(X, return_std=True)
        return mean, std
