"""Messages between the main process (rank 0) and virtual-node workers.

Commands travel through the rendezvous TCPStore under sequence-numbered keys (so an idle
worker can wait for the next one indefinitely while still noticing a dead parent); tensors
that change every step (parameters, buffers) travel through ``torch.distributed`` collectives."""

from __future__ import annotations

import io
import os
import time
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from frugalnas.core.errors import ConfigError

PREFIX = "frugalnas-vnode/"
CONFIG_KEY = PREFIX + "config"


def command_key(seq: int) -> str:
    return f"{PREFIX}cmd/{seq}"


def ready_key(rank: int) -> str:
    return f"{PREFIX}ready/{rank}"


def error_key(rank: int) -> str:
    """Where a worker that cannot start leaves its reason for the main process."""
    return f"{PREFIX}error/{rank}"


def dumps(obj: Any) -> bytes:
    """Serialise ``obj`` for the workers. cloudpickle (when installed) sends classes defined in
    ``__main__`` or inside functions by value, so such models work too."""
    try:
        import cloudpickle as pickler
    except ImportError:  # pragma: no cover - plain pickle needs importable classes
        import pickle as pickler
    buf = io.BytesIO()
    try:
        torch.save(obj, buf, pickle_module=pickler)
    except Exception as exc:
        raise ConfigError(f"cannot send {type(obj).__name__} to the virtual-node workers ({exc}); "
                          "models and loss functions must be picklable") from exc
    return buf.getvalue()


def loads(data: bytes, map_location: torch.device | str | None = None) -> Any:
    return torch.load(io.BytesIO(data), map_location=map_location, weights_only=False)


def post_command(store: dist.Store, seq: int, payload: bytes) -> None:
    """Publish command ``seq``; the key two commands back has been read by every worker
    (each command ends in a collective), so it is deleted."""
    store.set(command_key(seq), payload)
    if seq >= 2:
        store.delete_key(command_key(seq - 2))


def wait_command(store: dist.Store, seq: int, parent_pid: int | None) -> bytes | None:
    """Block until command ``seq`` exists; None when the parent process or the store is gone."""
    key, delay = command_key(seq), 1e-4
    while True:
        try:
            if store.check([key]):
                return store.get(key)
        except dist.DistNetworkError:
            return None
        if parent_pid is not None and os.getppid() != parent_pid:
            return None
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


def state_tensors(model: nn.Module) -> list[torch.Tensor]:
    """Parameters and buffers, in a fixed order."""
    return [p.data for p in model.parameters()] + list(model.buffers())


@torch.no_grad()
def broadcast_state(model: nn.Module, device: torch.device, src: int = 0,
                    group: Any = None) -> None:
    """Copy rank ``src``'s parameters and buffers to every rank: one flat tensor per dtype."""
    tensors = state_tensors(model)
    by_dtype: dict[str, list[torch.Tensor]] = {}
    for t in tensors:
        by_dtype.setdefault(str(t.dtype), []).append(t)
    for key in sorted(by_dtype):
        group_tensors = by_dtype[key]
        flat = torch.cat([t.reshape(-1) for t in group_tensors]).to(device)
        dist.broadcast(flat, src, group=group)
        if dist.get_rank(group) != src:
            col = 0
            for t in group_tensors:
                t.copy_(flat[col:col + t.numel()].view_as(t))
                col += t.numel()


def all_ok(ok: bool, device: torch.device, group: Any = None) -> list[bool]:
    """Each rank's success flag (also a barrier)."""
    mine = torch.tensor([1 if ok else 0], dtype=torch.int32, device=device)
    out = [torch.empty_like(mine) for _ in range(dist.get_world_size(group))]
    dist.all_gather(out, mine, group=group)
    return [bool(int(t)) for t in out]
