"""Saved-tensor hooks of the out-of-core backend: count, swap and recompute block activations.

Every tensor autograd saves during a step passes through a pack hook. Resident tensors stay
on the device and are counted by a :class:`Tracker` until autograd frees them; swapped ones
are copied to host memory (on CUDA asynchronously on a side stream into pinned memory) and
copied back ahead of the backward of their block, one copy per storage: the views of one
storage a block saves several times (a transformer's normalised input, saved by its query, key
and value projections) travel once, as the profile counts them; recomputed blocks run under
``torch.utils.checkpoint`` (non-reentrant), which keeps only the block's input.
"""

from __future__ import annotations

import time
import weakref
from collections import OrderedDict
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from torch import nn
from torch.utils.checkpoint import checkpoint

from frugalnas.backends.out_of_core.cost import RECOMPUTE, RESIDENT, SWAP


def _storage_key(t: torch.Tensor) -> tuple[int, int]:
    s = t.untyped_storage()
    return s.data_ptr(), s.nbytes()


@contextmanager
def muted_forward_hooks(module: nn.Module) -> Iterator[None]:
    """Run forward passes that are not steps of their own (profiling, recomputation) without
    the modules' forward hooks, so observers (e.g. the virtual-node backend's BatchNorm
    recorder) see each layer once per step."""
    muted = []
    for m in module.modules():
        if m._forward_hooks:
            muted.append((m, m._forward_hooks))
            m._forward_hooks = OrderedDict()
    try:
        yield
    finally:
        for m, hooks in muted:
            m._forward_hooks = hooks


class Tracker:
    """Live count of saved-activation bytes held on the device (deduplicated by storage)."""

    def __init__(self) -> None:
        self.current = 0
        self.peak = 0
        self.transient = 0
        self._refs: dict[int, list[int]] = {}

    def hold(self, owner: object, t: torch.Tensor) -> None:
        """Count ``t`` until ``owner`` is garbage (autograd dropped the saved tensor)."""
        ptr, nbytes = _storage_key(t)
        if ptr == 0:
            return
        ref = self._refs.get(ptr)
        if ref is None:
            self._refs[ptr] = [1, nbytes]
            self.current += nbytes
            self._bump()
        else:
            ref[0] += 1
        weakref.finalize(owner, self._release, ptr)

    def _release(self, ptr: int) -> None:
        ref = self._refs[ptr]
        ref[0] -= 1
        if ref[0] == 0:
            self.current -= ref[1]
            del self._refs[ptr]

    def set_transient(self, nbytes: int) -> None:
        """Bytes a block regenerates for its own backward (recomputation works inside
        checkpoint's hooks, so they are counted from the profile)."""
        self.transient = nbytes
        self._bump()

    def _bump(self) -> None:
        self.peak = max(self.peak, self.current + self.transient)


class _Held:
    __slots__ = ("t", "__weakref__")

    def __init__(self, t: torch.Tensor):
        self.t = t


class _SwappedStorage:
    """One device storage a swapped block saved, copied to host memory (``host``, bytes); on
    the way back ``dev`` holds the device copy. Every saved view of the storage shares it."""

    __slots__ = ("host", "offloaded", "device", "dev", "ready", "__weakref__")

    def __init__(self, host: torch.Tensor, offloaded: Any, device: torch.device):
        self.host, self.offloaded, self.device = host, offloaded, device
        self.dev: torch.Tensor | None = None
        self.ready: Any = None


class _Swapped:
    """A saved tensor of a swapped block: a view (dtype, offset, size, stride) of a
    :class:`_SwappedStorage`."""

    __slots__ = ("storage", "dtype", "offset", "size", "stride", "__weakref__")

    def __init__(self, storage: _SwappedStorage, t: torch.Tensor):
        self.storage, self.dtype = storage, t.dtype
        self.offset, self.size, self.stride = t.storage_offset(), t.size(), t.stride()


def _bytes_of(t: torch.Tensor) -> torch.Tensor:
    """The whole storage of ``t`` as a flat uint8 tensor (no copy)."""
    flat: torch.Tensor = torch.empty(0, dtype=torch.uint8, device=t.device).set_(
        t.untyped_storage())
    return flat


def _unpack(obj: Any) -> torch.Tensor:
    if isinstance(obj, _Held):
        return obj.t
    if isinstance(obj, _Swapped):
        rec = obj.storage
        if rec.dev is not None:
            base = rec.dev
            if rec.ready is not None:
                stream = torch.cuda.current_stream()
                stream.wait_event(rec.ready)
                base.record_stream(stream)
        elif rec.offloaded is None:       # CPU, not prefetched: read the host copy
            base = rec.host
        else:                             # CUDA, not prefetched: fetch now (once per storage)
            torch.cuda.current_stream(rec.device).wait_event(rec.offloaded)
            base = rec.dev = rec.host.to(rec.device)
        view: torch.Tensor = torch.empty(0, dtype=obj.dtype, device=base.device).set_(
            base.untyped_storage(), obj.offset, obj.size, obj.stride)
        return view
    return obj


