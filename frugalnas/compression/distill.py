"""Distillation: the chosen sub-network fine-tuned on a token budget through the one training
loop (:func:`~frugalnas.engine.training.run_steps`, any backend), on the parent's next-token
distribution (logit distillation, as Minitron retrains its pruned models) or on the text's
next tokens."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.compression.options import DISTILL_LOSSES
from frugalnas.engine.training import TrainReport, backend_step, run_steps
from frugalnas.ports.backend import Backend
from frugalnas.ports.data import DataSource
from frugalnas.ports.errors import check_choice, check_range

LOSSES = DISTILL_LOSSES


@dataclass(frozen=True)
class TokenBudget:
    """Training on the parent's logits (softened by ``temperature``) for ``tokens`` of
    training text in batches of ``batch_size`` blocks, AdamW at ``lr`` with a cosine
    schedule: what the fine-tuning and the supernet training share."""

    tokens: int = 0
    batch_size: int = 16
    lr: float = 3e-4
    temperature: float = 1.0

    def __post_init__(self) -> None:
        check_range("tokens", self.tokens, 0)
        check_range("batch_size", self.batch_size, 1)
        check_range("lr", self.lr, 0)
        check_range("temperature", self.temperature, 1e-3)

    def steps(self, context: int) -> int:
        """Optimisation steps the token budget buys (at least one when ``tokens`` is not
        zero)."""
        if self.tokens == 0:
            return 0
        return max(1, math.ceil(self.tokens / (self.batch_size * context)))


@dataclass(frozen=True)
class DistillConfig(TokenBudget):
    """How the child is fine-tuned: a :class:`TokenBudget` (2,000,000 tokens by default),
    with ``weight_decay``, on the parent's logits (``"distill"``) or on the next tokens
    (``"next-token"``)."""

    tokens: int = 2_000_000
    weight_decay: float = 0.0
    loss: str = "distill"

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("weight_decay", self.weight_decay, 0)
        check_choice("loss", self.loss, LOSSES)


class LogitDistillation(nn.Module):
    """The Kullback-Leibler divergence from the parent's softened next-token distribution
    (the targets: its logits) to the child's, times the squared temperature (Hinton et al.,
    2015), averaged over tokens."""

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        self.temperature = temperature

    def forward(self, logits: torch.Tensor, parent_logits: torch.Tensor) -> torch.Tensor:
        t = self.temperature
        child = F.log_softmax(logits.flatten(0, -2).float() / t, dim=-1)
        parent = F.log_softmax(parent_logits.flatten(0, -2).float() / t, dim=-1)
        return F.kl_div(child, parent, log_target=True, reduction="batchmean") * t * t


def with_parent_logits(batches: Iterable[tuple[torch.Tensor, torch.Tensor]], parent: nn.Module
                       ) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Each batch's tokens with the parent's logits on them in place of the next tokens."""
    for x, _ in batches:
        with torch.no_grad():
            logits = parent(x)
        yield x, logits  # outside no_grad: the step that follows needs gradients


def distill(child: nn.Module, parent: nn.Module, data: DataSource, backend: Backend,
            config: DistillConfig, *, seed: int = 0,
            every: tuple[int, Callable[[int, float], None]] | None = None) -> TrainReport:
    """Fine-tune ``child`` (prepared by ``backend``) on ``config.tokens`` tokens of ``data``'s
    training split; ``every=(k, call)`` calls ``call(steps_done, mean loss)`` every ``k``
    steps (progress)."""
    context = int(data.input_shape[0])
    total = config.steps(context)
    if total == 0:
        return TrainReport()
    optimizer = torch.optim.AdamW(child.parameters(), lr=config.lr,
                                  weight_decay=config.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    parent.eval()
    loss_fn = LogitDistillation(config.temperature) if config.loss == "distill" else data.task
    step = backend_step(backend, lambda _: (child, optimizer), after=lambda _: schedule.step(),
                        loss_fn=loss_fn)
    per_epoch = max(1, math.ceil(data.num_examples("train") / config.batch_size))

    def batches(epoch: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        moved = backend.device_batches(data.batches("train", config.batch_size, seed=seed,
                                                    epoch=epoch))
        return with_parent_logits(moved, parent) if config.loss == "distill" else moved

    return run_steps(batches, step, total_steps=total, steps_per_epoch=per_epoch,
                     every=every, what="distillation")
