"""The training loop every training estimator shares; steps run through a Backend."""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import cast

import torch
from torch import nn

from frugalnas.ports.backend import Backend, LossFn, StepLoss
from frugalnas.ports.data import DataSource
from frugalnas.ports.errors import ConfigError, TrialFailure, check_choice, check_range

OPTIMIZERS = ("sgd", "adam")
#: Training precisions: float32, or bfloat16 autocast of the forward pass.
PRECISIONS = ("fp32", "bf16")


@dataclass
class TrainConfig:
    epochs: float = 1.0
    batch_size: int = 64
    lr: float = 0.05
    momentum: float = 0.9
    weight_decay: float = 5e-4
    optimizer: str = "sgd"
    max_steps: int | None = None      # stop after this many steps (low-fidelity budgets)
    precision: str = "fp32"           # "bf16": the forward pass under bfloat16 autocast
    channels_last: bool = False       # 4-D inputs and the network in channels-last layout
    compile: bool = False             # the forward pass compiled with torch.compile

    def __post_init__(self) -> None:
        check_range("epochs", self.epochs, 0)
        check_range("batch_size", self.batch_size, 1)
        check_range("lr", self.lr, 0)
        check_range("momentum", self.momentum, 0, 1)
        check_range("weight_decay", self.weight_decay, 0)
        if self.max_steps is not None:
            check_range("max_steps", self.max_steps, 1)
        check_choice("optimizer", self.optimizer, OPTIMIZERS)
        check_choice("precision", self.precision, PRECISIONS)
        for flag in ("channels_last", "compile"):
            if not isinstance(getattr(self, flag), bool):
                raise ConfigError(f"invalid {flag} {getattr(self, flag)!r}; valid: true, false")

    def accelerations(self) -> frozenset[str]:
        """The accelerations asked for, by the names backends declare
        (:attr:`~frugalnas.ports.backend.Backend.accelerations`)."""
        asked = {"bf16": self.precision == "bf16", "channels_last": self.channels_last,
                 "compile": self.compile}
        return frozenset(name for name, on in asked.items() if on)


@dataclass
class TrainReport:
    """What a run of :func:`run_steps` did: steps, epochs (steps over batches per epoch),
    seconds, every step's loss, and the training FLOPs where the trainer counts them."""

    steps: int = 0
    epochs: float = 0.0
    seconds: float = 0.0
    losses: list[float] = field(default_factory=list)
    flops: float = 0.0

    def mean_loss(self, last: int | None = None) -> float:
        """The mean of the last ``last`` step losses (all of them by default); 0.0 without
        steps."""
        window = self.losses[-last:] if last else self.losses
        return sum(window) / len(window) if window else 0.0


def make_optimizer(model: nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    if cfg.optimizer == "adam":
        return torch.optim.Adam(model.parameters(), lr=cfg.lr, weight_decay=cfg.weight_decay)
    return torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                           weight_decay=cfg.weight_decay, nesterov=cfg.momentum > 0)


Batches = Callable[[int], Iterable[tuple[torch.Tensor, torch.Tensor]]]
"""An epoch's training batches: ``epoch -> iterable of (x, y)``."""

StepFn = Callable[[int, torch.Tensor, torch.Tensor], StepLoss]
"""One optimisation step: ``(global step, x, y) -> loss``."""

#: Steps between two reads of the losses on the host (one synchronisation per read).
READ_EVERY = 32


class _Losses:
    """The losses of the steps run so far. A step's loss stays where the step left it (on
    the device) until :meth:`read` turns the pending ones into floats together: one host
    synchronisation per read instead of one per step. The non-finite rule is checked at each
    read and names the first step that broke it."""

    def __init__(self, what: str, first_step: int):
        self.what, self.first_step = what, first_step
        self.values: list[float] = []
        self._pending: list[StepLoss] = []

    def __len__(self) -> int:
        return len(self.values) + len(self._pending)

    def add(self, loss: StepLoss) -> None:
        self._pending.append(loss)

    def read(self) -> list[float]:
        """Every loss as a float (the pending ones read now)."""
        if not self._pending:
            return self.values
        read = iter(_read_together([t for t in self._pending if isinstance(t, torch.Tensor)]))
        values = [next(read) if isinstance(loss, torch.Tensor) else float(loss)
                  for loss in self._pending]
        self._pending.clear()
        for i, value in enumerate(values):
            if not math.isfinite(value):
                raise TrialFailure(f"non-finite {self.what} loss {value} at step "
                                   f"{self.first_step + len(self.values) + i}")
        self.values.extend(values)
        return self.values


