"""An ensemble of small torch MLPs trained together (as in BANANAS, White et al. 2021)."""

from __future__ import annotations

import math

import numpy as np
import torch

from frugalnas.ports.errors import check_range
from frugalnas.surrogates.base import Surrogate


class MLPEnsembleSurrogate(Surrogate):
    """Ensemble of independently initialised torch MLPs; uncertainty = spread of their predictions."""

    def __init__(self, n_models: int = 5, hidden: int = 32, layers: int = 2, epochs: int = 200,
                 lr: float = 0.01, weight_decay: float = 1e-4, seed: int = 0):
        self.n_models = n_models
        self.hidden = hidden
        self.layers = layers
        self.epochs = epochs
        self.lr = lr
        self.weight_decay = weight_decay
        self.seed = seed

    def _fit(self, X: np.ndarray, y: np.ndarray) -> None:
        # Tensors this small gain nothing from intra-op threads, and on a busy machine the
        # threads' synchronisation dominates: train on one thread, then restore the setting.
        threads = torch.get_num_threads()
        torch.set_num_threads(1)
        try:
            self._train(X, y)
        finally:
            torch.set_num_threads(threads)

    def _train(self, X: np.ndarray, y: np.ndarray) -> None:
        check_range("n_models", self.n_models, 1)
        check_range("layers", self.layers, 1)
        self.x_mean_, self.x_std_ = X.mean(0), X.std(0) + 1e-8
        self.y_mean_, self.y_std_ = float(y.mean()), float(y.std() + 1e-8)
        g = torch.Generator().manual_seed(int(self.seed))
        sizes = [X.shape[1]] + [self.hidden] * self.layers + [1]
        # Weights of all members stacked on a leading axis: one batched matmul trains them all.
        self.weights_ = []
        for d_in, d_out in zip(sizes[:-1], sizes[1:]):
            bound = 1.0 / math.sqrt(d_in)
            w = (torch.rand(self.n_models, d_in, d_out, generator=g) * 2 - 1) * bound * math.sqrt(3)
            b = (torch.rand(self.n_models, 1, d_out, generator=g) * 2 - 1) * bound
            self.weights_.append((w.requires_grad_(), b.requires_grad_()))
        xt = self._inputs(X)
        yt = torch.as_tensor((y - self.y_mean_) / self.y_std_, dtype=torch.float32)
        params = [p for pair in self.weights_ for p in pair]
        opt = torch.optim.Adam(params, lr=self.lr, weight_decay=self.weight_decay, foreach=True)
        for _ in range(self.epochs):
            opt.zero_grad()
            loss = ((self._forward(xt) - yt) ** 2).mean()
            loss.backward()
            opt.step()
        for w, b in self.weights_:
            w.requires_grad_(False)
            b.requires_grad_(False)

    def _inputs(self, X: np.ndarray) -> torch.Tensor:
        x = torch.as_tensor((X - self.x_mean_) / self.x_std_, dtype=torch.float32)
        return x.unsqueeze(0).expand(self.n_models, -1, -1)

    def _forward(self, x: torch.Tensor) -> torch.Tensor:
        for i, (w, b) in enumerate(self.weights_):
            x = torch.baddbmm(b, x, w)
            if i < len(self.weights_) - 1:
                x = torch.relu(x)
        return x.squeeze(-1)  # (n_models, n)

    def _predict(self, X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        with torch.no_grad():
            preds = self._forward(self._inputs(X)).double().numpy() * self.y_std_ + self.y_mean_
        return preds.mean(0), preds.std(0)
