"""Every GPU figure frugalnas claims, measured in one prepared run on a lent device machine.

Five parts, each in its own subprocess with its own time box, so a slow or failing part
cannot starve the others (the whole run stays within ``--total`` seconds, 480 on a device):

1. ``out_of_core``: the KARMA claim. A ResNet-50-like, a VGG-16-like and a deep NB201 network,
   each at a batch whose saved activations exceed a budget (``budget=`` of the
   ``out-of-core`` backend; on CUDA also enforced with
   ``torch.cuda.set_per_process_memory_fraction``): images/s of all-swap, all-recompute and
   the planner's mix at that batch, and of in-core training at the largest batch that fits
   the budget; planned mix / best single policy; peak memory against the budget.
2. ``virtual_nodes``: the same V=8 training on the GPU and on the CPU (final weights
   compared, TF32 off), bitwise equality across 1 and 2 processes (2 GPUs needed), and
   throughput against the native batch on one device.
3. ``train_throughput``: the ``train`` estimator (through a study) against a plain PyTorch
   loop on the same network and data, with AMP and channels_last for the plain loop.
4. ``proxies_supernet``: NB201 cells per second of the ``selected`` rank ensemble, and SPOS
   supernet training steps per second.
5. ``sievo``: an SI-EvoNAS search at CIFAR size (32x32 synthetic images, 16 channels).

``--rehearse`` runs every part end to end on the CPU at tiny sizes (the same code paths; CUDA
only steps are recorded as skipped with their reason). Results go to ``OUT/device.json``,
the parts' output to ``OUT/device.log``. Run it through ``benchmarks/device.sh``; see
docs/device.md.

    python benchmarks/device.py --out device-out                 # on the device machine
    python benchmarks/device.py --out /tmp/rehearsal --rehearse  # anywhere, in about a minute
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime
import importlib.util
import inspect
import json
import math
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
import types
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

BENCH_DIR = Path(__file__).resolve().parent
ROOT = BENCH_DIR.parent
SCHEMA = 1
#: Modules whose presence the run records; the parts find out exactly what they lack by
#: importing (a part missing one reports ``skipped: <module> missing``).
PROBED_MODULES = ("torch", "numpy", "scipy", "pluggy", "optuna", "cloudpickle", "tqdm",
                  "sklearn", "pandas", "mlflow", "lightgbm", "mlxtend", "sqlalchemy")
#: Plugins no part needs (tracking, the progress bar): blocked in every study.
QUIET_PLUGINS = ("mlflow", "progress")
MiB = 2**20


# -- parts, time boxes ------------------------------------------------------------------------
@dataclass(frozen=True)
class PartSpec:
    """A part of the run: its key in device.json and its time boxes (seconds)."""

    name: str
    title: str
    box_device: float
    box_rehearse: float


PARTS: tuple[PartSpec, ...] = (
    PartSpec("out_of_core", "out-of-core: planned swap/recompute mix vs single policies", 100, 40),
    PartSpec("virtual_nodes", "virtual nodes: GPU vs CPU weights, 1 vs 2 processes, throughput", 80, 40),
    PartSpec("train_throughput", "train estimator vs a plain PyTorch loop", 75, 40),
    PartSpec("proxies_supernet", "selected rank ensemble cells/s, supernet steps/s", 100, 40),
    PartSpec("sievo", "SI-EvoNAS search at CIFAR size", 80, 40),
    PartSpec("mobilenet", "mobilenet space: elastic supernet on the device, steps/s, a search", 45, 40),
)
TOTAL_DEVICE = 480.0     # the whole run on the H200 (8 minutes)
TOTAL_REHEARSE = 170.0   # a bound for a broken rehearsal; it normally takes about a minute
#: What a part keeps for itself at the end of its box (writing results, leaving cleanly).
END_MARGIN = 12.0
#: A part is not started with less than this left of the whole run.
MIN_BOX = 20.0


class PartSkipped(Exception):
    """The part cannot run here; the message is its recorded reason."""


# -- recording --------------------------------------------------------------------------------
class Recorder:
    """A part's result, rewritten to its file after every change, so a part killed at the end
    of its box still leaves what it measured."""

    def __init__(self, path: Path, part: str, rehearse: bool, box: float):
        self.path = path
        self.data: dict[str, Any] = {
            "part": part, "status": "running", "reason": None, "mode":
            "rehearse" if rehearse else "device", "box_seconds": box, "seconds": None,
            "environment": {}, "sizes": {}, "figures": {}, "goal": None, "gap": None,
            "met": None, "skipped_steps": [], "errors": [], "notes": []}
        self.flush()

    def flush(self) -> None:
        tmp = self.path.with_suffix(".tmp")
        tmp.write_text(json.dumps(self.data, indent=1, default=_json_default))
        tmp.replace(self.path)

    def put(self, section: str, key: str, value: Any) -> None:
        self.data[section][key] = value
        self.flush()

    def figure(self, key: str, value: Any) -> None:
        self.put("figures", key, value)

    def size(self, key: str, value: Any) -> None:
        self.put("sizes", key, value)

    def sizes(self, sizes: dict[str, Any]) -> dict[str, Any]:
        """Record every size of ``sizes``; returns them."""
        for key, value in sizes.items():
            self.size(key, value)
        return sizes

    def skip_step(self, step: str, reason: str) -> None:
        self.data["skipped_steps"].append({"step": step, "reason": reason})
        self.flush()

    def error(self, step: str, exc: BaseException) -> None:
        self.data["errors"].append({"step": step, "error": f"{type(exc).__name__}: {exc}"})
        print(f"[{self.data['part']}] {step} failed:", file=sys.stderr)
        traceback.print_exc()
        self.flush()

    def note(self, text: str) -> None:
        self.data["notes"].append(text)
        self.flush()

    def goal(self, text: str, value: float | None, target: float, higher_is_better: bool = True) -> None:
        """Record the goal, the figure it is judged on, the gap (positive: met by that much)."""
        self.data["goal"] = {"text": text, "target": target, "figure": value}
        if value is not None and math.isfinite(value):
            gap = value - target if higher_is_better else target - value
            self.data["gap"], self.data["met"] = gap, gap >= 0
        self.flush()


def _json_default(obj: Any) -> Any:
    if isinstance(obj, Path):
        return str(obj)
    if hasattr(obj, "item"):
        return obj.item()
    return repr(obj)


@dataclass
class PartRun:
    """What a part function receives: its mode, its deadline and its recorder."""

    name: str
    rehearse: bool
    deadline: float            # time.monotonic() by which measurements should be over
    rec: Recorder
    scratch: Path
    light_import: str | None = None   # module whose absence made frugalnas load without __init__
    started: float = field(default_factory=time.monotonic)

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def log(self, message: str) -> None:
        print(f"[{self.name} {time.monotonic() - self.started:6.1f}s] {message}", flush=True)

    def share(self, pieces_left: int) -> float:
        """The deadline for the next of ``pieces_left`` equal pieces of what is left."""
        return time.monotonic() + max(0.0, self.left()) / max(1, pieces_left)


# -- shared helpers ---------------------------------------------------------------------------
def import_torch() -> types.ModuleType:
    try:
        import torch
    except ModuleNotFoundError as exc:
        raise PartSkipped(f"skipped: {exc.name} missing") from None
    return torch


def pick_device(run: PartRun) -> Any:
    """``cpu`` in a rehearsal; the first CUDA device otherwise (skips the part without one)."""
    torch = import_torch()
    if run.rehearse:
        return torch.device("cpu")
    if not torch.cuda.is_available():
        raise PartSkipped("skipped: CUDA not available (use --rehearse on a machine without a GPU)")
    return torch.device("cuda:0")


def environment(device: Any) -> dict[str, Any]:
    """Device name, torch, CUDA and cuDNN versions, cores."""
    import torch

    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__,
                            "cuda_runtime": torch.version.cuda, "python": platform.python_version(),
                            "cpu_count": os.cpu_count(), "torch_threads": torch.get_num_threads()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(device_name=torch.cuda.get_device_name(device), gpu_count=torch.cuda.device_count(),
                    device_memory_bytes=int(props.total_memory),
                    cudnn=torch.backends.cudnn.version())
    else:
        info["device_name"] = f"cpu: {cpu_model()}"
    return info


def cpu_model() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine()


def begin(run: PartRun) -> Any:
    """Pick the device and record the environment; returns the device."""
    device = pick_device(run)
    run.rec.data["environment"] = environment(device)
    run.rec.flush()
    run.log(f"device {run.rec.data['environment']['device_name']}, torch "
            f"{run.rec.data['environment']['torch']}")
    return device


def import_frugalnas(run: PartRun, allow_light: bool) -> None:
    """Import the project. Its package ``__init__`` needs optuna (the device image lacks it);
    with ``allow_light`` the package is then set up without running ``__init__``, which is
    enough for modules that do not import optuna (the backends), and the part says so."""
    try:
        import frugalnas  # noqa: F401
        return
    except ModuleNotFoundError as exc:
        missing = (exc.name or "").split(".")[0]
        if not allow_light or not missing or missing == "frugalnas":
            raise
    for name in [m for m in sys.modules if m == "frugalnas" or m.startswith("frugalnas.")]:
        del sys.modules[name]
    spec = importlib.util.find_spec("frugalnas")
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError("frugalnas", name="frugalnas")
    package = types.ModuleType("frugalnas")
    package.__path__ = list(spec.submodule_search_locations)
    package.__file__ = spec.origin
    sys.modules["frugalnas"] = package
    run.light_import = missing
    run.rec.note(f"frugalnas loaded without its package __init__ ({missing} missing): this part "
                 f"uses only modules that do not import {missing}")
    run.log(f"{missing} missing: frugalnas loaded without its package __init__")


def missing_module(exc: ModuleNotFoundError) -> str:
    return (exc.name or str(exc)).split(".")[0]


def synchronize(device: Any) -> None:
    import torch

    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_calls(call: Callable[[], Any], device: Any, *, warmup: int, min_calls: int,
               max_calls: int, seconds: float,
               on_warm: Callable[[], None] | None = None) -> list[float]:
    """Seconds of each timed call of ``call`` (device synchronised around each): ``warmup``
    untimed calls first (then ``on_warm``, e.g. to reset memory peaks), then at least
    ``min_calls`` and at most ``max_calls``, stopping once ``seconds`` have passed."""
    for _ in range(warmup):
        call()
    synchronize(device)
    if on_warm is not None:
        on_warm()
    times: list[float] = []
    start = time.perf_counter()
    while len(times) < max_calls and (len(times) < min_calls or time.perf_counter() - start < seconds):
        synchronize(device)
        t0 = time.perf_counter()
        call()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return times


def blocked_plugins() -> list[str]:
    return list(QUIET_PLUGINS)


def new_study(**options: Any) -> Any:
    """A frugalnas study in memory with tracking and the progress bar off."""
    import optuna

    import frugalnas

    optuna.logging.set_verbosity(optuna.logging.WARNING)   # one line per trial is noise here
    return frugalnas.create_study(disable_plugins=blocked_plugins(), **options)


def completed_trials(study: Any) -> list[Any]:
    return [t for t in study.trials if getattr(getattr(t, "state", None), "name", "") == "COMPLETE"]


class TrialsFailed(RuntimeError):
    """Trials of a part's study failed (optuna records the failure and goes on)."""