@torch.no_grad()
def _read_together(tensors: list[torch.Tensor]) -> list[float]:
    """The values of 0-d tensors, read in one transfer where they share a dtype and device."""
    if not tensors:
        return []
    try:
        return [float(v) for v in torch.stack(tensors).tolist()]
    except RuntimeError:  # mixed dtypes or devices, or not 0-d: one at a time
        return [float(t.reshape(())) for t in tensors]


def run_steps(batches: Batches, step: StepFn, *, total_steps: int, steps_per_epoch: int,
              first_step: int = 0, first_epoch: int = 0,
              on_epoch: Callable[[int, list[float]], None] | None = None,
              every: tuple[int, Callable[[int, float], None]] | None = None,
              what: str = "training", read_every: int = READ_EVERY) -> TrainReport:
    """The training loop of every trainer in frugalnas (the ``train`` and low-fidelity
    estimators, the supernet, DARTS, si-evolution, export): run ``step`` on the batches of
    epochs ``first_epoch, first_epoch + 1, ...`` until ``total_steps`` steps have run, counting
    global steps from ``first_step``.

    One rule for every trainer: a non-finite loss raises :class:`TrialFailure` naming ``what``
    and the step. Losses a step returns as tensors are read on the host every ``read_every``
    steps, at the end of each epoch and when a callback needs them, so the rule may stop the
    loop up to ``read_every - 1`` steps after the step it names. ``on_epoch(epoch, losses)``
    follows every epoch that ran all of its ``steps_per_epoch`` batches; ``every=(k, call)``
    calls ``call(steps_done, mean loss of the last k steps)`` after every ``k`` steps. The
    report's ``epochs`` counts steps in epochs."""
    check_range("total_steps", total_steps, 0)
    check_range("steps_per_epoch", steps_per_epoch, 1)
    check_range("read_every", read_every, 1)
    if every is not None:
        check_range("every", every[0], 1)
    report, losses = TrainReport(), _Losses(what, first_step)
    start = time.perf_counter()
    epoch = first_epoch
    while len(losses) < total_steps:
        epoch_start = len(losses)
        for x, y in batches(epoch):
            losses.add(step(first_step + len(losses), x, y))
            done = len(losses)
            if every is not None and done % every[0] == 0:
                window = losses.read()[-every[0]:]
                every[1](first_step + done, sum(window) / len(window))
            elif done % read_every == 0:
                losses.read()
            if done >= total_steps:
                break
        epoch_losses = losses.read()[epoch_start:]
        if not epoch_losses:  # an epoch without batches would repeat for ever
            raise ConfigError(f"{what}: epoch {epoch} has no training batch")
        if on_epoch is not None and len(epoch_losses) == steps_per_epoch:
            on_epoch(epoch, epoch_losses)
        epoch += 1
    report.losses = losses.read()
    report.steps = len(report.losses)
    report.epochs = report.steps / steps_per_epoch
    report.seconds = time.perf_counter() - start
    return report


def backend_step(backend: Backend, model: Callable[[int], tuple[nn.Module, torch.optim.Optimizer]],
                 *, after: Callable[[int], None] | None = None,
                 loss_fn: LossFn | None = None) -> StepFn:
    """The usual step: ``model(step)`` gives the network and optimiser to train (the same
    every step, or a sub-network drawn per step), trained in train mode through
    ``backend.train_step`` with ``loss_fn`` (default: cross-entropy); ``after(step)`` then
    runs (a schedule). The loss is returned as the backend left it (a tensor is not read)."""
    loss_fn = loss_fn or nn.CrossEntropyLoss()
    in_train_mode: list[nn.Module] = []  # the network last put in train mode

    def step(index: int, x: torch.Tensor, y: torch.Tensor) -> StepLoss:
        net, optimizer = model(index)
        # Setting the mode walks every module: once per network, not once per step (an
        # evaluation in between restores the mode it found).
        if not net.training or not in_train_mode or in_train_mode[0] is not net:
            net.train()
            in_train_mode[:] = [net]
        loss = backend.train_step(net, optimizer, loss_fn, x, y, index)
        if after is not None:
            after(index)
        return loss

    return step


