"""Out-of-core benchmark: the planned swap/recompute mix vs all-swap vs all-recompute vs in-core.

All modes train the same NB201 network on the same batches under the same budget, given as a
fraction of the saved-activation bytes of in-core training (measured by the backend's hooks).
Reported per mode: median step time, peak saved bytes held on the device (and, on CUDA,
``torch.cuda.max_memory_allocated``), whether the budget was met, and the plan.

    python benchmarks/out_of_core.py                    # fast CPU default
    python benchmarks/out_of_core.py --device cuda --N 5 --C 16 --batch 256 --size 32
    python benchmarks/out_of_core.py --space gpt --budget-fraction 0.4   # nanoGPT's shape, tokens

``--space gpt`` trains a decoder-only language model of the ``gpt`` space instead (``--arch``,
default nanoGPT's small CPU shape: 4 layers, 4 heads, width 128) on random byte tokens
(``--batch`` sequences of ``--context`` tokens), with the next-token loss; its blocks are the
embedding, each transformer block and the output.
"""

from __future__ import annotations

import argparse
import copy
import statistics
import time
import warnings

import torch
from torch import nn

from frugalnas.backends.out_of_core.backend import OutOfCoreBackend
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.spaces.nb201.space import NB201Space

CELL = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"


def sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_steps(backend, model: nn.Module, x, y, steps: int, warmup: int,
               loss) -> tuple[float, int]:
    """Median seconds of ``steps`` forward-backward calls after ``warmup`` ones; CUDA peak."""
    device = backend.device
    for _ in range(warmup):
        model.zero_grad(set_to_none=True)
        backend.forward_backward(model, loss, x, y)
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)
    if hasattr(backend, "reset_peak_memory"):
        backend.reset_peak_memory()
    times = []
    for _ in range(steps):
        model.zero_grad(set_to_none=True)
        sync(device)
        start = time.perf_counter()
        backend.forward_backward(model, loss, x, y)
        sync(device)
        times.append(time.perf_counter() - start)
    peak = torch.cuda.max_memory_allocated(device) if device.type == "cuda" else 0
    return statistics.median(times), peak


def network(args: argparse.Namespace, device: torch.device):
    """The network, a batch, the loss and a one-line description."""
    torch.manual_seed(0)
    if args.space == "gpt":
        from frugalnas.ports.task import LANGUAGE_MODELLING
        from frugalnas.spaces.gpt.space import GPTSpace

        space = GPTSpace(context=args.context)
        base = space.build(space.parse(args.arch), 256, (args.context,))
        x, y = LANGUAGE_MODELLING.example_batch(args.batch, (args.context,), 256)
        return (base, x.to(device), y.to(device), LANGUAGE_MODELLING,
                f"{args.arch}, batch {args.batch}x{args.context} byte tokens")
    space = NB201Space(N=args.N, C=args.C)
    base = space.build(space.parse(CELL), 10, (3, args.size, args.size))
    x = torch.randn(args.batch, 3, args.size, args.size, device=device)
    y = torch.randint(0, 10, (args.batch,), device=device)
    return (base, x, y, nn.CrossEntropyLoss(),
            f"NB201 N={args.N} C={args.C}, batch {args.batch}x3x{args.size}x{args.size}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--N", type=int, default=2, help="cells per stage")
    ap.add_argument("--C", type=int, default=8, help="stem channels")
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--size", type=int, default=16, help="input height and width")
    ap.add_argument("--budget-fraction", type=float, default=0.35,
                    help="budget as a fraction of in-core saved-activation bytes")
    ap.add_argument("--steps", type=int, default=5)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    ap.add_argument("--host-bandwidth", type=float, default=None, help="bytes/s (default: measured)")
    ap.add_argument("--planner", default="auto")
    ap.add_argument("--space", choices=("nb201", "gpt"), default="nb201")
    ap.add_argument("--arch", default="gpt:w128/h4r4,h4r4,h4r4,h4r4",
                    help="the gpt network (with --space gpt)")
    ap.add_argument("--context", type=int, default=64, help="tokens per sequence (gpt)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    warnings.simplefilter("ignore")
    device = torch.device(args.device)

    base, x, y, loss, what = network(args, device)

    probe = OutOfCoreBackend(device=args.device, policy="resident", profile_repeats=0)
    pm = probe.prepare(copy.deepcopy(base))
    probe.forward_backward(pm, loss, x, y)
    incore_bytes = probe.last_plan.profile.incore_peak
    budget = int(args.budget_fraction * incore_bytes)
    print(f"{what}, device {device}, "
          f"{args.threads} thread(s); {len(probe.last_plan.policies)} blocks; in-core saved "
          f"activations {incore_bytes / 2**20:.2f} MiB; budget {args.budget_fraction:.0%} = "
          f"{budget / 2**20:.2f} MiB")

    rows = []
    model = SingleDeviceBackend(args.device).prepare(copy.deepcopy(base))
    t, cuda_peak = time_steps(SingleDeviceBackend(args.device), model, x, y, args.steps,
                              args.warmup, loss)
    rows.append(("in-core", t, incore_bytes, cuda_peak, incore_bytes <= budget, "all resident"))
    plans = {}
    for mode in ("plan", "swap", "recompute"):
        backend = OutOfCoreBackend(device=args.device, budget=budget, policy=mode,
                                   host_bandwidth=args.host_bandwidth, planner=args.planner)
        model = backend.prepare(copy.deepcopy(base))
        t, cuda_peak = time_steps(backend, model, x, y, args.steps, args.warmup, loss)
        plan = backend.last_plan
        plans[mode] = plan
        mix = ", ".join(f"{k} {v}" for k, v in plan.counts().items() if v)
        rows.append((mode if mode == "plan" else f"all-{mode}", t, backend.max_step_peak, cuda_peak,
                     backend.max_step_peak <= budget, mix))

    print(f"\n{'mode':<14}{'step ms':>10}{'saved MiB':>11}{'cuda MiB':>10}{'budget met':>12}  plan")
    for name, t, peak, cuda_peak, met, mix in rows:
        cuda = f"{cuda_peak / 2**20:10.1f}" if device.type == "cuda" else f"{'-':>10}"
        print(f"{name:<14}{t * 1e3:10.2f}{peak / 2**20:11.2f}{cuda}{'yes' if met else 'NO':>12}  {mix}")
    times = {r[0]: r[1] for r in rows}
    met = {r[0]: r[4] for r in rows}
    best_uniform = min(times["all-swap"], times["all-recompute"])
    print(f"\nplanned mix vs best of all-swap/all-recompute: {best_uniform / times['plan']:.2f}x faster "
          f"(goal on GPU >= 1.2x); planned vs in-core: {times['plan'] / times['in-core']:.2f}x the time; "
          f"budget met by the plan: {'yes' if met['plan'] else 'NO'}")
    print("\nplan table:\n" + plans["plan"].table())


if __name__ == "__main__":
    main()