def record_failed_trials(run: PartRun, study: Any, step: str) -> None:
    """An error for the part when any trial of ``study`` failed, with the first reason: a study
    that goes on after failures must not leave the part looking successful."""
    failed = [t for t in study.optuna_study.trials if t.state.name == "FAIL"]
    if failed:
        reason = failed[0].system_attrs.get("fail_reason", "no reason recorded")
        run.rec.error(step, TrialsFailed(f"{len(failed)} of {len(study.optuna_study.trials)} "
                                         f"trials failed; the first: {reason}"))


# -- part 1: out-of-core ----------------------------------------------------------------------
def _bottleneck_cls() -> type:
    import torch.nn.functional as F
    from torch import nn

    class Bottleneck(nn.Module):
        """ResNet-50's bottleneck: 1x1, 3x3 (stride), 1x1 (x4 channels), projection shortcut."""

        def __init__(self, cin: int, width: int, stride: int):
            super().__init__()
            out = 4 * width
            self.conv1, self.bn1 = nn.Conv2d(cin, width, 1, bias=False), nn.BatchNorm2d(width)
            self.conv2 = nn.Conv2d(width, width, 3, stride=stride, padding=1, bias=False)
            self.bn2 = nn.BatchNorm2d(width)
            self.conv3, self.bn3 = nn.Conv2d(width, out, 1, bias=False), nn.BatchNorm2d(out)
            self.shortcut = (nn.Identity() if stride == 1 and cin == out else nn.Sequential(
                nn.Conv2d(cin, out, 1, stride=stride, bias=False), nn.BatchNorm2d(out)))

        def forward(self, x):  # out-of-place throughout: blocks must not modify their input
            o = F.relu(self.bn1(self.conv1(x)))
            o = F.relu(self.bn2(self.conv2(o)))
            return F.relu(self.bn3(self.conv3(o)) + self.shortcut(x))

    return Bottleneck


def resnet50_like(width: int, classes: int = 10) -> Any:
    """ResNet-50's layout (3-4-6-3 bottlenecks, ImageNet stem) at ``width`` stem channels (64:
    ResNet-50's own widths), as an ``nn.Sequential`` of 18 blocks: the out-of-core backend
    plans the stem, every bottleneck and the head (the greedy planner: over 9 blocks)."""
    from torch import nn

    bottleneck = _bottleneck_cls()
    blocks: list[nn.Module] = [nn.Sequential(
        nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False), nn.BatchNorm2d(width), nn.ReLU(),
        nn.MaxPool2d(3, stride=2, padding=1))]
    cin = width
    for stage, (count, stride) in enumerate(zip((3, 4, 6, 3), (1, 2, 2, 2))):
        for i in range(count):
            blocks.append(bottleneck(cin, width * 2**stage, stride if i == 0 else 1))
            cin = 4 * width * 2**stage
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, classes)))
    return nn.Sequential(*blocks)


def vgg16_like(width: int, classes: int = 10) -> Any:
    """VGG-16 with batch norm (13 convolutions in stages of 2-2-3-3-3, widths 1-2-4-8-8 x
    ``width``; 64: VGG-16's own) as 8 blocks for the backend (the exact planner): each of the
    first four convolutions alone (they hold most of the activations; a stage as one block
    would be larger than the budget by itself), then stages 3, 4 and 5, then the classifier."""
    from torch import nn

    def conv(cin: int, cout: int, pool: bool = False) -> list[nn.Module]:
        layers = [nn.Conv2d(cin, cout, 3, padding=1, bias=False), nn.BatchNorm2d(cout), nn.ReLU()]
        return layers + ([nn.MaxPool2d(2, ceil_mode=True)] if pool else [])

    w = width
    blocks: list[nn.Module] = [nn.Sequential(*conv(3, w)), nn.Sequential(*conv(w, w, pool=True)),
                               nn.Sequential(*conv(w, 2 * w)),
                               nn.Sequential(*conv(2 * w, 2 * w, pool=True))]
    cin = 2 * w
    for mult in (4, 8, 8):
        layers: list[nn.Module] = []
        for i in range(3):
            layers += conv(cin, mult * w, pool=i == 2)
            cin = mult * w
        blocks.append(nn.Sequential(*layers))
    blocks.append(nn.Sequential(nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(cin, 8 * w),
                                nn.ReLU(), nn.Linear(8 * w, classes)))
    return nn.Sequential(*blocks)


def nb201_deep(N: int, C: int, image: int, classes: int = 10) -> Any:
    """The NB201 network of benchmarks/out_of_core.py's cell at N cells per stage (3N + 2
    blocks for the backend: stem, cells, reductions)."""
    sys.path.insert(0, str(BENCH_DIR))
    from out_of_core import CELL  # the cell the out-of-core benchmark uses

    from frugalnas.spaces.nb201.space import NB201Space

    space = NB201Space(N=N, C=C)
    return space.build(space.parse(CELL), classes, (3, image, image))


def ooc_models(rehearse: bool) -> list[dict[str, Any]]:
    """The three networks with their sizes (device sizes: memory-hungry but seconds per mode)."""
    if rehearse:
        return [
            {"name": "resnet50_like", "width": 4, "image": 32, "batch": 8},
            {"name": "vgg16_like", "width": 4, "image": 32, "batch": 8},
            {"name": "nb201_deep", "N": 1, "C": 4, "image": 16, "batch": 8},
        ]
    return [
        {"name": "resnet50_like", "width": 64, "image": 96, "batch": 256},
        {"name": "vgg16_like", "width": 64, "image": 64, "batch": 256},
        {"name": "nb201_deep", "N": 5, "C": 16, "image": 32, "batch": 512},
    ]


def build_ooc_model(spec: dict[str, Any]) -> Any:
    import torch

    torch.manual_seed(0)
    if spec["name"] == "resnet50_like":
        return resnet50_like(spec["width"])
    if spec["name"] == "vgg16_like":
        return vgg16_like(spec["width"])
    return nb201_deep(spec["N"], spec["C"], spec["image"])


