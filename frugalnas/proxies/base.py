"""Proxy: a zero-cost score of an untrained network on one mini-batch; ProxyEstimator runs
a registered proxy as a study estimator (score = proxy value)."""

from __future__ import annotations

import inspect
import math
import time
from abc import ABC, abstractmethod
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from torch.utils.module_tracker import ModuleTracker

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost, count_flops, count_params
from frugalnas.ports.data import DataSource
from frugalnas.ports.errors import ConfigError, check_choice, check_range
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.latency import LATENCY_METRICS, LatencyProbe, measure_latency
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.task import IMAGE_CLASSIFICATION, Task
from frugalnas.engine.training import seed_everything
from frugalnas.proxies.shared import SharedPasses

DATA_SOURCES = ("dataset", "gaussian")


class Proxy(ABC):
    """A zero-cost proxy: scores an untrained network from one mini-batch, higher is better.

    Subclasses declare ``needs_data`` (whether the values of the inputs matter; a data-free
    proxy uses only their shape), ``needs_labels`` and the ``tasks`` they apply to (image
    classes unless they say more) as class attributes, take their
    parameters in ``__init__`` (stored under the same names), and implement :meth:`compute`.
    :meth:`score` wraps ``compute`` so that the network's weights, buffers, gradients,
    ``requires_grad`` flags and training modes are as before, and the global RNG is seeded
    with ``seed`` (and left untouched afterwards)."""

    name: ClassVar[str] = "proxy"
    needs_data: ClassVar[bool]
    needs_labels: ClassVar[bool]
    #: the tasks (:class:`~frugalnas.ports.task.Task` names) the proxy is meant for: a study
    #: whose data poses another task is refused before its first trial
    tasks: ClassVar[tuple[str, ...]] = (IMAGE_CLASSIFICATION.name,)
    #: the network families (:attr:`SearchSpace.network_family`) whose structure the proxy
    #: reads (None: any network), and what it reads, for the one-line refusal of the others
    families: ClassVar[tuple[str, ...] | None] = None
    reads: ClassVar[str] = ""
    #: forward-pass equivalents per batch sample (forward+backward = 3), for the FLOP cost
    passes: ClassVar[float] = 3.0

    def __init__(self) -> None:
        """A proxy without parameters."""

    @abstractmethod
    def compute(self, model: nn.Module, inputs: torch.Tensor,
                targets: torch.Tensor | None) -> float:
        """The proxy value; may change the model (``score`` restores it)."""

    def compute_shared(self, model: nn.Module, inputs: torch.Tensor,
                       targets: torch.Tensor | None, shared: SharedPasses) -> float:
        """The proxy value, taking the computations it has in common with other proxies
        from ``shared`` (:mod:`frugalnas.proxies.shared`), or by a faster route of its own.
        The default shares nothing and calls :meth:`compute`; a proxy that overrides it must
        return bitwise the value of :meth:`compute`."""
        return self.compute(model, inputs, targets)

    def score(self, model: nn.Module, inputs: torch.Tensor,
              targets: torch.Tensor | None = None,
              shared: SharedPasses | None = None) -> float:
        """The proxy value of ``model`` on ``inputs`` (and ``targets`` if it needs labels).
        ``shared``: the :class:`~frugalnas.proxies.shared.SharedPasses` of this network and
        batch, when several proxies score it (same values, less work)."""
        if self.needs_labels and targets is None:
            raise ConfigError(f"proxy {self.name!r} needs labels; pass targets")
        if shared is not None:
            shared.check(model, inputs, targets)
        with preserved(model), torch.random.fork_rng(devices=[]):
            torch.manual_seed(int(getattr(self, "seed", 0)))
            if shared is None:
                return float(self.compute(model, inputs, targets))
            return float(self.compute_shared(model, inputs, targets, shared))

    def flops(self, forward_flops_per_sample: float, batch_size: int) -> float:
        """FLOPs one :meth:`score` spends, from a forward pass's FLOPs per sample."""
        return self.passes * forward_flops_per_sample * batch_size

    def get_params(self) -> dict[str, Any]:
        """The ``__init__`` parameters and their current values (scikit-learn style)."""
        sig = inspect.signature(type(self).__init__)
        return {n: getattr(self, n) for n in sig.parameters if n != "self"}

    def __repr__(self) -> str:
        args = ", ".join(f"{k}={v!r}" for k, v in self.get_params().items())
        return f"{type(self).__name__}({args})"


