"""Random forest surrogate (scikit-learn); uncertainty = spread of the trees."""

from __future__ import annotations

import numpy as np

from frugalnas.surrogates.base import Surrogate


class RandomForestSurrogate(Surrogate):
    """Random forest regressor; uncertainty = standard deviation over its trees."""

    def __init__(self, n_estimators: int = 100, max_features: float | str | None = 0.5,
                 min_samples_leaf: int = 1, seed: int = 0):
        self.n_estimators = n_estimators
        self.max_features = max_features
        self.min_samples_leaf = min_samples_leaf
        self.seed = seed

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        from sklearn.ensemble import RandomForestRegressor

        self.model_ = RandomForestRegressor(
            n_estimators=self.n_estimators, max_features=self.max_features,
            min_samples_leaf=self.min_samples_leaf, random_state=self.seed, n_jobs=1).fit(X, y)

    def _predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        preds = np.stack([t.predict(X) for t in self.model_.estimators_])
        return preds.mean(0), preds.std(0)