def part_out_of_core(run: PartRun) -> None:
    device = begin(run)
    import_frugalnas(run, allow_light=True)
    import torch  # noqa: F401

    from frugalnas.backends.out_of_core.backend import OutOfCoreBackend  # noqa: F401

    fraction = 0.35
    run.rec.size("budget_fraction_of_incore_saved_bytes", fraction)
    run.rec.size("timing", "median seconds of forward+backward calls (one training step's "
                           "gradient computation; the optimizer step is the same for every mode)")
    models = ooc_models(run.rehearse)
    ratios: list[float] = []
    budgets_met: list[bool] = []
    for i, spec in enumerate(models):
        deadline = run.share(len(models) - i)
        run.rec.size(spec["name"], {k: v for k, v in spec.items() if k != "name"})
        try:
            result = measure_ooc_model(run, device, spec, fraction, deadline)
        except ModuleNotFoundError as exc:
            run.rec.figure(spec["name"], {"skipped": f"skipped: {missing_module(exc)} missing"})
            continue
        except Exception as exc:  # noqa: BLE001 - one model failing leaves the others
            run.rec.error(spec["name"], exc)
            continue
        finally:
            release_cuda(device)
        if result.get("ratio_plan_vs_best_single") is not None:
            ratios.append(result["ratio_plan_vs_best_single"])
            budgets_met.append(bool(result.get("plan_budget_met")))
    worst = min(ratios) if ratios else None
    run.rec.figure("ratio_plan_vs_best_single_min", worst)
    run.rec.figure("plans_meeting_budget", f"{sum(budgets_met)} of {len(budgets_met)}")
    run.rec.goal("planned swap/recompute mix at least 1.2x the images/s of the better of "
                 "all-swap and all-recompute, at the same batch and budget, budget met "
                 "(judged on the worst of the three models)", worst, 1.2)
    if run.rec.data["met"] and not all(budgets_met):
        run.rec.data["met"] = False
        run.rec.flush()


def release_cuda(device: Any) -> None:
    import gc

    import torch

    gc.collect()
    if device.type == "cuda":
        torch.cuda.set_per_process_memory_fraction(1.0, device)
        torch.cuda.empty_cache()


def measure_ooc_model(run: PartRun, device: Any, spec: dict[str, Any], fraction: float,
                      deadline: float) -> dict[str, Any]:
    """One model: budget from the in-core saved bytes at the batch, the largest batch that
    fits in-core, the three out-of-core policies at the batch, then (CUDA) all of it again
    under a device memory cap."""
    import torch
    from torch import nn

    from frugalnas.backends.out_of_core.backend import OutOfCoreBackend
    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.ports.errors import TrialFailure

    name, batch, image = spec["name"], spec["batch"], spec["image"]
    base = build_ooc_model(spec)
    loss_fn = nn.CrossEntropyLoss()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, 3, image, image, generator=gen).to(device)
    y = torch.randint(0, 10, (batch,), generator=gen).to(device)
    out: dict[str, Any] = {"batch": batch, "image": image,
                           "params": sum(p.numel() for p in base.parameters()), "modes": {}}

    def save() -> None:
        run.rec.figure(name, out)

    def incore_saved(n: int) -> int:
        probe = OutOfCoreBackend(device=str(device), policy="resident", profile_repeats=0)
        model = probe.prepare(copy.deepcopy(base))
        probe.forward_backward(model, loss_fn, x[:n], y[:n])
        plan = used_plan(probe)
        out.setdefault("blocks", len(plan.policies))
        return int(plan.profile.incore_peak)

    saved = incore_saved(batch)
    budget = int(fraction * saved)
    out.update(incore_saved_bytes=saved, budget_bytes=budget)
    save()
    run.log(f"{name}: batch {batch}, in-core saved {saved / MiB:.1f} MiB, budget {budget / MiB:.1f} MiB")

    # The largest batch whose in-core saved activations fit the budget (they grow about
    # linearly with the batch; checked by probing, stepping down 10 % at a time).
    # Batches of 2 at least: batch norm needs more than one value per channel.
    fit = max(2, min(batch - 1, int(batch * budget / saved)))
    fit_saved = incore_saved(fit)
    while fit > 2 and fit_saved > budget:
        fit = max(2, int(fit * 0.9))
        fit_saved = incore_saved(fit)
    out.update(batch_fit_in_core=fit, incore_saved_bytes_at_fit=fit_saved,
               fit_within_budget=fit_saved <= budget)
    save()

    budget_s = lambda parts: max(0.2, (deadline - time.monotonic()) / parts)  # noqa: E731
    steps = {"warmup": 1, "min_calls": 1 if run.rehearse else 3,
             "max_calls": 2 if run.rehearse else 20}

    def timed(backend: Any, n: int, parts: int, calls: int | None = None) -> dict[str, Any]:
        """Time forward+backward of a fresh copy of the model at batch ``n`` (``calls``: exactly
        that many timed calls, for a memory reading)."""
        model = backend.prepare(copy.deepcopy(base))

        def call() -> None:
            model.zero_grad(set_to_none=True)
            backend.forward_backward(model, loss_fn, x[:n], y[:n])

        def warm() -> None:
            # after the warm-up (which profiles): peaks of the steps themselves, without the
            # profile's in-core passes or the cache they left behind
            if device.type == "cuda":
                torch.cuda.empty_cache()
                torch.cuda.reset_peak_memory_stats(device)
            backend.reset_peak_memory()

        counts = steps if calls is None else {"warmup": 1, "min_calls": calls, "max_calls": calls}
        times = time_calls(call, device, seconds=budget_s(parts), on_warm=warm, **counts)
        median = statistics.median(times)
        row: dict[str, Any] = {"batch": n, "images_per_s": n / median, "step_ms": median * 1e3,
                               "calls": len(times)}
        if device.type == "cuda":
            row["cuda_peak_allocated_bytes"] = int(torch.cuda.max_memory_allocated(device))
            row["cuda_peak_reserved_bytes"] = int(torch.cuda.max_memory_reserved(device))
        if isinstance(backend, OutOfCoreBackend):
            plan = used_plan(backend)
            row.update(saved_peak_bytes=int(backend.max_step_peak),
                       budget_met=bool(backend.max_step_peak <= budget),
                       plan_counts={k: v for k, v in plan.counts().items() if v},
                       planner=plan.method, plan_feasible=bool(plan.feasible),
                       predicted_step_ms=plan.time * 1e3,
                       prediction_error_pct=100 * (plan.time - median) / median)
        del model
        return row

    # In-core at the full batch, without any cap: what the memory would cost if it were there.
    out["modes"]["in-core@batch_uncapped"] = timed(SingleDeviceBackend(str(device)), batch, 9)
    out["modes"]["in-core@batch_uncapped"]["saved_peak_bytes"] = saved
    save()
    backends = {mode: OutOfCoreBackend(device=str(device), budget=budget, policy=mode)
                for mode in ("plan", "swap", "recompute")}
    cuda = device.type == "cuda"
    for i, mode in enumerate(("plan", "swap", "recompute")):
        # On CUDA this first pass profiles and plans, and reads the memory each mode needs
        # (one timed call); the timing proper runs under the memory cap below.
        key = mode if not cuda else f"{mode}_uncapped"
        try:
            out["modes"][key] = timed(backends[mode], batch, 8 - i, calls=1 if cuda else None)
        except TrialFailure as exc:  # a budget no plan meets: refused before training
            out["modes"][key] = {"refused_before_training": str(exc)[:400]}
            run.log(f"{name}: {mode}: {exc}")
            del backends[mode]
        save()
    out["plan_table"] = backends["plan"].plan_table() if "plan" in backends else "(refused)"
    if not cuda:
        run.rec.skip_step(f"{name}: device memory cap", "CUDA only: "
                          "torch.cuda.set_per_process_memory_fraction; on the CPU the budget "
                          "is the backend's own (saved-activation bytes it counts)")
        out["modes"]["in-core@fit"] = timed(SingleDeviceBackend(str(device)), fit, 4)
        out["modes"]["in-core@fit"]["saved_peak_bytes"] = fit_saved
    else:
        measure_under_cap(run, device, out, backends, timed, fit, fit_saved, batch, x, y, base, loss_fn)
    return finish_ooc(out, save)


def used_plan(backend: Any) -> Any:
    """The plan of the backend's last step (an error if it ran none)."""
    if backend.last_plan is None:
        raise RuntimeError("the out-of-core backend ran no step: no plan to read")
    return backend.last_plan