@contextmanager
def preserved(model: nn.Module) -> Iterator[None]:
    """Restore the model's parameters, buffers, gradients, ``requires_grad`` flags and
    training modes on exit."""
    params = list(model.parameters())
    tensors = params + list(model.buffers())
    saved = [t.detach().clone() for t in tensors]
    grads = [p.grad for p in params]
    flags = [p.requires_grad for p in params]
    modes = [(m, m.training) for m in model.modules()]
    try:
        yield
    finally:
        with torch.no_grad():
            for t, s in zip(tensors, saved):
                if t.shape == s.shape and t.dtype == s.dtype:
                    t.copy_(s)
                else:  # a proxy replaced the data (dtype change): put the original back
                    t.data = s
        for p, g, f in zip(params, grads, flags):
            p.grad = g
            p.requires_grad_(f)
        for m, mode in modes:
            m.training = mode


def weighted_layers(model: nn.Module) -> list[nn.Module]:
    """The convolution and linear layers, the layers proxies score (as in Abdelfattah et al.)."""
    return [m for m in model.modules() if isinstance(m, (nn.Conv2d, nn.Linear))]


def finite_log(x: float, floor: float = 1e-30) -> float:
    """``log(x)`` with ``x`` floored, so dead networks get a very low but finite score."""
    return math.log(max(float(x), floor))


@dataclass(frozen=True)
class ProxyBatch:
    """The fixed batch a proxy scores on, as the proxy estimators, the ensembles and the
    pre-screen take it: ``batch_size`` examples of ``data`` (``"dataset"``: a seeded batch of
    the study's dataset; ``"gaussian"``: standard normal images), optionally resized to
    ``resize`` pixels, drawn with ``seed`` (``None``: the trial's seed). ``input_shape`` and
    ``num_classes`` apply when there is no dataset to take them from. ``what`` names the
    component in errors."""

    batch_size: int = 64
    data: str = "dataset"
    resize: int | None = None
    seed: int | None = None
    input_shape: tuple[int, ...] = (3, 32, 32)
    num_classes: int = 10
    what: str = "proxy"

    def __post_init__(self) -> None:
        check_range(f"{self.what} batch_size", self.batch_size, 1)
        check_choice(f"{self.what} data", self.data, DATA_SOURCES)
        check_range(f"{self.what} num_classes", self.num_classes, 2)
        object.__setattr__(self, "input_shape", tuple(self.input_shape))

    def uses_dataset(self, proxies: Sequence[Proxy]) -> bool:
        """Whether scoring ``proxies`` on this batch needs the study's dataset: for its values,
        or for the shape of a task other than image classes (made-up inputs are images)."""
        other_task = any(IMAGE_CLASSIFICATION.name not in p.tasks for p in proxies)
        return other_task or (self.data == "dataset" and any(p.needs_data for p in proxies))

    @staticmethod
    def study_dataset(context: TrialContext | None) -> DataSource | None:
        """The study's dataset; ``None`` when the study has none."""
        if context is None or context.dataset_loader is None:
            return None
        try:
            return context.dataset
        except (ValueError, KeyError):  # a loader that says the study has no dataset
            return None

    def task(self, context: TrialContext | None) -> Task:
        """The task of the study's dataset; image classes when the study has none."""
        ds = self.study_dataset(context)
        return IMAGE_CLASSIFICATION if ds is None else ds.task

    def draw(self, context: TrialContext | None, *, need_dataset: bool = True,
             seed: int | None = None) -> tuple[torch.Tensor, torch.Tensor, int]:
        """``(inputs, targets, num_classes)``, seeded with ``seed`` if given, else this
        batch's seed, else 0. The shape and class count come from the dataset when the study
        has one. Data-free proxies pass ``need_dataset=False`` so that no dataset is loaded
        just for its shape."""
        seed = seed if seed is not None else (self.seed if self.seed is not None else 0)
        has_data = context is not None and context.dataset_loader is not None
        if self.data == "dataset" and need_dataset and not has_data:
            raise ConfigError(f"{self.what} option data='dataset' needs a study dataset; set "
                              "dataset= or use data='gaussian'")
        # only the shape needed: the dataset's if the study has one
        ds = context.dataset if has_data and need_dataset else self.study_dataset(context)
        input_shape, num_classes = self.input_shape, self.num_classes
        task: Task = IMAGE_CLASSIFICATION
        if ds is not None:
            if self.resize:
                ds = ds.resized(int(self.resize))
            if self.data == "dataset":
                x, y = ds.fixed_batch(self.batch_size, seed=seed)
                return x, y, ds.num_classes
            input_shape, num_classes, task = ds.input_shape, ds.num_classes, ds.task
        g = torch.Generator().manual_seed(seed)
        shape = tuple(input_shape)
        if self.resize:
            shape = (shape[0], int(self.resize), int(self.resize))
        x, y = task.example_batch(self.batch_size, shape, num_classes, g)
        return x, y, num_classes


