"""Streaming data: a search over an image folder that does not live in memory.

Generates (in a temporary folder, deleted afterwards unless ``--keep``) ``--images`` PNG files
of ``--size`` x ``--size`` RGB pixels in 10 class sub-folders (a class colour pattern plus
noise), then measures, in one run:

1. memory: a short search (``--trials`` trials of the ``train`` estimator, ``--steps`` steps
   each plus the validation split) with ``--workers`` DataLoader workers; a thread samples the
   resident memory (RSS, and PSS where the kernel gives it) of the main process and of every
   child process (the workers) every 0.2 s. Goal: every process under 2 GiB.
2. throughput: images per second of the ``train`` estimator's training loop
   (``core.training.train`` on the ``image-folder`` source, as the estimator runs it) against a
   plain PyTorch loop (a ``torch.utils.data.Dataset`` that opens each PNG with Pillow, a
   shuffling ``DataLoader`` with the same workers and batch, the same network, SGD), each
   ``--steps-throughput`` steps from a cold start (first epoch: every image decoded),
   alternated ``--repeats`` times; the best run of each. Goal: frugalnas >= 0.9x plain.

    nice -n 10 python benchmarks/streaming.py [--images 50000] [--workers 2] [--batch 64]
        [--keep DIR]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import tempfile
import threading
import time
from pathlib import Path

import numpy as np
import optuna
import psutil
import torch
from PIL import Image

import frugalnas
from frugalnas.engine.training import TrainConfig, train

os.environ["FRUGALNAS_PROGRESS"] = "0"
optuna.logging.set_verbosity(optuna.logging.WARNING)
GIB = 1 << 30


def generate(root: Path, images: int, size: int, classes: int = 10) -> None:
    rng = np.random.default_rng(0)
    templates = rng.integers(0, 256, (classes, 4, 4, 3)).astype(np.float32)
    for c in range(classes):
        (root / f"class{c}").mkdir(parents=True)
    for i in range(images):
        c = i % classes
        base = np.kron(templates[c], np.ones((size // 4, size // 4, 1), np.float32))
        pixels = np.clip(base + rng.normal(0, 40, base.shape), 0, 255).astype(np.uint8)
        Image.fromarray(pixels).save(root / f"class{c}" / f"{i:06d}.png", compress_level=1)


class MemoryWatch:
    """Peak resident memory of this process and its children, sampled on a thread."""

    def __init__(self) -> None:
        self.peak_process = 0
        self.peak_total_rss = 0
        self.peak_total_pss = 0
        self.processes_seen: set[int] = set()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        me = psutil.Process()
        while not self._stop.is_set():
            rss = pss = 0
            for proc in [me, *me.children(recursive=True)]:
                try:
                    info = proc.memory_full_info()
                except (psutil.NoSuchProcess, psutil.AccessDenied):
                    continue
                self.processes_seen.add(proc.pid)
                self.peak_process = max(self.peak_process, info.rss)
                rss += info.rss
                pss += getattr(info, "pss", info.rss)
            self.peak_total_rss = max(self.peak_total_rss, rss)
            self.peak_total_pss = max(self.peak_total_pss, pss)
            self._stop.wait(0.2)

    def __enter__(self) -> MemoryWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


class PlainFolder(torch.utils.data.Dataset):  # type: ignore[type-arg]
    """What a PyTorch user writes: list the files, open each with Pillow when asked."""

    def __init__(self, root: Path, mean: tuple[float, ...], std: tuple[float, ...]):
        classes = sorted(p.name for p in root.iterdir() if p.is_dir())
        self.files = [(f, label) for label, c in enumerate(classes)
                      for f in sorted((root / c).iterdir())]
        self.mean = torch.tensor(mean).view(-1, 1, 1)
        self.std = torch.tensor(std).view(-1, 1, 1)

    def __len__(self) -> int:
        return len(self.files)

    def __getitem__(self, i: int) -> tuple[torch.Tensor, int]:
        file, label = self.files[i]
        with Image.open(file) as img:
            x = torch.from_numpy(np.asarray(img.convert("RGB"), dtype=np.uint8).transpose(2, 0, 1).copy())
        return (x.float() - self.mean) / self.std, label


def build(space: object, arch: object, seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return space.build(arch, 10, (3, SIZE, SIZE))  # type: ignore[attr-defined]


def plain_loop(root: Path, model: torch.nn.Module, cfg: TrainConfig, steps: int, workers: int,
               mean: tuple[float, ...], std: tuple[float, ...]) -> float:
    start = time.perf_counter()
    loader = torch.utils.data.DataLoader(PlainFolder(root, mean, std), batch_size=cfg.batch_size,
                                         shuffle=True, num_workers=workers,
                                         generator=torch.Generator().manual_seed(0))
    opt = torch.optim.SGD(model.parameters(), lr=cfg.lr, momentum=cfg.momentum,
                          weight_decay=cfg.weight_decay, nesterov=True)
    model.train()
    seen = 0
    for step, (x, y) in enumerate(loader):
        if step == steps:
            break
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        seen += len(y)
    return seen / (time.perf_counter() - start)


def frugalnas_loop(root: Path, model: torch.nn.Module, cfg: TrainConfig, workers: int) -> float:
    data = frugalnas.create_component("datasets", "image-folder", path=str(root), size=SIZE,
                                      num_workers=workers, valid_fraction=0.05, test_fraction=0)
    # The standardisation statistics are read once per study (1,024 images), before its
    # first trial's first batch; the plain loop gets the same figures for free.
    assert data.mean is not None
    backend = frugalnas.create_component("backends", "single-device", device="cpu")
    start = time.perf_counter()
    report = train(backend.prepare(model), data, backend, cfg, seed=0)
    return report.steps * cfg.batch_size / (time.perf_counter() - start)


SIZE = 32


def main() -> None:
    global SIZE
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=50_000)
    ap.add_argument("--size", type=int, default=32)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--batch", type=int, default=64)
    ap.add_argument("--trials", type=int, default=4)
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--steps-throughput", type=int, default=60)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--C", type=int, default=4)
    ap.add_argument("--only", choices=("memory", "throughput"), default=None)
    ap.add_argument("--keep", default=None, help="generate into (or reuse) this folder, keep it")
    args = ap.parse_args()
    SIZE = args.size
    # One thread per process for both loops: on a shared machine, OpenMP threads that spin
    # while another process holds the core make a step several times slower.
    torch.set_num_threads(1)
    scratch = None
    if args.keep:
        root = Path(args.keep)
    else:
        scratch = tempfile.mkdtemp(prefix="frugalnas-streaming-")
        root = Path(scratch) / "images"
    try:
        if not root.exists():
            t = time.perf_counter()
            generate(root, args.images, args.size)
            print(f"generated {args.images} PNG files ({args.size}x{args.size} RGB, 10 classes) "
                  f"in {time.perf_counter() - t:.0f} s")
        space_options = {"N": 1, "C": args.C}
        # -- 1. memory of a short search ------------------------------------------------------
        if args.only != "throughput":
            search(root, args, space_options)
        if args.only != "memory":
            throughput(root, args, space_options)
    finally:
        if scratch is not None:
            shutil.rmtree(scratch, ignore_errors=True)


def search(root: Path, args: argparse.Namespace, space_options: dict[str, int]) -> None:
    with MemoryWatch() as watch:
        t = time.perf_counter()
        study = frugalnas.create_study(
            space="nb201", space_options=space_options, estimator="train",
            estimator_options={"epochs": 1, "batch_size": args.batch, "max_steps": args.steps},
            dataset="image-folder",
            dataset_options={"path": str(root), "size": args.size, "num_workers": args.workers,
                             "valid_fraction": 0.05, "test_fraction": 0, "flip": True,
                             "crop_padding": 4},
            seed=0)
        study.optimize(n_trials=args.trials)
        seconds = time.perf_counter() - t
    states = [t.state.name for t in study.optuna_study.trials]
    print(f"search: {args.trials} trials of `train` ({args.steps} steps of {args.batch}, "
          f"validation on {int(0.05 * args.images)} images) in {seconds:.0f} s, states {states}, "
          f"best {study.best_value:.1f} %")
    print(f"memory: peak RSS of one process {watch.peak_process / GIB:.2f} GiB "
          f"(goal < 2 GiB: {'met' if watch.peak_process < 2 * GIB else 'NOT met'}); "
          f"peak sum over the {len(watch.processes_seen)} processes seen "
          f"(main + workers) RSS {watch.peak_total_rss / GIB:.2f} GiB, "
          f"PSS {watch.peak_total_pss / GIB:.2f} GiB")


def throughput(root: Path, args: argparse.Namespace, space_options: dict[str, int]) -> None:
    # -- 2. throughput against a plain DataLoader loop --------------------------------------
    space = frugalnas.create_component("search_spaces", "nb201", **space_options)
    arch = space.sample(random.Random(0))
    cfg = TrainConfig(epochs=1, batch_size=args.batch, max_steps=args.steps_throughput)
    probe = frugalnas.create_component("datasets", "image-folder", path=str(root), size=args.size)
    mean, std = probe.mean, probe.std
    ours, plain = [], []
    for _ in range(args.repeats):
        plain.append(plain_loop(root, build(space, arch, 0), cfg, args.steps_throughput,
                                args.workers, mean, std))
        ours.append(frugalnas_loop(root, build(space, arch, 0), cfg, args.workers))
    print(f"throughput ({arch}, batch {args.batch}, {args.workers} workers, "
          f"{args.steps_throughput} steps, cold): frugalnas train "
          f"{' '.join(f'{v:.0f}' for v in ours)} images/s, plain DataLoader loop "
          f"{' '.join(f'{v:.0f}' for v in plain)} images/s; best/best "
          f"{max(ours) / max(plain):.3f}x (goal >= 0.9x: "
          f"{'met' if max(ours) >= 0.9 * max(plain) else 'NOT met'})")


if __name__ == "__main__":
    main()