def measure_under_cap(run: PartRun, device: Any, out: dict[str, Any], backends: dict[str, Any],
                      timed: Callable[..., dict[str, Any]], fit: int, fit_saved: int, batch: int,
                      x: Any, y: Any, base: Any, loss_fn: Any) -> None:
    """CUDA: cap the process's device memory just above what the out-of-core modes needed at
    the batch, show that in-core training of the batch no longer fits, and time every mode
    under the cap (the plans are cached: nothing is profiled again)."""
    import torch

    from frugalnas.backends.single_device import SingleDeviceBackend

    peaks = [out["modes"][f"{m}_uncapped"]["cuda_peak_reserved_bytes"] for m in backends]
    if not peaks:
        return
    total = torch.cuda.get_device_properties(device).total_memory
    cap = int(max(peaks) * 1.05) + 128 * MiB
    release_cuda(device)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    out["memory_cap_bytes"] = cap
    out["memory_cap_rule"] = ("1.05 x the largest torch.cuda.max_memory_reserved of the three "
                              "out-of-core modes at the batch (one step each, after profiling), "
                              "+ 128 MiB; set with torch.cuda.set_per_process_memory_fraction")
    model = SingleDeviceBackend(str(device)).prepare(copy.deepcopy(base))
    try:
        model.zero_grad(set_to_none=True)
        loss_fn(model(x), y).backward()
        out["incore_at_batch_under_cap"] = "fits (the cap does not bind: figures are not out-of-core evidence)"
    except torch.cuda.OutOfMemoryError:
        out["incore_at_batch_under_cap"] = "out of memory (as intended)"
    del model
    release_cuda(device)
    torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    for i, mode in enumerate(backends):
        try:
            out["modes"][mode] = timed(backends[mode], batch, 4 - i)
        except torch.cuda.OutOfMemoryError as exc:
            out["modes"][mode] = {"error": f"out of memory under the cap: {exc}"[:300]}
            release_cuda(device)
            torch.cuda.set_per_process_memory_fraction(min(1.0, cap / total), device)
    try:
        out["modes"]["in-core@fit"] = timed(SingleDeviceBackend(str(device)), fit, 1)
        out["modes"]["in-core@fit"]["saved_peak_bytes"] = fit_saved
    except torch.cuda.OutOfMemoryError as exc:
        out["modes"]["in-core@fit"] = {"error": f"out of memory under the cap: {exc}"[:300]}
    finally:
        torch.cuda.set_per_process_memory_fraction(1.0, device)


def finish_ooc(out: dict[str, Any], save: Callable[[], None]) -> dict[str, Any]:
    modes = out["modes"]
    speed = {m: modes[m].get("images_per_s") for m in ("plan", "swap", "recompute", "in-core@fit")
             if m in modes}
    if speed.get("plan") and speed.get("swap") and speed.get("recompute"):
        best = "swap" if speed["swap"] >= speed["recompute"] else "recompute"
        out["best_single"] = best
        out["ratio_plan_vs_best_single"] = speed["plan"] / speed[best]
        out["plan_budget_met"] = modes["plan"].get("budget_met")
    if speed.get("plan") and speed.get("in-core@fit"):
        out["ratio_plan_vs_incore_fit"] = speed["plan"] / speed["in-core@fit"]
    uncapped = {m: modes.get(f"{m}_uncapped", {}).get("images_per_s") for m in ("plan", "swap", "recompute")}
    if all(uncapped.values()):
        out["ratio_plan_vs_best_single_uncapped_one_call"] = uncapped["plan"] / max(
            uncapped["swap"], uncapped["recompute"])
    save()
    return out


# -- part 2: virtual nodes --------------------------------------------------------------------
def vnode_sizes(rehearse: bool) -> dict[str, Any]:
    if rehearse:
        return {"virtual_nodes": 8, "width": 4, "batch": 16, "steps": 2, "lr": 0.05,
                "throughput_width": 4, "throughput_batches": [16], "throughput_steps": 2,
                "throughput_repeats": 1, "cpu_reference_threads": 2}
    return {"virtual_nodes": 8, "width": 16, "batch": 128, "steps": 8, "lr": 0.05,
            "throughput_width": 32, "throughput_batches": [256, 2048], "throughput_steps": 10,
            "throughput_repeats": 2, "cpu_reference_threads": 4}


def train_vnode(device: str, sizes: dict[str, Any], *, nproc: int = 1, threads: int | None = 1,
                dropout: bool = True) -> dict[str, Any]:
    """V-node training from make_net's seeded weights on fixed batches; the final state (CPU)."""
    import torch
    from torch import nn

    from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
    from virtual_node import make_net

    model = make_net(sizes["width"])
    if not dropout:  # CPU and CUDA generators draw different masks: no dropout across devices
        for m in model.modules():
            if isinstance(m, nn.Dropout):
                m.p = 0.0
    backend = VirtualNodeBackend(virtual_nodes=sizes["virtual_nodes"], nproc=nproc, device=device,
                                 threads=threads, seed=0)
    try:
        model = backend.prepare(model)
        opt = torch.optim.SGD(model.parameters(), lr=sizes["lr"], momentum=0.9)
        loss_fn = nn.CrossEntropyLoss()
        gen = torch.Generator().manual_seed(1)
        for step in range(sizes["steps"]):
            x = torch.randn(sizes["batch"], 3, 32, 32, generator=gen)
            y = torch.randint(0, 10, (sizes["batch"],), generator=gen)
            backend.train_step(model, opt, loss_fn, x, y, step)
        return {k: v.detach().to("cpu").clone() for k, v in model.state_dict().items()}
    finally:
        backend.close()


def state_difference(a: dict[str, Any], b: dict[str, Any]) -> dict[str, Any]:
    """Max abs and max relative difference over floating tensors; bitwise equality of all."""
    import torch

    max_abs, max_rel, equal = 0.0, 0.0, True
    for key in a:
        ta, tb = a[key], b[key]
        equal = equal and torch.equal(ta, tb)
        if ta.is_floating_point():
            diff = (ta.double() - tb.double()).abs()
            max_abs = max(max_abs, float(diff.max()) if diff.numel() else 0.0)
            scale = ta.double().abs().clamp_min(1e-3)
            max_rel = max(max_rel, float((diff / scale).max()) if diff.numel() else 0.0)
    return {"max_abs_diff": max_abs, "max_rel_diff": max_rel, "bitwise_equal": equal}


def part_virtual_nodes(run: PartRun) -> None:
    device = begin(run)
    import_frugalnas(run, allow_light=True)
    import torch

    sys.path.insert(0, str(BENCH_DIR))
    sizes = run.rec.sizes(vnode_sizes(run.rehearse))
    run.rec.size("model", "benchmarks/virtual_node.py make_net (4 conv + BN layers, dropout), "
                          "32x32x3 synthetic batches, SGD momentum 0.9")
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    run.rec.note("TF32 off (matmul and cuDNN), cuDNN deterministic, benchmark mode off")

    # a) the same training on the GPU and on the CPU
    try:
        cpu1 = train_vnode("cpu", sizes, threads=1, dropout=False)
        cpu_n = train_vnode("cpu", sizes, threads=sizes["cpu_reference_threads"], dropout=False)
        noise = state_difference(cpu1, cpu_n)
        run.rec.figure("cpu_threads_reference", {**noise, "threads": [1, sizes["cpu_reference_threads"]]})
        tolerance = max(1e-4, 10 * noise["max_abs_diff"])
        run.rec.note(
            "cross-device tolerance: max(1e-4, 10 x the max abs difference between two CPU runs "
            "that differ only in intra-op threads). GPU (cuDNN) and CPU convolutions use different "
            "algorithms and summation orders, each rounding at float32's ~1e-7 relative error, and "
            f"{sizes['steps']} SGD steps amplify the differences; the CPU thread-count pair measures "
            "that amplification for a pure change of reduction order. TF32 is off, since it "
            "rounds conv/matmul inputs to 10-bit mantissas (~1e-3 relative). Dropout is disabled "
            "for this comparison: the CPU and CUDA generators draw different masks.")
        if device.type == "cuda":
            gpu = train_vnode(str(device), sizes, threads=1, dropout=False)
            diff = state_difference(gpu, cpu1)
            run.rec.figure("gpu_vs_cpu", {**diff, "tolerance": tolerance,
                                          "within_tolerance": diff["max_abs_diff"] <= tolerance})
        else:
            run.rec.skip_step("gpu_vs_cpu", "CUDA only: the GPU side of the cross-device "
                                            "comparison (the CPU-thread reference ran)")
            run.rec.figure("gpu_vs_cpu", {"tolerance": tolerance, "compared": "cpu threads=1 vs "
                                          f"threads={sizes['cpu_reference_threads']} in rehearsal",
                                          **noise, "within_tolerance": noise["max_abs_diff"] <= tolerance})
    except Exception as exc:  # noqa: BLE001
        run.rec.error("gpu_vs_cpu", exc)

    # b) bitwise across 1 and 2 processes
    try:
        if device.type == "cuda" and torch.cuda.device_count() < 2:
            run.rec.skip_step("nproc_1_vs_2", "skipped: needs 2 GPUs (NCCL: one GPU per process); "
                                              f"{torch.cuda.device_count()} visible")
            run.rec.figure("nproc_1_vs_2", {"skipped": "skipped: needs 2 GPUs"})
        elif run.light_import is not None:
            run.rec.figure("nproc_1_vs_2", {"skipped": f"skipped: {run.light_import} missing (the "
                                            "worker processes import the whole package)"})
        else:
            one = train_vnode(str(device), sizes, nproc=1)
            two = train_vnode(str(device), sizes, nproc=2)
            backend_kind = "nccl" if device.type == "cuda" else "gloo"
            run.rec.figure("nproc_1_vs_2", {**state_difference(one, two), "process_group": backend_kind})
            if device.type == "cuda":
                run.rec.note("with 2 GPUs the worker process starts with torch's default cuDNN "
                             "flags (deterministic off): a mismatch would point at "
                             "nondeterministic cuDNN kernels before the node order")
    except Exception as exc:  # noqa: BLE001
        run.rec.error("nproc_1_vs_2", exc)

    # c) throughput against the native batch
    ratios = vnode_throughput(run, device, sizes)
    worst = min(ratios.values()) if ratios else None
    run.rec.figure("throughput_ratio_min", worst)
    run.rec.goal("V=8 virtual nodes on one device at least 0.9x the native batch's examples/s "
                 "(judged on the largest global batch measured)",
                 ratios.get(max(ratios)) if ratios else None, 0.9)