def train(model: nn.Module, dataset: DataSource, backend: Backend, cfg: TrainConfig, *,
          seed: int = 0, on_epoch: Callable[[int, float], None] | None = None,
          every: tuple[int, Callable[[int, float], None]] | None = None) -> TrainReport:
    """Train ``model`` (already prepared by ``backend``) with a cosine schedule, on the
    loss of the dataset's task.

    Fractional ``epochs`` train on that fraction of an epoch's batches. ``on_epoch(epoch,
    mean_loss)`` is called after each full epoch (used for pruning); ``every=(k, call)`` calls
    ``call(steps_done, mean_loss)`` after every ``k`` steps. A non-finite loss raises
    :class:`TrialFailure`. The backend moves each next batch to its device while the current
    step runs (:meth:`~frugalnas.ports.backend.Backend.device_batches`)."""
    n_train = dataset.num_examples("train")
    if n_train == 0:  # no batch would ever come: the loop would never end
        raise ConfigError(f"cannot train on dataset {dataset.name!r}: its training split is "
                          "empty")
    batches_per_epoch = math.ceil(n_train / cfg.batch_size)
    total_steps = max(1, math.ceil(cfg.epochs * batches_per_epoch))
    if cfg.max_steps is not None:
        total_steps = min(total_steps, cfg.max_steps)
    optimizer = make_optimizer(model, cfg)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total_steps)

    def each_epoch(epoch: int, losses: list[float]) -> None:
        if on_epoch is not None:
            on_epoch(epoch + 1, sum(losses) / len(losses))

    stepped = accelerated(model, backend, cfg)
    step = backend_step(backend, lambda _: (stepped, optimizer),
                        after=lambda _: scheduler.step(), loss_fn=dataset.task)

    def batches(epoch: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        epoch_batches = dataset.batches("train", cfg.batch_size, seed=seed, epoch=epoch)
        if cfg.channels_last:
            epoch_batches = ((_channels_last(x), y) for x, y in epoch_batches)
        return backend.device_batches(epoch_batches)

    return run_steps(batches, step, total_steps=total_steps, steps_per_epoch=batches_per_epoch,
                     on_epoch=each_epoch, every=every)


class _Autocast(nn.Module):
    """``net``'s forward pass under bfloat16 autocast, its outputs in float32 (the loss and
    the backward pass run outside autocast, as PyTorch advises)."""

    def __init__(self, net: nn.Module, device_type: str):
        super().__init__()
        self.net, self.device_type = net, device_type

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        with torch.autocast(self.device_type, dtype=torch.bfloat16):
            out: torch.Tensor = self.net(x)
        return out.float()


def _channels_last(x: torch.Tensor) -> torch.Tensor:
    return x.contiguous(memory_format=torch.channels_last) if x.dim() == 4 else x


def accelerated(model: nn.Module, backend: Backend, cfg: TrainConfig) -> nn.Module:
    """The module the training steps call: ``model`` itself, or ``model`` in channels-last
    layout, under bfloat16 autocast, compiled, as ``cfg`` asks. Each acceleration must be
    one the backend declares; all of them change the numbers a little (the losses are no
    longer bitwise those of float32 eager training), so all are off by default."""
    asked = cfg.accelerations()
    missing = asked - backend.accelerations
    if missing:
        raise ConfigError(f"backend {backend.name!r} cannot train with {', '.join(sorted(missing))}; "
                          f"valid with it: {', '.join(sorted(backend.accelerations)) or 'none'}")
    stepped = model
    if cfg.channels_last:
        model.to(memory_format=torch.channels_last)  # type: ignore[call-overload]
    if cfg.precision == "bf16":
        stepped = _Autocast(stepped, backend.device.type)
    if cfg.compile:
        stepped = cast(nn.Module, torch.compile(stepped))
    return stepped


def split_metric(model: nn.Module, backend: Backend, data: DataSource, which: str = "valid",
                 limit: int | None = None) -> float:
    """The dataset task's metric (accuracy in percent for image classes, nats per token for
    a language model) on (the first ``limit`` examples of) a split, read through the source's
    evaluation batches (an in-memory source: one call on the whole split)."""
    total, count = 0.0, 0
    for x, y in data.eval_batches(which, limit):
        batch_total, batch_count = data.task.totals(backend.predict(model, x), y)
        total, count = total + batch_total, count + batch_count
    if count == 0:
        raise ConfigError(f"dataset {data.name!r} has no {which!r} examples to score")
    return data.task.combine(total, count)


def seed_everything(seed: int) -> None:
    torch.manual_seed(seed)
    import random

    import numpy as np

    random.seed(seed)
    np.random.seed(seed % 2**32)
