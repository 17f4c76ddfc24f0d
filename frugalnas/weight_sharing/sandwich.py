"""The sandwich rule with in-place distillation (BigNAS, Yu et al., ECCV 2020): each supernet
step trains the largest network on the labels and a few smaller ones on the largest one's
predictions for the same batch.

The networks of one step run as one module (:class:`SandwichNetwork`) whose output stacks
their logits, and :func:`sandwich_loss` reads the stack, so a step goes through
``Backend.train_step`` like any other: backends that split the batch (virtual nodes) split
every network's logits and the soft labels alike.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from frugalnas.ports.capabilities import SandwichRule, require_capability
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.task import IMAGE_CLASSIFICATION, Task
from frugalnas.ports.space import SearchSpace


def sandwich_bounds(space: SearchSpace, sandwich: int, *, few_shot: bool = False
                    ) -> tuple[Architecture, Architecture] | None:
    """The space's largest and smallest network when ``sandwich`` asks for the rule (None
    for 0); a ConfigError, naming the option, where the space has none or a few-shot split
    is asked for too."""
    check_range("sandwich", sandwich, 0)
    if not sandwich:
        return None
    bounds = require_capability(space, SandwichRule, "sandwich").sandwich_bounds()
    if few_shot:
        raise ConfigError("sandwich trains one store; it does not combine with a few-shot "
                          "split (give one of sandwich and few_shot_split)")
    return bounds


class SandwichNetwork(nn.Module):
    """The networks of one sandwich step, the teacher (largest) first; ``forward`` returns
    their logits stacked on axis 1: ``(batch, networks, classes)``. The networks share the
    supernet's modules, so gradients from all of them add up in the shared weights."""

    def __init__(self, networks: Sequence[nn.Module]):
        super().__init__()
        if not networks:
            raise ValueError("a sandwich step needs at least the teacher network")
        self.networks = nn.ModuleList(networks)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.stack([net(x) for net in self.networks], dim=1)


def sandwich_loss(stacked: torch.Tensor, targets: torch.Tensor,
                  task: Task = IMAGE_CLASSIFICATION) -> torch.Tensor:
    """The mean over the networks of: the teacher's (index 0) loss on the targets (the
    task's), each student's cross-entropy with the teacher's predicted distribution over the
    last axis (classes, or the next token's vocabulary; detached: the students learn from the
    teacher, not the reverse). The mean, not the sum, keeps a step as large as a single
    network's under the same learning rate: summed, three networks from scratch at SGD lr
    0.05 trained to a supernet whose networks scored 22 % on mnist5k."""
    teacher = stacked[:, 0]
    loss = task.loss(teacher, targets)
    soft = F.softmax(teacher.detach(), dim=-1).flatten(0, -2)
    for i in range(1, stacked.shape[1]):
        loss = loss + F.cross_entropy(stacked[:, i].flatten(0, -2), soft)
    return loss / stacked.shape[1]
