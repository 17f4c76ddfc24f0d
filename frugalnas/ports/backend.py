"""Backend: where and how training steps run (one device, virtual nodes, out-of-core...)."""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Iterator
from typing import ClassVar

import torch
from torch import nn

LossFn = Callable[[torch.Tensor, torch.Tensor], torch.Tensor]

StepLoss = torch.Tensor | float
"""A step's mean loss: a detached 0-d tensor where the step left it (on the device, read by
the training loop when it needs the value), or a float."""

Batch = tuple[torch.Tensor, torch.Tensor]


class Backend(ABC):
    """Runs training and evaluation steps. Estimators that train call ``prepare`` once per
    model, then ``train_step`` per mini-batch; the backend owns device placement, gradient
    accumulation and memory strategy, so estimators never depend on the hardware."""

    name: str = "backend"
    #: What :func:`~frugalnas.engine.training.train` may do to the network this backend
    #: trains: ``"bf16"`` (forward under bfloat16 autocast), ``"channels_last"``,
    #: ``"compile"`` (``torch.compile``). A backend that walks or ships the network itself
    #: (out-of-core hooks, virtual-node workers) declares none.
    accelerations: ClassVar[frozenset[str]] = frozenset()

    @property
    @abstractmethod
    def device(self) -> torch.device:
        """The device that holds the model between steps."""

    def prepare(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to the backend's device (and wrap it if the backend needs to)."""
        return model.to(self.device)

    def forward_backward(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor,
                         targets: torch.Tensor, loss_scale: float = 1.0) -> StepLoss:
        """Forward and backward of one micro-batch, accumulating ``loss_scale * loss`` gradients
        into ``.grad``. Returns the unscaled mean loss, unread (a detached tensor: reading it
        would wait for the device). Backends that change how activations are kept
        (out-of-core) override this; backends that split batches (virtual nodes) call an
        inner backend's ``forward_backward`` per micro-batch."""
        loss = loss_fn(model(inputs.to(self.device, non_blocking=True)),
                       targets.to(self.device, non_blocking=True))
        scaled = loss * loss_scale if loss_scale != 1.0 else loss
        scaled.backward()  # type: ignore[no-untyped-call]
        return loss.detach()

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                   inputs: torch.Tensor, targets: torch.Tensor, step: int) -> StepLoss:
        """One optimisation step on the global batch ``(inputs, targets)``: zero gradients,
        forward, backward, ``optimizer.step()``. Returns the mean loss over the batch (a float,
        or a detached 0-d tensor the caller reads when it needs it). ``step`` is the global
        step index (backends derive per-step random seeds from it)."""
        optimizer.zero_grad(set_to_none=True)
        loss = self.forward_backward(model, loss_fn, inputs, targets)
        optimizer.step()
        return loss

    def device_batches(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        """``batches`` as the training steps take them. On a CUDA device each batch is copied
        from pinned memory without blocking, one batch ahead, so the copy of the next batch
        overlaps the current step; elsewhere the batches pass unchanged. A backend that routes
        batches itself (virtual nodes) overrides this to pass them unchanged."""
        if self.device.type != "cuda":
            yield from batches
            return
        ahead: Batch | None = None
        for x, y in batches:
            moved = (x.pin_memory().to(self.device, non_blocking=True),
                     y.pin_memory().to(self.device, non_blocking=True))
            if ahead is not None:
                yield ahead
            ahead = moved
        if ahead is not None:
            yield ahead

    @torch.no_grad()
    def predict(self, model: nn.Module, inputs: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
        """Logits of ``model`` in evaluation mode, on the CPU."""
        was_training = model.training
        model.eval()
        try:
            outs = [model(inputs[i:i + batch_size].to(self.device)).float().cpu()
                    for i in range(0, len(inputs), batch_size)]
        finally:
            model.train(was_training)
        return torch.cat(outs) if outs else torch.empty(0)

    def reset_peak_memory(self) -> None:
        if self.device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(self.device)

    def peak_memory(self) -> int:
        """Peak bytes allocated on the device since the last reset (0 where not measurable)."""
        if self.device.type == "cuda":
            return int(torch.cuda.max_memory_allocated(self.device))
        return 0

    def describe(self) -> dict[str, object]:
        return {"backend": self.name, "device": str(self.device)}

    def trial_outputs(self) -> tuple[dict[str, float], dict[str, str | bytes]]:
        """Metrics and artifacts (file name -> text or bytes) about the evaluation that just
        ended, such as a memory plan; the study adds them to the trial's result. Called once
        after every evaluation; a backend forgets them once returned. Default: none."""
        return {}, {}

    def release(self) -> None:
        """Free what the backend holds between studies (worker processes); it must work again
        afterwards. Called when a study's ``optimize`` ends. Default: nothing."""

    def close(self) -> None:
        """Release processes or memory the backend holds."""