def vnode_throughput(run: PartRun, device: Any, sizes: dict[str, Any]) -> dict[int, float]:
    """examples/s of V=8 virtual nodes vs the native batch, interleaved, best of the repeats."""
    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
    from virtual_node import measure

    ratios: dict[int, float] = {}
    rows: dict[str, Any] = {}
    for batch in sizes["throughput_batches"]:
        try:
            best_native = best_vnode = 0.0
            for _ in range(sizes["throughput_repeats"]):
                native = measure(SingleDeviceBackend(str(device)), sizes["throughput_width"], batch,
                                 sizes["throughput_steps"], str(device))
                vnode = measure(VirtualNodeBackend(virtual_nodes=sizes["virtual_nodes"],
                                                   device=str(device), threads=None),
                                sizes["throughput_width"], batch, sizes["throughput_steps"], str(device))
                best_native = max(best_native, native["throughput"])
                best_vnode = max(best_vnode, vnode["throughput"])
            ratios[batch] = best_vnode / best_native
            rows[str(batch)] = {"native_examples_per_s": best_native,
                                "vnode_examples_per_s": best_vnode, "ratio": ratios[batch],
                                "vnode_cuda_peak_bytes": vnode.get("cuda_peak"),
                                "native_cuda_peak_bytes": native.get("cuda_peak")}
            run.rec.figure("throughput", rows)
        except Exception as exc:  # noqa: BLE001
            run.rec.error(f"throughput batch {batch}", exc)
        if run.left() < 5:
            run.rec.note(f"throughput: time box reached after batch {batch}")
            break
    return ratios


# -- part 3: train estimator vs a plain loop --------------------------------------------------
CELL_TRAIN = "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|"


def train_sizes(rehearse: bool) -> dict[str, Any]:
    if rehearse:
        return {"N": 1, "C": 4, "image": 16, "n": 320, "batch": 64, "epochs": [1, 2],
                "plain_epochs": 1, "warmup_steps": 1}
    return {"N": 5, "C": 16, "image": 32, "n": 16000, "batch": 256, "epochs": [1, 3],
            "plain_epochs": 2, "warmup_steps": 10}


def part_train_throughput(run: PartRun) -> None:
    device = begin(run)
    import_frugalnas(run, allow_light=False)
    import torch

    sizes = run.rec.sizes(train_sizes(run.rehearse))
    run.rec.size("architecture", f"nb201:{CELL_TRAIN}")
    run.rec.size("data", "synthetic dataset (frugalnas.datasets), valid 10 %, test 10 %, "
                         "training split resident on the CPU like the estimator's")
    torch.backends.cudnn.benchmark = True
    run.rec.note("cuDNN benchmark mode on for the whole part: the estimator and the plain loop "
                 "run in the same process with the same kernel choices")

    def study(epochs: int) -> Any:
        return new_study(space="nb201", strategy="random", estimator="train", dataset="synthetic",
                         dataset_options={"n": sizes["n"], "size": sizes["image"],
                                          "valid_fraction": 0.1, "test_fraction": 0.1},
                         space_options={"N": sizes["N"], "C": sizes["C"]},
                         estimator_options={"epochs": epochs, "batch_size": sizes["batch"],
                                            "report_every_epoch": False},
                         backend="single-device", backend_options={"device": str(device)}, seed=0)

    short, long = sizes["epochs"]
    s_short, s_long = study(short), study(long)
    data = s_short.load_dataset()
    s_long.load_dataset()
    n_train = len(data.train_x)
    run.rec.size("n_train", n_train)
    estimator_cls = type(s_short.estimator)
    options = set(inspect.signature(estimator_cls.__init__).parameters)
    lacks = [o for o in ("amp", "channels_last") if o not in options]
    if lacks:
        run.rec.note(f"the train estimator has no {' / '.join(lacks)} option: it trains in float32 "
                     "with the default memory format; AMP and channels_last are reported for the "
                     "plain loop only")
    run.rec.figure("estimator_lacks_options", lacks)

    s_short.evaluate(CELL_TRAIN)                       # warm-up: CUDA context, cuDNN choices
    t0 = time.perf_counter()
    s_short.evaluate(CELL_TRAIN)
    t_short = time.perf_counter() - t0
    t0 = time.perf_counter()
    s_long.evaluate(CELL_TRAIN)
    t_long = time.perf_counter() - t0
    delta = t_long - t_short
    est = (long - short) * n_train / delta if delta > 0 else None
    run.rec.figure("estimator", {"images_per_s": est, "seconds_short": t_short,
                                 "seconds_long": t_long, "epochs": [short, long],
                                 "method": "difference of two evaluations (same fixed costs: "
                                           "building, FLOP count, final validation)"})
    run.log(f"estimator: {est} images/s")

    plain: dict[str, Any] = {}
    variants = [("fp32", False, False, False, False), ("fp32_loss_read_every_step", False, False, True, False),
                ("amp_bf16", True, False, False, False), ("channels_last", False, True, False, False),
                ("amp_bf16_channels_last", True, True, False, False),
                ("fp32_data_on_device", False, False, False, True)]
    for i, (label, amp, cl, read_loss, on_device) in enumerate(variants):
        if run.left() < 3:
            run.rec.note(f"plain loop: time box reached before {label}")
            break
        try:
            plain[label] = plain_loop(s_short, data, device, sizes, amp=amp, channels_last=cl,
                                      read_loss=read_loss, data_on_device=on_device)
            run.rec.figure("plain_loop", plain)
        except Exception as exc:  # noqa: BLE001
            run.rec.error(f"plain loop {label}", exc)
        if label == "fp32_loss_read_every_step" and run.left() >= 3:
            try:
                run.rec.figure("training_loop_direct", direct_loop(s_short, data, device, sizes))
            except Exception as exc:  # noqa: BLE001
                run.rec.error("training loop direct", exc)
    run.rec.note("plain loop: the same network (seeded build), data, SGD (lr 0.05, momentum 0.9, "
                 "Nesterov, weight decay 5e-4) and cosine schedule as the estimator; batches "
                 "gathered on the CPU and copied per step; it reads the loss once per epoch "
                 "(fp32_loss_read_every_step reads it every step, as the estimator's loop does "
                 "to catch a non-finite loss); amp_bf16 is torch.autocast with bfloat16")
    base = plain.get("fp32", {}).get("images_per_s")
    ratio = est / base if est and base else None
    run.rec.figure("ratio_estimator_vs_plain_fp32", ratio)
    run.rec.goal("train estimator at least 0.95x a plain PyTorch loop's images/s (same network, "
                 "data, precision and memory format)", ratio, 0.95)


def plain_loop(study: Any, data: Any, device: Any, sizes: dict[str, Any], *, amp: bool,
               channels_last: bool, read_loss: bool, data_on_device: bool) -> dict[str, Any]:
    """images/s of a hand-written training loop on the study's network and training split."""
    import torch
    from torch import nn

    torch.manual_seed(0)
    model = study.space.build(study.space.parse(CELL_TRAIN), data.num_classes, data.input_shape)
    fmt = torch.channels_last if channels_last else torch.contiguous_format
    model = model.to(device, memory_format=fmt)
    train_x, train_y = data.train_x, data.train_y
    if data_on_device:
        train_x, train_y = train_x.to(device), train_y.to(device)
    n, batch = len(train_x), sizes["batch"]
    steps_per_epoch = math.ceil(n / batch)
    total = steps_per_epoch * sizes["plain_epochs"] + sizes["warmup_steps"]
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, weight_decay=5e-4, nesterov=True)
    sched = torch.optim.lr_scheduler.CosineAnnealingLR(opt, T_max=total)
    loss_fn = nn.CrossEntropyLoss()
    model.train()
    gen = torch.Generator().manual_seed(0)

    def step(idx: Any) -> Any:
        x, y = train_x[idx], train_y[idx]
        x = x.to(device, non_blocking=True, memory_format=fmt)
        y = y.to(device, non_blocking=True)
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=amp):
            loss = loss_fn(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        sched.step()
        if read_loss:
            float(loss.detach())
        return loss

    order = torch.randperm(n, generator=gen)
    for s in range(sizes["warmup_steps"]):
        step(order[(s * batch) % n:(s * batch) % n + batch].to(train_x.device))
    synchronize(device)
    start = time.perf_counter()
    for epoch in range(sizes["plain_epochs"]):
        order = torch.randperm(n, generator=gen).to(train_x.device)
        losses = [step(order[s * batch:(s + 1) * batch]) for s in range(steps_per_epoch)]
        float(losses[-1].detach())   # the epoch's one read of the loss
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"images_per_s": sizes["plain_epochs"] * n / seconds, "seconds": seconds,
            "epochs": sizes["plain_epochs"], "amp": "bfloat16" if amp else None,
            "channels_last": channels_last}


