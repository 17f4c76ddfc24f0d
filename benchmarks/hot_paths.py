"""The hot paths on the CPU, each beside its plain counterpart, measured in one run.

* ``loop overhead``: the shared training loop (:func:`frugalnas.engine.training.train` on the
  single-device backend) against a hand-written PyTorch loop doing the same training (same
  network, data order, SGD with Nesterov momentum, cosine schedule, losses kept), on a tiny
  network where Python dominates each step as kernel launches do on a GPU. The ratio is the
  median of interleaved repeats, frugalnas's step time over the plain loop's. Goal <= 1.05.
* ``selected cells/s``: the ``selected`` proxy ensemble's scoring rate on its fast path over
  its reference path (``benchmarks/proxy_speed.py``: 20 random NB201 cells, N=5 C=16,
  interleaved, bitwise the same scores). Goal >= 3.
* ``planner error``: the out-of-core backend's predicted step time for its plan against the
  median of the steps it then times, on an NB201 network (N=2, C=8, batch 32 at 16x16) under
  a budget of 35 % of its in-core saved activations; the uniform swap and recompute plans
  are shown beside it. Goal: within 10 %.

    python benchmarks/hot_paths.py [--repeats 7] [--threads 1]

One thread by default (``--threads``), so that the figures do not depend on how many cores
the machine has free.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable

import torch
from torch import nn

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.engine.training import TrainConfig, make_optimizer, train
from frugalnas.ports.data import Dataset, epoch_order

STEPS_PER_EPOCH = 64
BATCH = 32


def tiny_data(seed: int = 0) -> Dataset:
    g = torch.Generator().manual_seed(seed)
    n = STEPS_PER_EPOCH * BATCH
    x = torch.randn(n, 1, 4, 8, generator=g)
    y = torch.randint(0, 10, (n,), generator=g)
    return Dataset("tiny", x, y, x[:256], y[:256], num_classes=10)


def tiny_net(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Flatten(), nn.Linear(32, 32), nn.ReLU(), nn.Linear(32, 10))


def plain_loop(net: nn.Module, data: Dataset, cfg: TrainConfig) -> list[float]:
    """What a user writes by hand: the same training as ``train``, losses read at the end."""
    optimizer = make_optimizer(net, cfg)
    total = int(cfg.epochs * STEPS_PER_EPOCH)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=total)
    criterion = nn.CrossEntropyLoss()
    x_all, y_all = data.train_x, data.train_y
    losses = []
    net.train()
    for epoch in range(int(cfg.epochs)):
        order = epoch_order(len(x_all), True, 0, epoch)
        for start in range(0, len(x_all), cfg.batch_size):
            idx = order[start:start + cfg.batch_size]
            optimizer.zero_grad(set_to_none=True)
            loss = criterion(net(x_all[idx]), y_all[idx])
            loss.backward()
            optimizer.step()
            scheduler.step()
            losses.append(loss.detach())
    return torch.stack(losses).tolist()


def shared_loop(net: nn.Module, data: Dataset, cfg: TrainConfig) -> list[float]:
    return train(net, data, SingleDeviceBackend("cpu"), cfg).losses


def seconds_per_step(run: Callable[[nn.Module, Dataset, TrainConfig], list[float]],
                     data: Dataset, cfg: TrainConfig) -> tuple[float, list[float]]:
    net = tiny_net()
    begin = time.perf_counter()
    losses = run(net, data, cfg)
    return (time.perf_counter() - begin) / len(losses), losses


def loop_overhead(repeats: int, epochs: int = 8) -> float:
    data, cfg = tiny_data(), TrainConfig(epochs=epochs, batch_size=BATCH)
    ours, plain = [], []
    seconds_per_step(shared_loop, data, cfg)  # warm both paths up
    for _ in range(repeats):
        t, shared_losses = seconds_per_step(shared_loop, data, cfg)
        ours.append(t)
        t, plain_losses = seconds_per_step(plain_loop, data, cfg)
        plain.append(t)
    if shared_losses != plain_losses:
        raise SystemExit("the shared loop and the plain loop trained differently")
    ratio = statistics.median(o / p for o, p in zip(ours, plain))
    print(f"loop: {statistics.median(ours) * 1e6:.1f} us/step shared, "
          f"{statistics.median(plain) * 1e6:.1f} us/step plain "
          f"({len(shared_losses)} steps, tiny MLP, batch {BATCH}), same losses", flush=True)
    print(f"loop overhead: {ratio:.3f} x", flush=True)
    return ratio


def planner_error(steps: int = 12) -> float:
    """The planned mix's prediction error in percent (the uniform plans printed beside it)."""
    import copy

    from frugalnas.backends.out_of_core.backend import OutOfCoreBackend
    from frugalnas.spaces.nb201.space import NB201Space
    from out_of_core import CELL  # the network of the out-of-core benchmark

    space = NB201Space(N=2, C=8)
    torch.manual_seed(0)
    base = space.build(space.parse(CELL), 10, (3, 16, 16))
    x, y = torch.randn(32, 3, 16, 16), torch.randint(0, 10, (32,))
    errors = {}
    for policy in ("plan", "swap", "recompute"):
        backend = OutOfCoreBackend(device="cpu", budget_fraction=0.35, policy=policy)
        model = backend.prepare(copy.deepcopy(base))
        for _ in range(steps):
            model.zero_grad(set_to_none=True)
            backend.forward_backward(model, nn.functional.cross_entropy, x, y)
        plan = backend.last_plan
        errors[policy] = 100 * plan.prediction_error()
        print(f"out-of-core {policy:<9}: predicted {plan.time * 1e3:.2f} ms, measured "
              f"{plan.measured_step() * 1e3:.2f} ms ({plan.counts_text()})", flush=True)
    print(f"planner error: {errors['plan']:+.1f} % (uniform swap {errors['swap']:+.1f} %, "
          f"recompute {errors['recompute']:+.1f} %)", flush=True)
    return errors["plan"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--threads", type=int, default=1)
    args = parser.parse_args(argv)
    torch.set_num_threads(args.threads)
    loop_overhead(args.repeats)
    from proxy_speed import selected_speed  # (this folder is on the path when run as a script)

    selected_speed(threads=args.threads)
    planner_error()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
