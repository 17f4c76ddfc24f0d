"""The single-device backend (CPU, or a CUDA device when present), registered by the built-in
plugin ``single-device`` (:mod:`frugalnas.backends.single_device_plugin`)."""

from __future__ import annotations

import torch

from frugalnas.ports.backend import Backend
from frugalnas.ports.errors import ConfigError


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
    accelerations = frozenset({"bf16", "channels_last", "compile"})

    def __init__(self, device: str = "auto"):
        self._device = resolve_device(device)

    @property
    def device(self) -> torch.device:
        return self._device
