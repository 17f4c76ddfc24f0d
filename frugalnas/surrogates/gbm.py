"""LightGBM surrogate: an ensemble of differently seeded, bagged boosters."""

from __future__ import annotations

import numpy as np

from frugalnas.ports.errors import check_range
from frugalnas.surrogates.base import Surrogate


class LightGBMSurrogate(Surrogate):
    """LightGBM regressor; uncertainty = spread of an ensemble of bagged boosters with different seeds."""

    def __init__(self, n_models: int = 5, n_estimators: int = 150, learning_rate: float = 0.05,
                 num_leaves: int = 15, min_child_samples: int = 3, subsample: float = 0.8,
                 colsample_bytree: float = 0.8, seed: int = 0):
        self.n_models = n_models
        self.n_estimators = n_estimators
        self.learning_rate = learning_rate
        self.num_leaves = num_leaves
        self.min_child_samples = min_child_samples
        self.subsample = subsample
        self.colsample_bytree = colsample_bytree
        self.seed = seed

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        import lightgbm

        check_range("n_models", self.n_models, 1)
        self.models_ = []
        for i in range(self.n_models):
            model = lightgbm.LGBMRegressor(
                n_estimators=self.n_estimators, learning_rate=self.learning_rate,
                num_leaves=self.num_leaves, min_child_samples=self.min_child_samples,
                subsample=self.subsample, subsample_freq=1 if self.subsample < 1 else 0,
                colsample_bytree=self.colsample_bytree, random_state=self.seed * 1000 + i,
                n_jobs=1, deterministic=True, force_row_wise=True, verbose=-1)
            self.models_.append(model.fit(X, y))

    def _predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        preds = np.stack([m.predict(X) for m in self.models_])
        return preds.mean(0), preds.std(0)
