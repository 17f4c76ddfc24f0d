"""Built-in plugin: the single-device backend (CPU, or a CUDA device when present)."""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from ...core.backend import Backend, LossFn
from ...core.errors import ConfigError
from ...core.plugins import hookimpl


def resolve_device(device: str) -> torch.device:
    if device == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        dev = torch.device(device)
    except RuntimeError:
        raise ConfigError(f"invalid device {device!r}; valid: 'auto', 'cpu', 'cuda', 'cuda:N'") from None
    if dev.type == "cuda" and not torch.cuda.is_available():
        raise ConfigError(f"device {device!r} requested but CUDA is not available; use 'cpu' or 'auto'")
    return dev


class SingleDeviceBackend(Backend):
    """Trains on one device: the whole batch in one forward/backward pass."""

    name = "single-device"

    def __init__(self, device: str = "auto"):
        self._device = resolve_device(device)

    @property
    def device(self) -> torch.device:
        return self._device

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                   inputs: torch.Tensor, targets: torch.Tensor, step: int) -> float:
        optimizer.zero_grad(set_to_none=True)
        loss = loss_fn(model(inputs.to(self.device, non_blocking=True)),
                       targets.to(self.device, non_blocking=True))
        loss.backward()
        optimizer.step()
        return float(loss.detach())


@hookimpl
def frugalnas_backends() -> dict[str, Any]:
    return {"single-device": SingleDeviceBackend}
