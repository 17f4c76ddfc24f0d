"""Profiling for the out-of-core backend: per-block times and saved bytes, host link speed.

A profile runs real forward-backward passes of the model on the step's micro-batch with every
block resident (falling back to all-swap when that does not fit on a CUDA device) and puts
back the gradients, buffers and random state afterwards, so profiling leaves no trace on
training.
"""

from __future__ import annotations

import statistics
import time
from collections.abc import Callable, Sequence

import torch
from torch import nn

from frugalnas.backends.out_of_core.cost import RESIDENT, SWAP, BlockProfile, Profile
from frugalnas.backends.out_of_core.hooks import ModelRuntime, StepContext, _unpack, muted_forward_hooks

_BANDWIDTH: dict[str, float] = {}


def measure_bandwidth(device: torch.device, nbytes: int = 32 << 20, repeats: int = 3) -> float:
    """Bytes/s of a device-to-host plus host-to-device round trip, halved (cached per device).
    On the CPU it is the speed of a copy into a separate buffer, which is what swapping does
    there."""
    key = str(device)
    if key in _BANDWIDTH:
        return _BANDWIDTH[key]
    n = nbytes // 4
    src = torch.empty(n, dtype=torch.float32, device=device).fill_(1.0)
    host = torch.empty(n, dtype=torch.float32, pin_memory=device.type == "cuda")
    best = float("inf")
    for _ in range(repeats + 1):
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        start = time.perf_counter()
        host.copy_(src, non_blocking=True)
        src.copy_(host, non_blocking=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        best = min(best, time.perf_counter() - start)
    _BANDWIDTH[key] = 2 * nbytes / best
    return _BANDWIDTH[key]


def param_storages(model: nn.Module) -> set[int]:
    """Storage pointers of the model's parameters and buffers (never counted as activations)."""
    return {t.untyped_storage().data_ptr() for t in (*model.parameters(), *model.buffers())}


def run_step(model: nn.Module, runtime: ModelRuntime, ctx: StepContext, loss_fn: Callable,
             x: torch.Tensor, y: torch.Tensor, loss_scale: float = 1.0) -> tuple[float, float, float]:
    """One forward-backward under ``ctx``. Returns (loss, seconds to the end of forward,
    seconds in all)."""
    n = len(ctx.policies)
    runtime.step = ctx
    sync = ctx.cuda and ctx.profiling
    try:
        start = time.perf_counter()
        with torch.autograd.graph.saved_tensors_hooks(ctx.pack_resident(-1), _unpack):
            loss = loss_fn(model(x), y)
        del x
        if sync:
            torch.cuda.synchronize(ctx.device)
        fwd_end = time.perf_counter()
        if n and ctx.cuda and ctx.policies[-1] == SWAP and not ctx.profiling:
            ctx.prefetch(n - 1)
        ctx.bwd_start = time.perf_counter()
        (loss * loss_scale if loss_scale != 1.0 else loss).backward()
        if sync:
            torch.cuda.synchronize(ctx.device)
        end = ctx.bwd_end = time.perf_counter()
    finally:
        runtime.step = None
        ctx.tracker.set_transient(0)
    return float(loss.detach()), fwd_end - start, end - start


def _one_pass(model: nn.Module, runtime: ModelRuntime, policy: str, device: torch.device,
              loss_fn: Callable, x: torch.Tensor, y: torch.Tensor) -> tuple[StepContext, float, float]:
    n = len(runtime.names)
    ctx = StepContext([policy] * n, device, param_storages(model), [0] * n, profiling=True)
    _, fwd, total = run_step(model, runtime, ctx, loss_fn, x, y)
    return ctx, fwd, total


def _times(ctx: StepContext, fwd_total: float) -> tuple[list[float], float, float]:
    """Per-block backward seconds (from the gradient reaching a block's output to it reaching
    the block below), and the forward and backward seconds outside the blocks."""
    n = len(ctx.policies)
    bwd = [0.0] * n
    times = ctx.grad_times
    start_bwd_ref, end = ctx.bwd_start, ctx.bwd_end
    for i in range(n):
        if i not in times:
            continue
        below = [times[j] for j in range(i - 1, -1, -1) if j in times]
        bwd[i] = max(0.0, (below[0] if below else end) - times[i])
    first = min(times.values()) if times else end
    head_bwd = max(0.0, first - start_bwd_ref)
    head_fwd = max(0.0, fwd_total - sum(ctx.fwd))
    return bwd, head_fwd, head_bwd


_Pass = tuple[StepContext, list[float], float, float, float]


def _passes(model: nn.Module, runtime: ModelRuntime, device: torch.device, loss_fn: Callable,
            x: torch.Tensor, y: torch.Tensor, repeats: int, policy: str = RESIDENT,
            warm_up: bool = True) -> tuple[list[_Pass], str]:
    """``repeats`` timed passes under ``policy`` (after one warm-up pass when ``warm_up``);
    a resident profile that does not fit on a CUDA device is taken with every block swapped.
    Returns the passes and the policy they ran under."""
    passes: list[_Pass] = []
    runs = max(1, repeats) + (1 if warm_up and repeats > 0 else 0)
    for r in range(runs):
        for p in model.parameters():
            p.grad = None
        try:
            ctx, fwd_total, total = _one_pass(model, runtime, policy, device, loss_fn, x, y)
        except torch.OutOfMemoryError:   # in-core does not fit: profile with every block swapped
            if policy != RESIDENT:
                raise
            policy = SWAP
            torch.cuda.empty_cache()
            ctx, fwd_total, total = _one_pass(model, runtime, policy, device, loss_fn, x, y)
        bwd, head_fwd, head_bwd = _times(ctx, fwd_total)
        if r > 0 or not warm_up or runs == 1:
            passes.append((ctx, bwd, head_fwd, head_bwd, total))
    return passes, policy


def _block_medians(passes: list[_Pass], n: int) -> tuple[list[float], list[float]]:
    """The median forward and backward seconds of each block over ``passes``."""
    return ([statistics.median(p[0].fwd[i] for p in passes) for i in range(n)],
            [statistics.median(p[1][i] for p in passes) for i in range(n)])


def context_overhead(model: nn.Module, blocks: int, device: torch.device,
                     repeats: int = 5) -> float:
    """Median seconds the backend spends on a step outside the model: reading the model's
    parameter storages and setting up the step's context (on CUDA its copy streams)."""
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        StepContext([RESIDENT] * blocks, device, param_storages(model), [0] * blocks)
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def profile_model(model: nn.Module, runtime: ModelRuntime, device: torch.device, loss_fn: Callable,
                  x: torch.Tensor, y: torch.Tensor, repeats: int = 2,
                  bandwidth: float | None = None,
                  policies: Sequence[str] = (RESIDENT,)) -> Profile:
    """Measure ``model`` on the micro-batch ``(x, y)``: the median over ``repeats`` passes
    after one warm-up pass is kept for every time. Every block is measured resident, and
    also under each other policy in ``policies`` (:attr:`Profile.measured`)."""
    params = list(model.parameters())
    grads = [p.grad for p in params]
    buffers = list(model.buffers())
    snapshot = [b.detach().clone() for b in buffers]
    rng = torch.get_rng_state()
    cuda_rng = torch.cuda.get_rng_state_all() if device.type == "cuda" else None
    n = len(runtime.names)
    measured: dict[str, tuple[list[float], list[float]]] = {}
    try:
        with muted_forward_hooks(model):
            passes, policy = _passes(model, runtime, device, loss_fn, x, y, repeats)
            measured[policy] = _block_medians(passes, n)
            for other in policies:
                if other not in measured:
                    timed, _ = _passes(model, runtime, device, loss_fn, x, y, repeats,
                                       policy=other, warm_up=False)
                    measured[other] = _block_medians(timed, n)
    finally:
        for p, g in zip(params, grads):
            p.grad = g
        with torch.no_grad():
            for b, s in zip(buffers, snapshot):
                b.copy_(s)
        torch.set_rng_state(rng)
        if cuda_rng is not None:
            torch.cuda.set_rng_state_all(cuda_rng)
    last = passes[-1][0]
    fwd, bwd = measured[policy]
    blocks = [BlockProfile(name=runtime.names[i], fwd=fwd[i], bwd=bwd[i],
                           saved=last.saved[i], input=last.inputs[i]) for i in range(n)]
    incore = last.fixed_saved + last.tail_saved + sum(b.saved for b in blocks)
    return Profile(blocks=blocks, head_fwd=statistics.median(p[2] for p in passes),
                   head_bwd=statistics.median(p[3] for p in passes), fixed=last.fixed_saved,
                   tail=last.tail_saved,
                   bandwidth=bandwidth or measure_bandwidth(device),
                   overlap=device.type == "cuda",
                   incore_peak=last.tracker.peak if policy == RESIDENT else incore,
                   extra={"profile_policy": 0.0 if policy == RESIDENT else 1.0,
                          "measured_step_s": statistics.median(p[4] for p in passes)},
                   measured=measured, step_overhead=context_overhead(model, n, device))


__all__: Sequence[str] = ["context_overhead", "measure_bandwidth", "param_storages", "profile_model",
                          "run_step"]