def direct_loop(study: Any, data: Any, device: Any, sizes: dict[str, Any]) -> dict[str, Any]:
    """images/s of frugalnas's own training loop (``core.training.train`` through the
    single-device backend) called directly, outside a study: it tells a gap between the
    estimator and the plain loop that lies in the loop from one that lies around it."""
    import torch

    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.engine.training import TrainConfig, train

    torch.manual_seed(0)
    backend = SingleDeviceBackend(device=str(device))
    model = study.space.build(study.space.parse(CELL_TRAIN), data.num_classes, data.input_shape)
    model = backend.prepare(model)
    train(model, data, backend, TrainConfig(epochs=1, batch_size=sizes["batch"]))   # warm-up
    synchronize(device)
    start = time.perf_counter()
    train(model, data, backend, TrainConfig(epochs=sizes["plain_epochs"], batch_size=sizes["batch"]))
    synchronize(device)
    seconds = time.perf_counter() - start
    return {"images_per_s": sizes["plain_epochs"] * len(data.train_x) / seconds, "seconds": seconds,
            "epochs": sizes["plain_epochs"], "path": "core.training.train + SingleDeviceBackend, "
                                                      "no study, no estimator"}


# -- part 4: proxies and supernet -------------------------------------------------------------
#: Share of the proxies part's time for the 1,000 cells; the supernet gets the rest.
CELL_SHARE = 0.7


def proxy_sizes(rehearse: bool) -> dict[str, Any]:
    if rehearse:
        return {"N": 1, "C": 4, "image": 16, "cells": 4, "proxy_batch": 16,
                "supernet_n": 320, "supernet_batch": 64}
    return {"N": 5, "C": 16, "image": 32, "cells": 1000, "proxy_batch": 64,
            "supernet_n": 8000, "supernet_batch": 64}


def part_proxies_supernet(run: PartRun) -> None:
    device = begin(run)
    import_frugalnas(run, allow_light=False)
    import torch  # noqa: F401

    from frugalnas.proxies.ensemble import MEMBER_PRESETS

    sizes = run.rec.sizes(proxy_sizes(run.rehearse))
    run.rec.size("selected_members", list(MEMBER_PRESETS["selected"]))
    cell_seconds = CELL_SHARE * max(0.0, run.left())   # the rest is the supernet's
    cells_deadline = time.monotonic() + cell_seconds
    run.rec.size("cell_seconds", cell_seconds)
    try:
        study = new_study(space="nb201", strategy="random", estimator="rank-ensemble", dataset=None,
                          space_options={"N": sizes["N"], "C": sizes["C"]},
                          estimator_options={"proxies": "selected", "data": "gaussian",
                                             "batch_size": sizes["proxy_batch"],
                                             "input_shape": [3, sizes["image"], sizes["image"]]},
                          backend="single-device", backend_options={"device": str(device)}, seed=0)
        study.optimize(n_trials=2)                     # warm-up: CUDA context, first kernels
        before = len(completed_trials(study))
        start = time.perf_counter()
        timeout = max(1.0, cells_deadline - time.monotonic())
        study.optimize(n_trials=sizes["cells"], timeout=timeout)
        seconds = time.perf_counter() - start
        done = len(completed_trials(study)) - before
        failed = sum(getattr(getattr(t, "state", None), "name", "") == "FAIL" for t in study.trials)
        run.rec.figure("rank_ensemble_selected", {
            "cells_per_s": done / seconds, "cells_scored": done, "cells_target": sizes["cells"],
            "seconds": seconds, "failed_trials": failed,
            "path": "a study: random strategy, rank-ensemble estimator (proxies='selected', "
                    "Gaussian batch), single-device backend, in-memory storage"})
        if done < sizes["cells"]:
            run.rec.note(f"rank ensemble: {done} of {sizes['cells']} cells in the part's time box "
                         "(cells/s from those)")
        run.log(f"selected ensemble: {done / seconds:.2f} cells/s")
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, ModuleNotFoundError):
            raise
        run.rec.error("rank ensemble", exc)
    try:
        supernet_steps(run, device, sizes)
    except Exception as exc:  # noqa: BLE001
        if isinstance(exc, ModuleNotFoundError):
            raise
        run.rec.error("supernet", exc)
    scored = run.rec.data["figures"].get("rank_ensemble_selected", {}).get("cells_scored")
    run.rec.goal(f"every one of the {sizes['cells']} cells scored with the selected ensemble "
                 "within the part's cell time (sizes.cell_seconds), i.e. cells/s at least "
                 "cells / cell_seconds (figure: cells scored)",
                 None if scored is None else float(scored), float(sizes["cells"]))


def timed_supernet_epoch(supernet: Any, data: Any, device: Any, cfg: Any) -> tuple[int, float]:
    """SPOS training of ``supernet``: one epoch to warm up, then one timed; returns the timed
    epoch's steps and seconds."""
    from frugalnas.backends.single_device import SingleDeviceBackend

    backend = SingleDeviceBackend(str(device))
    supernet.train(data, backend, cfg, epochs=1)
    synchronize(device)
    start = time.perf_counter()
    supernet.train(data, backend, cfg, epochs=2)   # resumes: the second epoch only
    synchronize(device)
    return math.ceil(len(data.train_x) / cfg.batch_size), time.perf_counter() - start


def supernet_steps(run: PartRun, device: Any, sizes: dict[str, Any]) -> None:
    """SPOS steps/s of the NB201 supernet: one epoch to warm up, one timed."""
    import frugalnas
    from frugalnas.engine.training import TrainConfig
    from frugalnas.weight_sharing.supernet import Supernet

    host = frugalnas.PluginHost(disable_plugins=blocked_plugins())
    space = host.create("search_spaces", "nb201", N=sizes["N"], C=sizes["C"])
    data = host.create("datasets", "synthetic", seed=0, n=sizes["supernet_n"], size=sizes["image"],
                       valid_fraction=0.1, test_fraction=0.1)
    supernet = Supernet(space, data.num_classes, data.input_shape, seed=0)
    cfg = TrainConfig(batch_size=sizes["supernet_batch"], lr=0.05)
    steps, seconds = timed_supernet_epoch(supernet, data, device, cfg)
    run.rec.figure("supernet_spos", {"steps_per_s": steps / seconds, "steps": steps,
                                     "seconds": seconds, "batch": cfg.batch_size,
                                     "supernet_params": supernet.num_parameters()})
    run.log(f"supernet: {steps / seconds:.2f} steps/s")


# -- part 5: SI-EvoNAS ------------------------------------------------------------------------
def sievo_sizes(rehearse: bool) -> dict[str, Any]:
    if rehearse:
        return {"channels": 4, "nodes": 2, "reductions": 1, "image": 16, "n": 320,
                "population_size": 3, "offspring": 3, "generations": 1,
                "batches_per_generation": 3, "warmup_batches": 3, "valid_limit": 32,
                "source": "tiny rehearsal sizes"}
    return {"channels": 16, "nodes": 4, "reductions": 2, "image": 32, "n": 10000,
            "population_size": 10, "offspring": 10, "generations": 4,
            "batches_per_generation": 60, "warmup_batches": 400, "valid_limit": 200,
            "source": "benchmarks/sievo_device.sh's larger search (population 10, 10 offspring, "
                      "4 generations, 60 batches per generation, 400 warm-up batches)"}


def part_sievo(run: PartRun) -> None:
    device = begin(run)
    import_frugalnas(run, allow_light=False)

    sizes = run.rec.sizes(sievo_sizes(run.rehearse))
    run.rec.note("only the search of benchmarks/sievo_device.sh runs here: its stand-alone "
                 "reference (30 candidates x 4 seeds x 8 epochs), the REA/SPOS/DARTS baselines "
                 "and the retrainings take hours and stay with that script")
    planned = sizes["population_size"] + sizes["generations"] * sizes["offspring"]
    study = new_study(
        space="dag", strategy="si-evolution", estimator="inherited", dataset="synthetic",
        dataset_options={"n": sizes["n"], "size": sizes["image"], "channels": 3,
                         "valid_fraction": 0.1, "test_fraction": 0.1},
        space_options={"channels": sizes["channels"], "nodes": sizes["nodes"],
                       "reductions": sizes["reductions"], "normal_cells": 1},
        strategy_options={"population_size": sizes["population_size"], "offspring": sizes["offspring"],
                          "generations": sizes["generations"],
                          "batches_per_generation": sizes["batches_per_generation"],
                          "batch_size": 64, "warmup_batches": sizes["warmup_batches"],
                          "checkpoint_dir": str(run.scratch / "sievo")},
        estimator_options={"valid_limit": sizes["valid_limit"], "bn_recalibration_batches": 2},
        backend="single-device", backend_options={"device": str(device)}, seed=0)
    start = time.perf_counter()
    study.optimize(n_trials=planned, timeout=max(1.0, run.left()))
    seconds = time.perf_counter() - start
    record_failed_trials(run, study, "search")
    done = completed_trials(study)
    costs = [t.user_attrs.get("cost", {}) for t in done]
    figures = {"trials_completed": len(done), "trials_planned": planned, "seconds": seconds,
               "trials_per_s": len(done) / seconds if seconds > 0 else None,
               "cost_seconds_sum": sum(float(c.get("seconds", 0.0)) for c in costs if isinstance(c, dict)),
               "cost_flops_sum": sum(float(c.get("flops", 0.0)) for c in costs if isinstance(c, dict))}
    if done:
        best = max(done, key=lambda t: t.values[0])
        figures.update(best_inherited_accuracy=float(best.values[0]), best_architecture=str(best.architecture))
    run.rec.figure("search", figures)
    if len(done) < planned:
        run.rec.note(f"smaller than planned: {len(done)} of {planned} trials within the time box")
    run.rec.goal("the whole planned search (every generation) within the part's time box",
                 float(len(done)), float(planned))


