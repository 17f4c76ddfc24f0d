"""Virtual nodes on one device: throughput against the native batch, and peak memory against V.

For each V the same global batch is trained with the ``virtual-node`` backend (one process)
and, side by side, with the ``single-device`` backend (the native batch). Reported:

* ``throughput``: examples per second, and its ratio to the native batch (goal >= 0.90);
* ``saved_peak``: peak bytes of tensors saved for backward that are alive at once, counted
  through ``torch.autograd.graph.saved_tensors_hooks`` (each tensor counted once, parameters
  excluded) - the activation memory virtual nodes divide (goal: about 1/V);
* with ``--device cuda`` also ``torch.cuda.max_memory_allocated`` per step.

Fast default: ``python benchmarks/virtual_node.py``; larger: ``--batch 256 --width 32 --steps 10``."""

from __future__ import annotations

import argparse
import time
import weakref

import torch
from torch import nn

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.backends.virtual_node.backend import VirtualNodeBackend


def make_net(width: int, classes: int = 10) -> nn.Module:
    def block(cin: int, cout: int) -> list[nn.Module]:
        return [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]

    torch.manual_seed(0)
    return nn.Sequential(*block(3, width), *block(width, width), nn.MaxPool2d(2),
                         *block(width, 2 * width), *block(2 * width, 2 * width),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Dropout(0.1),
                         nn.Linear(2 * width, classes))


class SavedBytes:
    """Tracks the bytes of saved-for-backward storages alive at once, and the peak."""

    def __init__(self, exclude: set[int]):
        self.exclude, self.live, self.now, self.peak = exclude, {}, 0, 0

    def pack(self, t: torch.Tensor):
        # A tensor is identified by its address and size, so a view of a larger batch counts
        # only its own bytes and a tensor saved by two ops counts once.
        key = (t.data_ptr(), t.numel() * t.element_size())
        if t.data_ptr() in self.exclude or t.numel() == 0:
            return t
        count, size = self.live.get(key, (0, key[1]))
        if count == 0:
            self.now += size
            self.peak = max(self.peak, self.now)
        self.live[key] = (count + 1, size)
        handle = _Handle(t)
        weakref.finalize(handle, self._release, key)
        return handle

    def _release(self, key: tuple[int, int]) -> None:
        count, size = self.live[key]
        if count == 1:
            del self.live[key]
            self.now -= size
        else:
            self.live[key] = (count - 1, size)

    @staticmethod
    def unpack(x):
        return x.tensor if isinstance(x, _Handle) else x


class _Handle:
    __slots__ = ("tensor", "__weakref__")

    def __init__(self, tensor: torch.Tensor):
        self.tensor = tensor


def measure(backend, width: int, batch: int, steps: int, device: str) -> dict[str, float]:
    model = backend.prepare(make_net(width))
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    loss_fn = nn.CrossEntropyLoss()
    g = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, 32, 32, generator=g)
    y = torch.randint(0, 10, (batch,), generator=g)
    backend.train_step(model, opt, loss_fn, x, y, 0)  # warm-up
    params = {p.data_ptr() for p in model.parameters()}
    tracker = SavedBytes(params)
    with torch.autograd.graph.saved_tensors_hooks(tracker.pack, tracker.unpack):
        backend.train_step(model, opt, loss_fn, x, y, 1)
    cuda_peak = 0
    if device.startswith("cuda"):
        torch.cuda.synchronize()
        torch.cuda.reset_peak_memory_stats()
        backend.train_step(model, opt, loss_fn, x, y, 2)
        torch.cuda.synchronize()
        cuda_peak = torch.cuda.max_memory_allocated()
    start = time.perf_counter()
    for step in range(steps):
        backend.train_step(model, opt, loss_fn, x, y, 3 + step)
    if device.startswith("cuda"):
        torch.cuda.synchronize()
    seconds = time.perf_counter() - start
    return {"throughput": batch * steps / seconds, "saved_peak": tracker.peak, "cuda_peak": cuda_peak}


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--batch", type=int, default=128)
    parser.add_argument("--width", type=int, default=16, help="channels of the first conv layers")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per configuration")
    parser.add_argument("--virtual-nodes", type=int, nargs="+", default=[1, 2, 4, 8])
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    parser.add_argument("--threads", type=int, default=1,
                        help="CPU intra-op threads for both sides (0: leave torch's default)")
    parser.add_argument("--repeats", type=int, default=2,
                        help="alternate native/virtual runs this many times; best time kept")
    args = parser.parse_args(argv)
    if args.threads > 0:
        torch.set_num_threads(args.threads)
    print(f"device={args.device} batch={args.batch} width={args.width} steps={args.steps} "
          f"threads={torch.get_num_threads()}")
    header = f"{'config':>10} {'ex/s':>9} {'vs native':>9} {'saved MiB':>10} {'saved ratio':>11}"
    print(header + (f" {'cuda MiB':>9}" if args.device.startswith("cuda") else ""))
    native = None
    for v in args.virtual_nodes:
        best_n, best_v = None, None
        for _ in range(args.repeats):  # interleaved, so load changes hit both sides alike
            n = measure(SingleDeviceBackend(args.device), args.width, args.batch, args.steps, args.device)
            r = measure(VirtualNodeBackend(virtual_nodes=v, device=args.device, threads=None),
                        args.width, args.batch, args.steps, args.device)
            best_n = n if best_n is None or n["throughput"] > best_n["throughput"] else best_n
            best_v = r if best_v is None or r["throughput"] > best_v["throughput"] else best_v
        native = native or best_n
        ratio = best_v["throughput"] / best_n["throughput"]
        line = (f"{'V=' + str(v):>10} {best_v['throughput']:9.1f} {ratio:9.3f} "
                f"{best_v['saved_peak'] / 2**20:10.2f} {best_v['saved_peak'] / native['saved_peak']:11.3f}")
        if args.device.startswith("cuda"):
            line += f" {best_v['cuda_peak'] / 2**20:9.1f}"
        print(line)
    line = (f"{'native':>10} {native['throughput']:9.1f} {1.0:9.3f} "
            f"{native['saved_peak'] / 2**20:10.2f} {1.0:11.3f}")
    if args.device.startswith("cuda"):
        line += f" {native['cuda_peak'] / 2**20:9.1f}"
    print(line)


if __name__ == "__main__":
    main()
