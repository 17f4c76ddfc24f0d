"""The training loop every training estimator shares; steps run through a Backend."""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch
from torch import nn

from frugalnas.core.backend import Backend
from frugalnas.core.data import Dataset
from frugalnas.core.errors import ConfigError, TrialFailure

OPTIMIZERS = ("sgd", "adam")


@dataclass
class TrainConfig:
    epochs: float = 1.0
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    optimizer: str = "sgd"
    max_steps: int | None = None      # stop after this many steps (low-fidelity budgets)

    def __post_init__(self) -> None:
        from frugalnas.core.errors import check_choice, check_range

        check_range("epochs", self.epochs, 0)
        check_range("batch_size", self.batch_size, 1)
        check_range("lr", self.lr, 0)
        check_range("momentum", self.momentum, 0, 1)
        check_range("weight_decay", self.weight_decay, 0)
        if self.max_steps is not None:
            check_range("max_steps", self.max_steps, 1)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)


@dataclass
class TrainReport:
    steps: int = 0
    epochs: float = 0.0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0)


def train(model: nn.Module, dataset: Dataset, backend: Backend, cfg: TrainConfig, *,
          seed: int = 0, on_epoch: Callable[[int, float], None] | None = None) -> TrainReport:
    """Train ``model`` (already prepared by ``backend``) with a cosine schedule.

    Fractional ``epochs`` train on that fraction of an epoch's batches. ``on_epoch(epoch,
    mean_loss)`` is called after each full epoch (used for pruning). A non-finite loss raises
    :class:`TrialFailure`."""
    n_train = len(dataset.train_x)
    if n_train == 0:  # no batch would ever come: the loop below would never end
        raise ConfigError(f"cannot train on dataset {dataset.name!r}: its training split is "
                          "empty")
    batches_per_epoch = math.ceil(n_train / cfg.batch_size)
    total_steps = max(1, math.ceil(cfg.epochs * batches_per_epoch))
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    optimizer = make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)
    loss_fn = nn.CrossEntropyLoss()
    report = TrainReport()
    start = time.perf_counter()
    model.train()
    epoch = 0
    while report.steps < total_steps:
        epoch_losses = []
        for x, y in dataset.batches("train", cfg.batch_size, seed=seed, epoch=epoch):
            loss = backend.train_step(model, optimizer, loss_fn, x, y, report.steps)
            if not math.isfinite(loss):
                raise TrialFailure(f"non-finite training loss {loss} at step {report.steps}")
            scheduler.step()
            epoch_losses.append(loss)
            report.steps += 1
            if report.steps >= total_steps:
                break
        report.losses.extend(epoch_losses)
        epoch += 1
        if on_epoch is not None and len(epoch_losses) == batches_per_epoch:
            on_epoch(epoch, sum(epoch_losses) / len(epoch_losses))
    report.epochs = report.steps / batches_per_epoch
    report.seconds = time.perf_counter() - start
    return report


def accuracy(model: nn.Module, backend: Backend, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy in percent."""
    logits = backend.predict(model, x)
    return float((logits.argmax(1) == y).float().mean().item() * 100.0)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