class ProxyEstimator(Estimator):
    """Scores an architecture with a registered zero-cost proxy on its untrained network.

    ``latency=True`` also measures the network's inference latency on the backend's device
    (batches of ``latency_batch_size`` at the proxy batch's input shape) and adds the metrics
    ``latency_ms`` (median) and ``latency_ms_iqr`` (spread)."""

    needs_dataset = False

    def __init__(self, proxy: str | Proxy, host: Any = None, batch_size: int = 64,
                 data: str = "dataset", resize: int | None = None, seed: int | None = None,
                 input_shape: tuple[int, ...] = (3, 32, 32), num_classes: int = 10,
                 proxy_options: dict[str, Any] | None = None, latency: bool = False,
                 latency_batch_size: int = 1, latency_min_run_time: float = 0.2):
        self.batch = ProxyBatch(batch_size, data, resize, seed, input_shape, num_classes)
        self.latency = LatencyProbe.of(latency, latency_batch_size, latency_min_run_time)
        if isinstance(proxy, str):
            if host is None:
                raise ConfigError(f"proxy {proxy!r} is a component name: pass the plugin host "
                                  "that registers it (host=), or a Proxy object")
            proxy = host.create("proxies", proxy, **(proxy_options or {}))
        self.proxy = proxy
        self.name = proxy.name
        self.needs_dataset = self.batch.uses_dataset([proxy])
        self.provides = (f"proxy_{proxy.name}", *(LATENCY_METRICS if latency else ()))

    measures = ("seconds", "flops", "params")

    def check_space(self, space: SearchSpace) -> None:
        """A proxy meant for none of the tasks the space's networks are built for, or that
        reads a structure the space's networks lack, is refused before the first trial (the
        data's task is checked again at each evaluation)."""
        if not set(type(space).tasks) & set(self.proxy.tasks):
            raise ConfigError(not_meant_for(self.proxy, type(space).tasks[0]))
        check_families([self.proxy], space)

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        values, cost = score_network([self.proxy], arch, context, self.batch,
                                     need_dataset=self.needs_dataset, latency=self.latency)
        value = values[f"proxy_{self.proxy.name}"]
        return EstimateResult(value=value, metrics=values, cost=cost)


def not_meant_for(proxy: Proxy, task: str) -> str:
    """Why ``proxy`` is refused for data of ``task``, in one line."""
    hint = ("; for language models use a proxy that lists the task (frugalnas plugins "
            "proxies), such as 'decoder_params'" if task == "language-modelling" else "")
    return (f"proxy {proxy.name!r} is not meant for {task} data: it was designed and "
            f"validated for {', '.join(proxy.tasks)} only{hint}")


def check_families(proxies: Sequence[Proxy], space: SearchSpace) -> None:
    """A ConfigError naming the first proxy that reads a structure ``space``'s networks lack
    (a ReLU activation pattern in a transformer), and what it reads."""
    family = type(space).network_family
    for proxy in proxies:
        if family is not None and proxy.families is not None and family not in proxy.families:
            raise ConfigError(f"proxy {proxy.name!r} reads {proxy.reads}, which the {family} "
                              f"networks of space {space.name!r} lack: it gives every one the "
                              f"same score or none; valid for {', '.join(proxy.families)} "
                              "networks")