# -- part 6: the mobilenet space -------------------------------------------------------------
def mobilenet_sizes(rehearse: bool) -> dict[str, Any]:
    if rehearse:
        return {"width_mult": 0.25, "stages": [[16, 2, 2], [24, 2, 1]], "head_channels": 32,
                "image": 12, "n": 240, "batch": 32, "supernet_epochs": 4, "trials": 4}
    return {"width_mult": 1.0, "stages": "v2", "head_channels": 1280, "image": 32, "n": 8000,
            "batch": 128, "supernet_epochs": 4, "trials": 20}


def part_mobilenet(run: PartRun) -> None:
    """The elastic supernet of the ``mobilenet`` space on the device: shared networks against
    their stand-alone exports, SPOS steps/s with progressive shrinking, and a short search
    (supernet estimator, regularized evolution)."""
    device = begin(run)
    import_frugalnas(run, allow_light=False)
    import random

    import torch

    import frugalnas
    from frugalnas.engine.training import TrainConfig
    from frugalnas.spaces.mobilenet.supernet import export_subnet
    from frugalnas.weight_sharing.supernet import Supernet

    sizes = run.rec.sizes(mobilenet_sizes(run.rehearse))
    space_options = {k: sizes[k] for k in ("width_mult", "stages", "head_channels")}
    host = frugalnas.PluginHost(disable_plugins=blocked_plugins())
    space = host.create("search_spaces", "mobilenet", **space_options)
    data = host.create("datasets", "synthetic", seed=0, n=sizes["n"], size=sizes["image"],
                       valid_fraction=0.1, test_fraction=0.1)
    supernet = Supernet(space, data.num_classes, data.input_shape, seed=0, progressive=True)
    supernet.to(device)
    x = data.split("valid")[0][:64].to(device)
    diffs = []
    for i in range(3):
        net = supernet.subnet(space.sample(random.Random(i))).eval()
        with torch.no_grad():
            diffs.append(float((net(x) - export_subnet(net).to(device).eval()(x)).abs().max()))
    run.rec.figure("shared_vs_export", {"max_abs_logit_diff": max(diffs), "networks": 3,
                                        "note": "eval mode, the same weights; bitwise on the CPU"})
    steps, seconds = timed_supernet_epoch(supernet, data, device,
                                          TrainConfig(batch_size=sizes["batch"], lr=0.05))
    run.rec.figure("supernet_progressive", {"steps_per_s": steps / seconds, "steps": steps,
                                            "batch": sizes["batch"],
                                            "supernet_params": supernet.num_parameters()})
    if run.left() < 5:
        run.rec.note("time box reached before the search")
        return
    study = new_study(space="mobilenet", space_options=space_options, strategy="regularized-evolution",
                      strategy_options={"population_size": 8, "sample_size": 3}, estimator="supernet",
                      estimator_options={"epochs": sizes["supernet_epochs"], "batch_size": sizes["batch"],
                                         "progressive_shrinking": True, "bn_batches": 2},
                      dataset="synthetic",
                      dataset_options={"n": sizes["n"], "size": sizes["image"],
                                       "valid_fraction": 0.1, "test_fraction": 0.1},
                      backend="single-device", backend_options={"device": str(device)}, seed=0)
    start = time.perf_counter()
    study.optimize(n_trials=sizes["trials"], timeout=max(1.0, run.left()))
    seconds = time.perf_counter() - start
    record_failed_trials(run, study, "search")
    done = completed_trials(study)
    figure: dict[str, Any] = {"trials_completed": len(done), "trials_planned": sizes["trials"],
                              "seconds": seconds}
    if done:
        best = max(done, key=lambda t: t.values[0])
        figure.update(best_supernet_accuracy=float(best.values[0]),
                      best_architecture=str(best.architecture))
    run.rec.figure("search", figure)
    run.rec.goal("the supernet trained with progressive shrinking and every planned candidate "
                 "scored on the device within the box (figure: trials completed)",
                 float(len(done)), float(sizes["trials"]))


PART_FUNCTIONS: dict[str, Callable[[PartRun], None]] = {
    "out_of_core": part_out_of_core, "virtual_nodes": part_virtual_nodes,
    "train_throughput": part_train_throughput, "proxies_supernet": part_proxies_supernet,
    "sievo": part_sievo, "mobilenet": part_mobilenet,
}


# -- one part, in its subprocess --------------------------------------------------------------
def run_part(name: str, rehearse: bool, box: float, result: Path) -> int:
    rec = Recorder(result, name, rehearse, box)
    scratch = Path(tempfile.mkdtemp(prefix=f"frugalnas-device-{name}-"))
    run = PartRun(name, rehearse, time.monotonic() + max(1.0, box - END_MARGIN), rec, scratch)
    start = time.perf_counter()
    code = 0
    try:
        PART_FUNCTIONS[name](run)
        rec.data["status"] = "partial" if rec.data["errors"] else "ok"
        if rec.data["errors"]:
            rec.data["reason"] = "; ".join(f"{e['step']}: {e['error']}" for e in rec.data["errors"])[:2000]
    except PartSkipped as exc:
        rec.data["status"], rec.data["reason"] = "skipped", str(exc)
    except ModuleNotFoundError as exc:
        rec.data["status"], rec.data["reason"] = "skipped", f"skipped: {missing_module(exc)} missing"
    except Exception as exc:  # noqa: BLE001 - recorded, the orchestrator goes on
        rec.data["status"], rec.data["reason"] = "failed", f"{type(exc).__name__}: {exc}"[:2000]
        traceback.print_exc()
        code = 1
    finally:
        rec.data["seconds"] = time.perf_counter() - start
        rec.flush()
        shutil.rmtree(scratch, ignore_errors=True)
    print(f"[{name}] {rec.data['status']}" + (f": {rec.data['reason']}" if rec.data["reason"] else ""),
          flush=True)
    return code


# -- the orchestrator -------------------------------------------------------------------------
def probe_modules() -> dict[str, bool]:
    found = {}
    for name in PROBED_MODULES:
        try:
            found[name] = importlib.util.find_spec(name) is not None
        except (ImportError, ValueError):
            found[name] = False
    return found


def stop_group(proc: subprocess.Popen) -> None:
    """End the part's process group (the part and any worker it started), politely first."""
    for sig, wait in ((signal.SIGTERM, 10.0), (signal.SIGKILL, 10.0)):
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, sig)
        try:
            proc.wait(timeout=wait)
            return
        except subprocess.TimeoutExpired:
            continue


@contextlib.contextmanager
def opened_log(path: Path) -> Iterator[Any]:
    with open(path, "a", buffering=1) as fh:
        yield fh


