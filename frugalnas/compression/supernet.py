"""Supernet training before the search: the reordered parent's weights trained on a token
budget so that its sub-networks of the budget's size work on their own, not only as parts of
the whole.

Each step trains ``samples`` sub-networks of the search space drawn at random among those whose
size lies in the budget's band (from half the smallest size the search aims at up to the
largest), plus the largest network when ``largest`` is set, all on the frozen parent's logits
(logit distillation), their losses averaged: the sandwich rule of BigNAS (Yu et al., ECCV
2020) as whittle applies it to a pretrained model, with the parent as the teacher and the
samples kept where the search will look. The networks share the parent's weights (weight
entanglement), so one step moves every sub-network that uses them.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterable
from dataclasses import dataclass

import torch
from torch import nn

from frugalnas.compression.distill import LogitDistillation, TokenBudget, with_parent_logits
from frugalnas.compression.space import Shape, SubnetSpace
from frugalnas.engine.training import TrainReport, backend_step, run_steps
from frugalnas.nn.transformer import ActiveNetwork, ElasticGPT, SubnetConfig
from frugalnas.ports.backend import Backend
from frugalnas.ports.data import DataSource
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.space import draw
from frugalnas.weight_sharing.sandwich import SandwichNetwork

#: Random draws per sampled sub-network before the band is declared empty.
TRIES = 500


@dataclass(frozen=True)
class SupernetConfig(TokenBudget):
    """How the parent is trained as a supernet before the search: a :class:`TokenBudget`
    (0 tokens by default: not at all; the search scores the parent's own weights), with
    ``samples`` sub-networks per step (and the largest network when ``largest``)."""

    samples: int = 2
    largest: bool = False

    def __post_init__(self) -> None:
        super().__post_init__()
        check_range("samples", self.samples, 1)
        if not isinstance(self.largest, bool):
            raise ConfigError(f"invalid largest {self.largest!r}; valid: true, false")


class BandSampler:
    """Sub-networks of ``space`` whose ``measure`` (default: non-embedding parameters; its
    ``unit`` for messages) lies in ``[low, high]``, drawn at random: the same draws for the
    same ``seed`` and step, so a resumed or repeated training sees the same networks."""

    def __init__(self, space: SubnetSpace, low: float, high: float, seed: int = 0,
                 measure: Callable[[Shape], float] | None = None,
                 unit: str = "non-embedding parameters"):
        if not 0 <= low <= high:
            raise ConfigError(f"invalid size band [{low:g}, {high:g}]")
        self.space, self.low, self.high, self.seed = space, low, high, seed
        self.measure, self.unit = measure or space.size, unit

    def draw(self, rng: random.Random) -> Shape:
        """One shape in the band; a ConfigError naming the band when none turns up."""
        choices = self.space.distributions()
        for _ in range(TRIES):
            values = {name: draw(dist, rng) for name, dist in choices.items()}
            shape = self.space.shape(self.space.from_params(values))
            if self.low <= self.measure(shape) <= self.high:
                return shape
        raise ConfigError(f"no sub-network of space {self.space.name!r} has between "
                          f"{self.describe()} in {TRIES} draws; widen the space's choices or "
                          "the budget")

    def describe(self) -> str:
        """``444,960 and 889,920 non-embedding parameters``."""
        digits = ",.0f" if self.high >= 1000 else ".3g"
        return f"{self.low:{digits}} and {self.high:{digits}} {self.unit}"

    def shapes(self, step: int, samples: int) -> list[Shape]:
        """The ``samples`` shapes of training step ``step``."""
        rng = random.Random(self.seed * 1_000_003 + step)
        return [self.draw(rng) for _ in range(samples)]


class MeanDistillation(nn.Module):
    """The mean over stacked networks (axis 1 of the outputs) of each one's
    :class:`LogitDistillation` from the parent's logits."""

    def __init__(self, temperature: float = 1.0):
        super().__init__()
        self.each = LogitDistillation(temperature)

    def forward(self, stacked: torch.Tensor, parent_logits: torch.Tensor) -> torch.Tensor:
        losses = [self.each(stacked[:, i], parent_logits) for i in range(stacked.shape[1])]
        return torch.stack(losses).mean()


def train_supernet(supernet: ElasticGPT, parent: nn.Module, sampler: BandSampler,
                   data: DataSource, backend: Backend, config: SupernetConfig, *,
                   seed: int = 0, every: tuple[int, Callable[[int, float], None]] | None = None
                   ) -> TrainReport:
    """Train ``supernet`` (prepared by ``backend``; the parent's weights, reordered) on
    ``config.tokens`` tokens of ``data``'s training split, each step on the sub-networks
    ``sampler`` draws, every one distilled from the frozen ``parent``."""
    total = config.steps(int(data.input_shape[0]))
    if total == 0:
        return TrainReport()
    optimizer = torch.optim.AdamW(supernet.parameters(), lr=config.lr, weight_decay=0.0)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    parent.eval()

    def networks(step: int) -> tuple[nn.Module, torch.optim.Optimizer]:
        configs: list[SubnetConfig] = [s.subnet() for s in
                                       sampler.shapes(step, config.samples)]
        if config.largest:
            configs.insert(0, supernet.largest())
        return SandwichNetwork([ActiveNetwork(supernet, c) for c in configs]), optimizer

    step = backend_step(backend, networks, after=lambda _: schedule.step(),
                        loss_fn=MeanDistillation(config.temperature))
    per_epoch = max(1, math.ceil(data.num_examples("train") / config.batch_size))

    def batches(epoch: int) -> Iterable[tuple[torch.Tensor, torch.Tensor]]:
        moved = backend.device_batches(data.batches("train", config.batch_size, seed=seed,
                                                    epoch=epoch))
        return with_parent_logits(moved, parent)

    return run_steps(batches, step, total_steps=total, steps_per_epoch=per_epoch, every=every, what="supernet training")

