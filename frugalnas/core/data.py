"""Dataset: in-memory tensors with a seeded train/validation split and batching helpers."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace

import torch
import torch.nn.functional as F

from frugalnas.core.errors import ConfigError


@dataclass(frozen=True)
class Dataset:
    """Images as float tensors ``(N, C, H, W)`` and integer labels, split in two."""

    name: str
    train_x: torch.Tensor
    train_y: torch.Tensor
    valid_x: torch.Tensor
    valid_y: torch.Tensor
    num_classes: int

    @property
    def input_shape(self) -> tuple[int, int, int]:
        return tuple(self.train_x.shape[1:])  # type: ignore[return-value]

    def split(self, which: str) -> tuple[torch.Tensor, torch.Tensor]:
        if which == "train":
            return self.train_x, self.train_y
        if which in ("valid", "validation"):
            return self.valid_x, self.valid_y
        raise ValueError(f"unknown split {which!r}; valid: 'train', 'valid'")

    def batches(self, which: str, batch_size: int, *, shuffle: bool = True, seed: int = 0,
                epoch: int = 0, drop_last: bool = False) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        """Mini-batches of a split; the order depends only on ``(seed, epoch)``."""
        x, y = self.split(which)
        n = len(x)
        if shuffle:
            g = torch.Generator().manual_seed(seed * 100_003 + epoch)
            order = torch.randperm(n, generator=g)
        else:
            order = torch.arange(n)
        stop = n - (n % batch_size) if drop_last else n
        for start in range(0, stop, batch_size):
            idx = order[start:start + batch_size]
            yield x[idx], y[idx]

    def fixed_batch(self, size: int, seed: int = 0, which: str = "train") -> tuple[torch.Tensor, torch.Tensor]:
        """A deterministic batch of ``size`` examples (repeated if the split is smaller)."""
        x, y = self.split(which)
        g = torch.Generator().manual_seed(seed)
        idx = torch.randint(0, len(x), (size,), generator=g) if size > len(x) else torch.randperm(len(x), generator=g)[:size]
        return x[idx], y[idx]

    def subset(self, fraction: float = 1.0, seed: int = 0) -> "Dataset":
        """Keep a seeded ``fraction`` of the training examples (validation is kept whole)."""
        if not 0 < fraction <= 1:
            raise ConfigError(f"invalid subset fraction {fraction!r}; valid range: (0, 1]")
        n = max(1, int(round(len(self.train_x) * fraction)))
        g = torch.Generator().manual_seed(seed)
        idx = torch.randperm(len(self.train_x), generator=g)[:n]
        return replace(self, train_x=self.train_x[idx], train_y=self.train_y[idx])

    def resized(self, size: int) -> "Dataset":
        """Images bilinearly resized to ``size x size``."""
        if self.input_shape[1:] == (size, size):
            return self
        def rs(t: torch.Tensor) -> torch.Tensor:
            return F.interpolate(t, size=(size, size), mode="bilinear", align_corners=False)
        return replace(self, train_x=rs(self.train_x), valid_x=rs(self.valid_x))


def split_arrays(name: str, x: torch.Tensor, y: torch.Tensor, num_classes: int,
                 valid_fraction: float, seed: int) -> Dataset:
    """Standardise ``x`` with training statistics and split it with a seeded permutation."""
    if not 0 < valid_fraction < 1:
        raise ConfigError(f"invalid valid_fraction {valid_fraction!r}; valid range: (0, 1)")
    g = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(x), generator=g)
    n_valid = max(1, int(round(len(x) * valid_fraction)))
    valid_idx, train_idx = order[:n_valid], order[n_valid:]
    x = x.float()
    mean = x[train_idx].mean(dim=(0, 2, 3), keepdim=True)
    std = x[train_idx].std(dim=(0, 2, 3), keepdim=True).clamp_min(1e-6)
    x = (x - mean) / std
    y = y.long()
    return Dataset(name, x[train_idx].contiguous(), y[train_idx].contiguous(),
                   x[valid_idx].contiguous(), y[valid_idx].contiguous(), num_classes)
