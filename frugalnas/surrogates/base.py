"""The surrogate contract: scikit-learn style, ``fit(X, y)`` then ``predict(X) -> (mean, std)``."""

from __future__ import annotations

from abc import abstractmethod
from typing import Any

import numpy as np
from sklearn.base import BaseEstimator
from sklearn.exceptions import NotFittedError

from frugalnas.ports.errors import ConfigError


class Surrogate(BaseEstimator):
    """A performance predictor. Parameters are set in ``__init__`` only (stored unchanged, so
    ``get_params``/``sklearn.base.clone`` work); learned state lives in attributes ending in
    ``_``. ``predict`` returns the predicted mean and a standard deviation (>= 0)."""

    def fit(self, X: Any, y: Any) -> "Surrogate":
        """Learn from features ``X`` (n, d) and targets ``y`` (n,); returns ``self``."""
        X, y = _check_xy(X, y)
        self.n_features_in_ = X.shape[1]
        self._fit(X, y)
        return self

    def predict(self, X: Any) -> tuple[np.ndarray, np.ndarray]:
        """Predicted mean and standard deviation, each of shape (n,)."""
        if not hasattr(self, "n_features_in_"):
            raise NotFittedError(f"{type(self).__name__} is not fitted yet; call fit(X, y) "
                                 "before predict(X)")
        X = _check_x(X)
        if X.shape[1] != self.n_features_in_:
            raise ConfigError(f"{type(self).__name__} was fitted on {self.n_features_in_} "
                              f"features but predict got {X.shape[1]}")
        mean, std = self._predict(X)
        return (np.asarray(mean, dtype=np.float64).reshape(-1),
                np.maximum(np.asarray(std, dtype=np.float64).reshape(-1), 0.0))

    @abstractmethod
    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        """Fit on validated arrays."""

    @abstractmethod
    def _predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Mean and std on validated arrays."""


def _check_x(X: Any) -> np.ndarray:
    X = np.asarray(X, dtype=np.float64)
    if X.ndim != 2:
        raise ConfigError(f"X must be a 2-d array (n_samples, n_features), got shape {X.shape}")
    if not np.all(np.isfinite(X)):
        raise ConfigError("X contains NaN or infinite values")
    return X


def _check_xy(X: Any, y: Any) -> tuple[np.ndarray, np.ndarray]:
    X = _check_x(X)
    y = np.asarray(y, dtype=np.float64).reshape(-1)
    if len(y) != len(X):
        raise ConfigError(f"X has {len(X)} rows but y has {len(y)} values")
    if len(y) < 2:
        raise ConfigError(f"a surrogate needs at least 2 training samples, got {len(y)}")
    if not np.all(np.isfinite(y)):
        raise ConfigError("y contains NaN or infinite values")
    return X, y