def orchestrate(args: argparse.Namespace) -> int:
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    log_path, json_path = out / "device.log", out / "device.json"
    log_path.write_text("")
    total = args.total if args.total is not None else (TOTAL_REHEARSE if args.rehearse else TOTAL_DEVICE)
    chosen = [p for p in PARTS if not args.parts or p.name in args.parts]
    unknown = set(args.parts or ()) - {p.name for p in PARTS}
    if unknown:
        raise SystemExit(f"unknown part(s) {sorted(unknown)}; valid: {', '.join(p.name for p in PARTS)}")
    report: dict[str, Any] = {
        "schema": SCHEMA, "mode": "rehearse" if args.rehearse else "device",
        "started": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "total_box_seconds": total, "wall_seconds": None,
        "environment": {"python": sys.executable, "python_version": platform.python_version(),
                        "platform": platform.platform(), "cpu_count": os.cpu_count(),
                        "modules": probe_modules(),
                        "pythonpath": os.environ.get("PYTHONPATH", "")},
        "parts": {}, "notes": []}
    if args.rehearse:
        report["notes"].append("rehearsal: tiny sizes on the CPU; the figures only show that every "
                               "code path runs, they measure nothing")
    start = time.monotonic()
    tmp = Path(tempfile.mkdtemp(prefix="frugalnas-device-"))

    def write() -> None:
        report["wall_seconds"] = time.monotonic() - start
        json_path.write_text(json.dumps(report, indent=1, default=_json_default))

    def say(fh: Any, text: str) -> None:
        print(text, flush=True)
        fh.write(text + "\n")
        fh.flush()

    try:
        with opened_log(log_path) as log:
            say(log, f"frugalnas device run ({report['mode']}), {len(chosen)} part(s), "
                     f"{total:.0f} s in all; python {sys.executable}")
            for i, part in enumerate(chosen):
                left = total - (time.monotonic() - start)
                own = args.part_box or (part.box_rehearse if args.rehearse else part.box_device)
                box = min(own, left)
                if left < MIN_BOX:
                    report["parts"][part.name] = {"part": part.name, "status": "skipped",
                                                  "reason": "skipped: the run's total time box is spent"}
                    say(log, f"== {part.name}: skipped (total time box spent)")
                    write()
                    continue
                say(log, f"== {part.name} ({part.title}), box {box:.0f} s")
                result = tmp / f"{part.name}.json"
                cmd = [sys.executable, str(Path(__file__).resolve()), "--part", part.name,
                       "--box", f"{box:.1f}", "--result", str(result)] + (["--rehearse"] if args.rehearse else [])
                t0 = time.monotonic()
                proc = subprocess.Popen(cmd, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT,
                                        start_new_session=True, env=part_environment(args.rehearse))
                timed_out = False
                try:
                    code = proc.wait(timeout=box)
                except subprocess.TimeoutExpired:
                    timed_out = True
                    stop_group(proc)
                    code = proc.returncode
                entry = read_result(result, part.name)
                entry["wall_seconds"] = time.monotonic() - t0
                entry["exit_code"] = code
                if timed_out:
                    entry["status"] = "timeout"
                    entry["reason"] = f"timed out after {box:.0f} s (figures so far kept)"
                elif entry["status"] == "running":
                    entry["status"] = "failed"
                    entry["reason"] = f"exit code {code} before the part finished"
                report["parts"][part.name] = entry
                say(log, f"== {part.name}: {entry['status']} in {entry['wall_seconds']:.1f} s"
                         + (f" ({entry['reason']})" if entry.get("reason") else ""))
                write()
            say(log, f"done in {time.monotonic() - start:.1f} s; figures in {json_path}")
    finally:
        write()
        shutil.rmtree(tmp, ignore_errors=True)
    broken = [n for n, p in report["parts"].items() if p.get("status") in ("failed", "timeout")]
    return 1 if broken else 0


def part_environment(rehearse: bool) -> dict[str, str]:
    """The parts' environment. A rehearsal runs on a small, often shared CPU, where several
    intra-op threads per process cost far more than they give (an eigendecomposition of a
    16x16 matrix took seconds under load): one thread each, unless set already."""
    env = dict(os.environ)
    if rehearse:
        for var in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            env.setdefault(var, "1")
    return env


def read_result(path: Path, name: str) -> dict[str, Any]:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {"part": name, "status": "running", "reason": None, "figures": {}}


# -- reading a run back --------------------------------------------------------------------
def _num(value: Any, digits: int = 0) -> str:
    return "-" if not isinstance(value, (int, float)) else f"{value:,.{digits}f}"


def summary_lines(data: dict[str, Any]) -> list[str]:
    """The figures of one ``device.json`` as the tables of docs/benchmarks.md."""
    lines: list[str] = []
    for name, part in data.get("parts", {}).items():
        env = part.get("environment", {})
        goal = part.get("goal") or {}
        lines.append(f"== {name}: {part.get('status')} on {env.get('device_name', env.get('device', '?'))}, "
                     f"torch {env.get('torch', '?')}; goal figure {_num(goal.get('figure'), 3)} "
                     f"against {_num(goal.get('target'), 3)}: {'met' if part.get('met') else 'not met'}")
        figures = part.get("figures", {})
        for model, fig in figures.items():
            if isinstance(fig, dict) and "modes" in fig:
                lines.append(f"  {model}: batch {fig['batch']}, budget {_num(fig['budget_bytes'] / 2**20)} MiB, "
                             f"largest in-core batch under it {fig['batch_fit_in_core']}, plan / best single "
                             f"{_num(fig.get('ratio_plan_vs_best_single'), 2)}")
                for mode, r in fig["modes"].items():
                    if mode.endswith("_uncapped"):
                        continue
                    lines.append(f"    {mode:<24} batch {r['batch']:>4}  {_num(r['images_per_s']):>7} images/s  "
                                 f"peak {_num(r.get('cuda_peak_allocated_bytes', 0) / 2**20):>6} MiB  "
                                 f"saved {_num(r.get('saved_peak_bytes', 0) / 2**20):>6} MiB  "
                                 f"budget met {r.get('budget_met', '-')}  {r.get('plan_counts') or ''}")
        if name == "virtual_nodes":
            for key in ("cpu_threads_reference", "gpu_vs_cpu"):
                fig = figures.get(key, {})
                lines.append(f"  {key}: max abs diff {fig.get('max_abs_diff', '-')}, tolerance "
                             f"{fig.get('tolerance', '-')}, within {fig.get('within_tolerance', '-')}")
            for batch, fig in (figures.get("throughput") or {}).items():
                lines.append(f"  global batch {batch}: native {_num(fig['native_examples_per_s'])}/s, "
                             f"V=8 {_num(fig['vnode_examples_per_s'])}/s, ratio {_num(fig['ratio'], 3)}")
        if name == "train_throughput":
            rows = {"estimator": figures.get("estimator", {}),
                    "training_loop_direct": figures.get("training_loop_direct", {}),
                    **{f"plain {k}": v for k, v in (figures.get("plain_loop") or {}).items()}}
            for label, fig in rows.items():
                lines.append(f"  {label:<34} {_num(fig.get('images_per_s')):>7} images/s")
        if name == "proxies_supernet":
            cells, spos = figures.get("rank_ensemble_selected", {}), figures.get("supernet_spos", {})
            lines.append(f"  selected ensemble: {_num(cells.get('cells_per_s'), 2)} cells/s "
                         f"({cells.get('cells_scored')} cells); SPOS: {_num(spos.get('steps_per_s'), 1)} steps/s")
        if name == "sievo":
            fig = figures.get("search", {})
            lines.append(f"  {fig.get('trials_completed')} of {fig.get('trials_planned')} trials in "
                         f"{_num(fig.get('seconds'), 1)} s; best inherited accuracy "
                         f"{_num(fig.get('best_inherited_accuracy'), 1)} %")
        if name == "mobilenet":
            sv, steps, srch = (figures.get(k, {}) for k in ("shared_vs_export", "supernet_progressive",
                                                             "search"))
            lines.append(f"  shared vs export: max logit difference {sv.get('max_abs_logit_diff')}; "
                         f"supernet {_num(steps.get('steps_per_s'), 1)} steps/s; search "
                         f"{srch.get('trials_completed')} of {srch.get('trials_planned')} trials in "
                         f"{_num(srch.get('seconds'), 1)} s")
        for error in part.get("errors", []):
            lines.append(f"  error in {error['step']}: {error['error'][:200]}")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rehearse", action="store_true",
                        help="tiny sizes on the CPU: every code path, no meaningful figure")
    parser.add_argument("--out", default=os.environ.get("OUT") or "device-out",
                        help="folder for device.json and device.log (default: $OUT, else ./device-out)")
    parser.add_argument("--parts", nargs="+", default=None,
                        help=f"run only these parts ({', '.join(p.name for p in PARTS)})")
    parser.add_argument("--total", type=float, default=None,
                        help=f"seconds for the whole run (default {TOTAL_DEVICE:.0f}; "
                             f"rehearsal {TOTAL_REHEARSE:.0f})")
    parser.add_argument("--part-box", type=float, default=None,
                        help="seconds for every part instead of its own box")
    parser.add_argument("--summary", nargs="+", metavar="DEVICE_JSON", default=None,
                        help="print the figures of earlier runs' device.json files and stop")
    parser.add_argument("--part", choices=sorted(PART_FUNCTIONS), help=argparse.SUPPRESS)
    parser.add_argument("--box", type=float, default=60.0, help=argparse.SUPPRESS)
    parser.add_argument("--result", default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.summary:
        for path in args.summary:
            try:
                data = json.loads(Path(path).read_text())
            except (OSError, ValueError) as exc:
                parser.error(f"--summary {path}: not a readable device.json ({exc})")
            print(f"# {path}: {data.get('mode')} run of {data.get('started')}, "
                  f"{_num(data.get('wall_seconds'))} s")
            print("\n".join(summary_lines(data)))
        return 0
    if args.part:
        if not args.result:
            parser.error("--part needs --result FILE")
        return run_part(args.part, args.rehearse, args.box, Path(args.result))
    return orchestrate(args)


if __name__ == "__main__":
    sys.exit(main())
