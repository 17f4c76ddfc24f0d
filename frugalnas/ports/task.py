"""What a dataset asks of a network: the task. A :class:`Task` says how a batch's outputs are
scored while training (the loss) and on a split (the metric, its name and direction), so that
estimators, proxies and export ask the data source's task instead of assuming image classes.

Two tasks ship: :data:`IMAGE_CLASSIFICATION` (logits ``(N, classes)``, integer labels,
accuracy in percent, maximised) and :data:`LANGUAGE_MODELLING` (logits ``(N, T, vocabulary)``,
next tokens ``(N, T)``, the mean cross-entropy in nats per token, minimised)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import ClassVar

import math

import torch
import torch.nn.functional as F


class Task(ABC):
    """The loss and the metric of one kind of prediction."""

    #: the task's name, as listed and logged (``"image-classification"``)
    name: ClassVar[str]
    #: the name of the validation metric an estimator reports (``"valid_accuracy"``)
    metric: ClassVar[str]
    #: ``"maximize"`` or ``"minimize"``: which way the metric is better
    direction: ClassVar[str]

    @abstractmethod
    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """The training loss of a batch (a scalar to minimise)."""

    @abstractmethod
    def totals(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
        """The metric's sum over a batch and the number of items it covers, so that a split
        read in batches is scored exactly (:meth:`combine` of the sums)."""

    def combine(self, total: float, count: int) -> float:
        """The metric of items whose sums add up to ``total`` over ``count`` items."""
        return total / count

    def score(self, outputs: torch.Tensor, targets: torch.Tensor) -> float:
        """The metric over one batch."""
        return self.combine(*self.totals(outputs, targets))

    def derived_metrics(self, value: float) -> dict[str, float]:
        """Other units of the validation metric ``value``, by name (none by default)."""
        return {}

    @abstractmethod
    def example_batch(self, n: int, input_shape: tuple[int, ...], classes: int,
                      generator: torch.Generator | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        """``n`` random inputs of ``input_shape`` and their random targets, for a data-free
        proxy or a conformance check."""

    @abstractmethod
    def output_shape(self, n: int, input_shape: tuple[int, ...], classes: int
                     ) -> tuple[int, ...]:
        """The shape of a network's outputs for ``n`` inputs of ``input_shape``."""

    def __call__(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        """A task is a loss function (what a backend's training step takes)."""
        return self.loss(outputs, targets)

    def __repr__(self) -> str:
        return f"Task({self.name!r})"


class ImageClassification(Task):
    """Class logits ``(N, classes)`` against integer labels ``(N,)``: cross-entropy while
    training, top-1 accuracy in percent on a split."""

    name = "image-classification"
    metric = "valid_accuracy"
    direction = "maximize"

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs, targets)

    def totals(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
        return float((outputs.argmax(1) == targets).sum().item()), int(targets.numel())

    def example_batch(self, n: int, input_shape: tuple[int, ...], classes: int,
                      generator: torch.Generator | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        inputs = torch.randn((n, *input_shape), generator=generator)
        return inputs, torch.randint(0, classes, (n,), generator=generator)

    def output_shape(self, n: int, input_shape: tuple[int, ...], classes: int
                     ) -> tuple[int, ...]:
        return (n, classes)

    def combine(self, total: float, count: int) -> float:
        # the fraction in single precision, as a float tensor's mean gives it
        fraction = torch.tensor(total, dtype=torch.float32) / count
        return float(fraction.item() * 100.0)


class LanguageModelling(Task):
    """Next-token logits ``(N, T, vocabulary)`` against the next tokens ``(N, T)``: the mean
    cross-entropy in nats per token, both while training and on a split (lower is better).

    Given the text's ``bytes_per_token`` (1 for byte tokens; the validation text's bytes
    over its tokens for BPE), the loss is also given in bits per byte
    (``valid_bits_per_byte``), which compares models whatever their tokenizer."""

    name = "language-modelling"
    metric = "valid_loss"
    direction = "minimize"

    def __init__(self, bytes_per_token: float | None = None):
        self.bytes_per_token = bytes_per_token

    def derived_metrics(self, value: float) -> dict[str, float]:
        if not self.bytes_per_token:
            return {}
        return {"valid_bits_per_byte": value / math.log(2) / self.bytes_per_token}

    def loss(self, outputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        return F.cross_entropy(outputs.flatten(0, -2), targets.flatten())

    def totals(self, outputs: torch.Tensor, targets: torch.Tensor) -> tuple[float, int]:
        total = F.cross_entropy(outputs.flatten(0, -2).float(), targets.flatten(),
                                reduction="sum")
        return float(total.item()), int(targets.numel())

    def example_batch(self, n: int, input_shape: tuple[int, ...], classes: int,
                      generator: torch.Generator | None = None
                      ) -> tuple[torch.Tensor, torch.Tensor]:
        tokens = torch.randint(0, classes, (n, input_shape[0] + 1), generator=generator)
        return tokens[:, :-1], tokens[:, 1:]

    def output_shape(self, n: int, input_shape: tuple[int, ...], classes: int
                     ) -> tuple[int, ...]:
        return (n, *input_shape, classes)


IMAGE_CLASSIFICATION = ImageClassification()
LANGUAGE_MODELLING = LanguageModelling()