class StepContext:
    """State of one forward-backward: policies, tracker, swapped handles per block, CUDA
    streams, and (when profiling) per-block timings and saved bytes."""

    def __init__(self, policies: Sequence[str], device: torch.device, skip: set[int],
                 working_set: Sequence[int], profiling: bool = False):
        self.policies = list(policies)
        self.device = device
        self.skip = skip                  # storage pointers of parameters and buffers
        self.working_set = list(working_set)
        self.tracker = Tracker()
        self.swapped: list[list[weakref.ref]] = [[] for _ in policies]
        # per block: storage pointer -> (the storage, its host copy), both weakly referenced
        self._swap_storages: list[dict[int, tuple[weakref.ref[torch.UntypedStorage],
                                                  weakref.ref[_SwappedStorage]]]] = [
            {} for _ in policies]
        self.cuda = device.type == "cuda"
        if self.cuda:
            self.d2h = torch.cuda.Stream(device)
            self.h2d = torch.cuda.Stream(device)
        self.profiling = profiling
        self.fwd = [0.0] * len(policies)
        self.saved = [0] * len(policies)
        self.inputs = [0] * len(policies)
        self.fixed_saved = 0              # outside the blocks, before or between them
        self.tail_saved = 0               # outside the blocks, after the last one
        self.after_blocks = False         # the last block's forward has returned
        self.grad_times: dict[int, float] = {}
        self.bwd_start = self.bwd_end = 0.0
        self._counted: list[set[int]] = [set() for _ in range(len(policies) + 1)]

    # -- packing ---------------------------------------------------------------------
    def _is_activation(self, t: torch.Tensor) -> bool:
        return (t.device.type == self.device.type and t.numel() > 0
                and t.untyped_storage().data_ptr() not in self.skip)

    def _count(self, block: int, t: torch.Tensor) -> None:
        """Profiling: add ``t``'s storage to the saved bytes of ``block`` (-1: outside, in
        the tail once the last block has run)."""
        ptr, nbytes = _storage_key(t)
        if ptr in self._counted[block]:
            return
        self._counted[block].add(ptr)
        if block >= 0:
            self.saved[block] += nbytes
        elif self.after_blocks:
            self.tail_saved += nbytes
        else:
            self.fixed_saved += nbytes

    def pack_resident(self, block: int) -> Callable[[torch.Tensor], Any]:
        """Pack hook keeping tensors on the device; ``block`` -1 is outside every block, -2
        the input a recomputed block keeps."""
        def pack(t: torch.Tensor) -> Any:
            if not self._is_activation(t):
                return t
            held = _Held(t)
            self.tracker.hold(held, t)
            if self.profiling and block >= -1:
                self._count(block, t)
            return held
        return pack

    def pack_swap(self, block: int) -> Callable[[torch.Tensor], Any]:
        """Pack hook copying tensors to host memory, each storage once per block (a storage
        saved again through another view shares the first copy)."""
        def pack(t: torch.Tensor) -> Any:
            if not self._is_activation(t):
                return t
            if self.profiling:
                self._count(block, t)
            storage = t.untyped_storage()
            ptr = storage.data_ptr()
            seen = self._swap_storages[block].get(ptr)
            rec = seen[1]() if seen is not None and seen[0]() is storage else None
            if rec is None:
                rec = self._offload(t)
                self.swapped[block].append(weakref.ref(rec))
                # the storage's Python object lives exactly as long as the storage, so a
                # freed one whose address is reused is never taken for this one
                self._swap_storages[block][ptr] = (weakref.ref(storage), weakref.ref(rec))
            return _Swapped(rec, t)
        return pack

    def _offload(self, t: torch.Tensor) -> _SwappedStorage:
        """Copy the whole storage of ``t`` to host memory (on CUDA asynchronously)."""
        src = _bytes_of(t)
        host = torch.empty(src.numel(), dtype=torch.uint8, device="cpu", pin_memory=self.cuda)
        event = None
        if self.cuda:
            current = torch.cuda.current_stream(t.device)
            self.d2h.wait_stream(current)
            with torch.cuda.stream(self.d2h):
                host.copy_(src, non_blocking=True)
                event = torch.cuda.Event()
                event.record(self.d2h)
            t.record_stream(self.d2h)
        else:
            host.copy_(src)
        return _SwappedStorage(host, event, t.device)

    def prefetch(self, block: int) -> None:
        """Copy block ``block``'s swapped activations back to the device."""
        for ref in self.swapped[block]:
            handle = ref()
            if handle is None or handle.dev is not None:
                continue
            host = handle.host
            if self.cuda:
                with torch.cuda.stream(self.h2d):
                    self.h2d.wait_event(handle.offloaded)
                    dev = torch.empty_like(host, device=self.device)
                    dev.copy_(host, non_blocking=True)
                    handle.ready = torch.cuda.Event()
                    handle.ready.record(self.h2d)
            else:
                dev = host.clone()
            handle.dev = dev
            self.tracker.hold(handle, dev)
        self.swapped[block] = []

    # -- block boundaries in backward ----------------------------------------------------
    def on_grad(self, block: int) -> None:
        """The gradient reached block ``block``'s output: its backward starts."""
        if self.profiling:
            if self.cuda:
                torch.cuda.synchronize(self.device)
            self.grad_times[block] = time.perf_counter()
            if not self.cuda and self.policies[block] == SWAP:
                self.prefetch(block)   # as a step does: the copy back is part of its cost
            return
        policy = self.policies[block]
        self.tracker.set_transient(self.working_set[block] if policy == RECOMPUTE else 0)
        if not self.cuda:              # no copy engine to overlap with: fetch when needed
            if policy == SWAP:
                self.prefetch(block)
        elif block > 0 and self.policies[block - 1] == SWAP:
            self.prefetch(block - 1)   # one block ahead, beside this block's backward