def check_tasks(proxies: Sequence[Proxy], task: Task) -> None:
    """A ConfigError naming the first proxy not meant for ``task`` and the reason."""
    for proxy in proxies:
        if task.name not in proxy.tasks:
            raise ConfigError(not_meant_for(proxy, task.name))


def score_with(proxy: Proxy, model: nn.Module, inputs: torch.Tensor,
               targets: torch.Tensor | None, shared: SharedPasses | None) -> float:
    """``proxy.score(model, inputs, targets, shared=shared)``; a proxy whose class replaces
    :meth:`Proxy.score` itself (and may not take ``shared``) is scored without it."""
    if shared is None or getattr(type(proxy), "score", None) is not Proxy.score:
        return float(proxy.score(model, inputs, targets))
    return float(proxy.score(model, inputs, targets, shared=shared))


def score_network(proxies: Sequence[Proxy], arch: Architecture, context: TrialContext,
                  batch: ProxyBatch, *, need_dataset: bool,
                  latency: LatencyProbe | None = None,
                  share: bool = True) -> tuple[dict[str, float], Cost]:
    """Build ``arch``'s network once, score it with each proxy on ``batch`` (the proxies
    share their common passes and take their fast paths through one :class:`SharedPasses`),
    and return ``{"proxy_NAME": value}`` with the cost of all of it (FLOPs from the proxies'
    passes). With a ``latency`` probe the network's inference latency on the backend's device
    is measured too (:func:`~frugalnas.ports.latency.measure_latency`, the batch's input
    shape) and added as ``latency_ms`` and ``latency_ms_iqr``. ``share=False`` scores each
    proxy alone and counts FLOPs with :func:`~frugalnas.ports.cost.count_flops`: the
    reference path, the same values and cost, slower (to measure what sharing saves)."""
    start = time.perf_counter()
    seed = context.seed if batch.seed is None else batch.seed
    check_tasks(proxies, batch.task(context))
    x, y, n_classes = batch.draw(context, need_dataset=need_dataset, seed=seed)
    seed_everything(seed)
    model = context.backend.prepare(context.space.build(arch, n_classes, tuple(x.shape[1:])))
    x, y = x.to(context.backend.device), y.to(context.backend.device)
    shared = SharedPasses(model, x, y) if share else None
    values = {f"proxy_{p.name}": score_with(p, model, x, y, shared) for p in proxies}
    if latency is not None:
        values.update(measure_latency(model, tuple(x.shape[1:]), latency.batch_size,
                                      context.backend.device, example=x[:1],
                                      min_run_time=latency.min_run_time).metrics())
    seconds = time.perf_counter() - start
    per_sample = forward_flops(model, x[:1]) if share else count_flops(model, x[:1])
    flops = sum(p.flops(per_sample, len(x)) for p in proxies)
    return values, Cost(seconds=seconds, flops=flops, params=count_params(model))


class _GlobalOnly:
    """A stand-in for :class:`FlopCounterMode`'s module tracker that tracks no module: every
    count goes to the total only."""

    parents = frozenset({"Global"})

    def __enter__(self) -> "_GlobalOnly":
        return self

    def __exit__(self, *exc: object) -> None:
        return None


def forward_flops(model: nn.Module, example: torch.Tensor) -> int:
    """:func:`~frugalnas.ports.cost.count_flops` of one forward pass, the same number
    without the per-module breakdown (torch's counter tracks every module through hooks,
    a third of its time on small cells): the same counter and formulas, totals only."""
    counter = FlopCounterMode(display=False)
    if not isinstance(getattr(counter, "mod_tracker", None), ModuleTracker):
        return count_flops(model, example)  # a torch whose counter is built otherwise
    counter.mod_tracker = _GlobalOnly()
    was_training = model.training
    model.eval()
    try:
        with counter, torch.no_grad():
            model(example)
    finally:
        model.train(was_training)
    return int(counter.get_total_flops())
