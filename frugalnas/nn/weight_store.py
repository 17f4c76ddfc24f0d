"""WeightStore: one module per key, shared by every network that asks for that key.

Keys are tuples of strings and integers, e.g. ``("edge", 3, "normal", 4, 2, "sep_conv_3x3")``
for the operation on input 2 of node 4 in cell 3. The first request creates the module with
``factory(key)``, seeded from the key, so a module's initial weights do not depend on the order
in which candidates were built; later requests return the same object (the same
``nn.Parameter`` tensors). Checkpoints hold the keys and a state dict and load with
``torch.load(..., weights_only=True)``.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import torch
from torch import nn

Key = tuple[str | int, ...]
SEP = "/"


def encode_key(key: Key) -> str:
    """``("edge", 3, "normal")`` -> ``"edge/3/normal"`` (a valid ModuleDict name)."""
    text = SEP.join(str(part) for part in key)
    if "." in text or not text:
        raise ValueError(f"invalid weight-store key {key!r}: parts may not contain '.'")
    return text


def decode_key(text: str) -> Key:
    return tuple(int(p) if p.lstrip("-").isdigit() else p for p in text.split(SEP))


class WeightStore(nn.Module):
    """Shared modules keyed by tuples; ``get(key)`` creates on first use and then shares."""

    def __init__(self, factory: Callable[[Key], nn.Module], seed: int = 0):
        super().__init__()
        self.factory = factory
        self.seed = seed
        self.entries = nn.ModuleDict()
        self.device: torch.device | None = None

    def get(self, key: Key) -> nn.Module:
        name = encode_key(key)
        if name not in self.entries:
            digest = hashlib.sha1(f"{self.seed}:{name}".encode()).digest()
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(int.from_bytes(digest[:8], "little") % 2**63)
                module = self.factory(key)
            if self.device is not None:
                module = module.to(self.device)
            self.entries[name] = module
        return self.entries[name]

    def __contains__(self, key: object) -> bool:
        return isinstance(key, tuple) and encode_key(key) in self.entries

    def __len__(self) -> int:
        return len(self.entries)

    def keys(self) -> Iterator[Key]:
        return (decode_key(name) for name in self.entries)

    def num_parameters(self) -> int:
        return sum(p.numel() for p in self.parameters())

    def to(self, *args: Any, **kwargs: Any) -> "WeightStore":
        out = super().to(*args, **kwargs)
        first = next(self.parameters(), None)
        self.device = first.device if first is not None else self.device
        return out

    # -- checkpoints ---------------------------------------------------------------------
    def checkpoint(self, **meta: Any) -> dict[str, Any]:
        """A ``weights_only``-loadable dict: keys, CPU tensors and ``meta`` (plain values)."""
        state = {k: v.detach().cpu().clone() for k, v in self.state_dict().items()}
        return {"keys": list(self.entries), "state": state, "meta": dict(meta)}

    def load_checkpoint(self, data: dict[str, Any]) -> dict[str, Any]:
        """Create every saved entry, load its tensors, and return the saved ``meta``."""
        for name in data["keys"]:
            self.get(decode_key(name))
        self.load_state_dict(data["state"], strict=False)
        return dict(data.get("meta", {}))

    def save(self, path: str | Path, **meta: Any) -> None:
        """Write a checkpoint atomically (a crash never leaves half a file)."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(self.checkpoint(**meta), tmp)
        tmp.replace(path)

    def load(self, path: str | Path) -> dict[str, Any]:
        data = torch.load(Path(path), map_location="cpu", weights_only=True)
        return self.load_checkpoint(data)