class BlockRunner:
    """Replaces a block's ``forward``: runs the original one under the policy of the active
    step (plain call outside a step, or when gradients are off)."""

    def __init__(self, module: nn.Module, index: int, runtime: "ModelRuntime"):
        self.forward = module.forward
        self.index = index
        self.runtime = runtime
        self.module_ref = weakref.ref(module)

    def __reduce__(self) -> Any:
        # A pickled or deep-copied model carries its blocks' plain forward, not the runner.
        return self.forward.__reduce__()

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        ctx = self.runtime.step
        if ctx is None or not torch.is_grad_enabled():
            return self.forward(*args, **kwargs)
        i = self.index
        if ctx.profiling:
            if ctx.cuda:
                torch.cuda.synchronize(ctx.device)
            start = time.perf_counter()
            ctx.inputs[i] = sum(a.untyped_storage().nbytes() for a in args if isinstance(a, torch.Tensor))
        policy = ctx.policies[i]
        if policy == SWAP:
            with torch.autograd.graph.saved_tensors_hooks(ctx.pack_swap(i), _unpack):
                out = self.forward(*args, **kwargs)
        elif policy == RECOMPUTE:
            with torch.autograd.graph.saved_tensors_hooks(ctx.pack_resident(-2), _unpack):
                out = checkpoint(self._recomputable(), *args, use_reentrant=False, **kwargs)
        else:
            with torch.autograd.graph.saved_tensors_hooks(ctx.pack_resident(i), _unpack):
                out = self.forward(*args, **kwargs)
        if ctx.profiling:
            if ctx.cuda:
                torch.cuda.synchronize(ctx.device)
            ctx.fwd[i] = time.perf_counter() - start
        if i == len(ctx.policies) - 1:
            ctx.after_blocks = True
        if isinstance(out, torch.Tensor) and out.requires_grad:
            out.register_hook(lambda g, ctx=ctx, i=i: ctx.on_grad(i))
        return out

    def _recomputable(self) -> Callable[..., Any]:
        """The block's forward for checkpoint; the second call (the recomputation in backward)
        restores the block's buffers afterwards, so BatchNorm running statistics are updated
        once per step, as in-core."""
        calls = [0]
        module = self.module_ref()

        def run(*args: Any, **kwargs: Any) -> Any:
            calls[0] += 1
            if calls[0] == 1 or module is None:
                return self.forward(*args, **kwargs)
            buffers = [b for b in module.buffers()]
            snapshot = [b.detach().clone() for b in buffers]
            try:                       # checkpoint may stop the recomputation early
                with muted_forward_hooks(module):
                    return self.forward(*args, **kwargs)
            finally:
                with torch.no_grad():
                    for b, s in zip(buffers, snapshot):
                        b.copy_(s)
        return run


class ModelRuntime:
    """The blocks of one model wrapped by the backend, and the step running now (if any)."""

    def __init__(self, model: nn.Module, blocks: Sequence[tuple[str, nn.Module]], key: str):
        self.key = key
        self.names = [name for name, _ in blocks]
        self.step: StepContext | None = None
        self.runners: list[BlockRunner] = []
        for i, (_, module) in enumerate(blocks):
            runner = BlockRunner(module, i, self)
            module.forward = runner  # type: ignore[method-assign]
            self.runners.append(runner)
        self.model_ref = weakref.ref(model)

    def unwrap(self) -> None:
        """Give every block its original ``forward`` back."""
        for runner in self.runners:
            module = runner.module_ref()
            if module is not None and module.__dict__.get("forward") is runner:
                del module.forward
        self.runners = []


__all__ = ["BlockRunner", "ModelRuntime", "StepContext", "Tracker", "RESIDENT", "SWAP", "RECOMPUTE"]
