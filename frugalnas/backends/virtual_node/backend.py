"""Built-in plugin: the virtual-node backend (VirtualFlow; Or, Zhang and Freedman, MLSys 2022).

Each global batch is split into ``virtual_nodes`` virtual nodes; they are spread over one or
more processes, each running its share one node at a time, and the per-node gradients are
summed in node order, so training does not depend on how many processes (or which split)
ran it."""

from __future__ import annotations

import os
import sys
import threading
import weakref
from collections.abc import Iterable, Iterator, Sequence
from typing import Any

import torch
from torch import nn

from frugalnas.ports.backend import Backend, Batch, LossFn
from frugalnas.ports.errors import (ConfigError, TrialFailure, check_choice, check_range,
                                   one_line)
from frugalnas.host.plugins import PluginHost
from frugalnas.backends.virtual_node.advice import NodeBatchAdvice, measure_node_batch
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.backends.virtual_node.checks import check_inner_travels, world_secret
from frugalnas.backends.virtual_node.comm import all_ok, broadcast_state, dumps
from frugalnas.backends.virtual_node.engine import THROUGHPUT_CHOICES, VirtualNodeEngine
from frugalnas.backends.virtual_node.plan import check_shares, even_shares, split_sizes
from frugalnas.backends.virtual_node.worker import make_inner
from frugalnas.backends.virtual_node.world import ProcessWorld, exit_text


def _positive_int(what: str, value: object) -> int:
    if not isinstance(value, int) or isinstance(value, bool) or value < 1:
        raise ConfigError(f"invalid {what} {value!r}; expected an integer >= 1")
    return value


class VirtualNodeBackend(Backend):
    """Splits each batch into V virtual nodes run over 1..N processes; results independent of N.

    ``inner`` names the backend that runs each node (with ``inner_options``). It is created
    from ``host``, the study's plugin host (a study passes it), so a plugin's backend works as
    ``inner``; worker processes rebuild the same host from ``host.spec()`` (plugins by name,
    blocked names), and an inner backend from a plugin passed as an object is refused when
    other processes need it. Built directly, a non-default ``inner`` needs ``host=`` (for
    example ``frugalnas.PluginHost()``); ``"single-device"`` is always created directly and
    needs none.

    Concurrent trials of one study (``n_jobs > 1``) share the backend: their training steps
    take turns (one process group, one set of workers). After every evaluation
    :meth:`trial_outputs` gives ``vnode_*`` metrics (virtual nodes, processes, nodes per rank,
    steps) and whatever the inner backend reports."""

    name = "virtual-node"

    def __init__(self, virtual_nodes: int = 1, nproc: int = 1,
                 shares: Sequence[int] | str | None = None,
                 throughput: str | None = None, inner: str = "single-device",
                 inner_options: dict[str, Any] | None = None, device: str = "auto", seed: int = 0,
                 threads: int | None = 1, world_size: int | None = None,
                 master_addr: str = "127.0.0.1", master_port: int = 0, timeout: float = 300.0,
                 host: PluginHost | None = None):
        self.virtual_nodes = _positive_int("virtual_nodes", virtual_nodes)
        self.nproc = _positive_int("nproc", nproc)
        self.world_size = _positive_int("world_size", nproc if world_size is None else world_size)
        if self.world_size < self.nproc:
            raise ConfigError(f"invalid world_size {world_size!r}; it must be >= nproc ({nproc})")
        if inner == self.name:
            raise ConfigError("invalid inner 'virtual-node'; use a single-process backend such as "
                              "'single-device' or 'out-of-core'")
        if threads is not None:
            _positive_int("threads", threads)
        check_range("timeout", timeout, 1)
        self.inner_name, self.inner_options = inner, dict(inner_options or {})
        if "device" in self.inner_options:
            raise ConfigError("invalid inner_options key 'device'; set device on the virtual-node "
                              "backend (each worker process picks its own)")
        if host is None and inner != "single-device":
            raise ConfigError(f"inner backend {inner!r} is created from a plugin host; pass "
                              "host= (a study passes its own; directly: "
                              "host=frugalnas.PluginHost())")
        self.host = host
        if host is not None and inner != "single-device" and self.world_size > 1:
            check_inner_travels(host, inner, self.world_size - 1)
        if self.world_size > self.nproc:
            world_secret(self.nproc, self.world_size, os.environ)  # refused now, not at step 1
        self.inner = make_inner(inner, device, self.inner_options, host)
        if self.inner.device.type == "cuda" and self.nproc > torch.cuda.device_count():
            raise ConfigError(f"invalid nproc {nproc!r}: NCCL needs one GPU per process and "
                              f"{torch.cuda.device_count()} GPU(s) are visible")
        self.seed, self.threads, self.timeout = seed, threads, float(timeout)
        if isinstance(shares, str):  # "5,3" from a command line
            try:
                shares = [int(part) for part in shares.split(",")]
            except ValueError:
                raise ConfigError(f"invalid shares {shares!r}; expected integers like '5,3'") from None
        self.shares, self.throughput = None if shares is None else list(shares), throughput
        self.master_addr, self.master_port = master_addr, master_port
        check_choice("throughput", throughput, THROUGHPUT_CHOICES)
        if shares is not None:
            if throughput == "measure":
                raise ConfigError("give either shares or throughput='measure', not both")
            check_shares(shares, self.virtual_nodes, self.world_size)
        # With several processes the engine is built once the process group exists.
        self.engine = self._make_engine(distributed=False) if self.world_size == 1 else None
        self._world: ProcessWorld | None = None
        self._sent: weakref.ref | None = None  # the model the workers hold
        self._lock = threading.RLock()         # one step at a time (n_jobs > 1 share a backend)
        self._usage = threading.local()        # per evaluating thread: steps since trial_outputs
        self.advice: NodeBatchAdvice | None = None  # measured at the first step, printed once

    def _make_engine(self, distributed: bool) -> VirtualNodeEngine:
        return VirtualNodeEngine(self.virtual_nodes, self.inner, seed=self.seed, shares=self.shares,
                                 throughput=self.throughput, distributed=distributed,
                                 threads=self.threads)

    @property
    def device(self) -> torch.device:
        return self.inner.device

    def _used(self, steps: int = 0) -> None:
        self._usage.steps = getattr(self._usage, "steps", 0) + steps

    def prepare(self, model: nn.Module) -> nn.Module:
        self._used()
        with self._lock:
            model = self.inner.prepare(model)
            self._sent = None
            if self.engine is not None:
                self.engine.reset()
        return model

    def _config(self) -> dict[str, Any]:
        dev = self.device
        return {"dist_backend": "nccl" if dev.type == "cuda" else "gloo",
                "first_gpu": dev.index or 0,
                "inner": self.inner_name, "inner_options": self.inner_options,
                "host": self.host.spec() if self.host is not None else None,
                "virtual_nodes": self.virtual_nodes, "shares": self.shares,
                "throughput": self.throughput, "seed": self.seed, "threads": self.threads,
                "timeout": self.timeout}

    def _ensure_world(self, model: nn.Module) -> None:
        """Start the worker processes if needed (again, when a local one has died since the
        last step) and make sure they hold ``model``."""
        dead = self._world.dead_ranks() if self._world is not None and self._world.running else []
        if dead:
            print("frugalnas: warning: virtual-node " + "; ".join(
                f"rank {r} {exit_text(code)}" for r, code in dead) + "; starting a new world",
                file=sys.stderr, flush=True)
            self._world.close(force=True)
        if self._world is None or not self._world.running:
            self._world = ProcessWorld(self.nproc, self.world_size, self._config(),
                                       master_addr=self.master_addr, master_port=self.master_port,
                                       timeout=self.timeout)
            if self.device.type == "cuda":
                torch.cuda.set_device(self.device.index or 0)
            try:
                self._world.start()
            except ConfigError:
                raise
            except Exception as exc:  # a rank did not come (back): this trial cannot train
                raise TrialFailure(f"virtual-node world could not start: {one_line(exc)}") from exc
            self.engine = self._make_engine(distributed=True)
            self._sent = None
        if self._sent is None or self._sent() is not model:
            payload = dumps(model)
            try:
                self._world.post("model", payload)
                flags = all_ok(True, self.engine.comm_device)
            except Exception as exc:
                raise self._broken(exc) from exc
            if not all(flags):
                raise TrialFailure(f"virtual-node workers could not load the model (ok per rank: {flags})")
            self.engine.reset()
            self._sent = weakref.ref(model)

    def train_step(self, model: nn.Module, optimizer: torch.optim.Optimizer, loss_fn: LossFn,
                   inputs: torch.Tensor, targets: torch.Tensor, step: int) -> float:
        """One step on the global batch: every process runs its virtual nodes, rank 0 sums the
        per-node gradients in node order, updates batch-norm estimates and steps ``optimizer``."""
        self._used(1)
        with self._lock:
            if self.advice is None and self.virtual_nodes > 1:
                self.advice = self._advise(model, loss_fn, inputs, targets)
            if self.world_size > 1:
                loss = self._distributed_step(model, optimizer, loss_fn, inputs, targets, step)
            else:
                optimizer.zero_grad(set_to_none=True)
                loss = self.engine.compute(model, loss_fn, inputs, targets, step)
            optimizer.step()
        return loss

    def _advise(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor,
                targets: torch.Tensor) -> NodeBatchAdvice:
        """Measure, on this process's device, the per-node batch below which virtual nodes
        cost throughput, and print it (once per backend: at its first step). The passes are
        plain forward-backward passes on the device, not the inner backend's, so that they
        count in none of its records (plans, usage)."""
        plain = SingleDeviceBackend(str(self.device))
        timer = VirtualNodeEngine(1, plain, distributed=False, threads=self.threads)
        advice = measure_node_batch(
            lambda n: timer.examples_per_second(model, loss_fn, inputs, targets, n, reps=3),
            self.virtual_nodes, len(inputs), str(self.device))
        print(f"frugalnas: {advice.text()}", file=sys.stderr, flush=True)
        return advice

    def _distributed_step(self, model: nn.Module, optimizer: torch.optim.Optimizer,
                          loss_fn: LossFn, inputs: torch.Tensor, targets: torch.Tensor,
                          step: int) -> float:
        """The gradient of one step over the world. A world that breaks (a rank died, a
        connection failed) is closed and the trial fails with what happened; the next step
        starts a new world."""
        self._ensure_world(model)
        try:
            self._world.post("step", step, model.training, loss_fn, inputs, targets)
            broadcast_state(model, self.engine.comm_device)
            optimizer.zero_grad(set_to_none=True)
            return self.engine.compute(model, loss_fn, inputs, targets, step)
        except (TrialFailure, ConfigError):
            raise  # a failing node or an unpicklable loss: the world is intact
        except Exception as exc:
            raise self._broken(exc) from exc

    def _broken(self, exc: Exception) -> TrialFailure:
        """Close a world a collective failed in, and say what happened."""
        what = self._world.failure(exc)
        self._world.close(force=True)
        self._sent = None
        return TrialFailure(f"virtual-node world broken: {what}; the next training step starts "
                            "a new world")

    def forward_backward(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor,
                         targets: torch.Tensor, loss_scale: float = 1.0) -> float:
        """Gradient accumulation over the virtual nodes in this process (no communication)."""
        self._used()
        total, batch, start = 0.0, len(inputs), 0
        for n in split_sizes(batch, self.virtual_nodes):
            if n:
                loss = float(self.inner.forward_backward(
                    model, loss_fn, inputs[start:start + n], targets[start:start + n],
                    loss_scale * n / batch))
                total += loss * n / batch
            start += n
        return total

    def device_batches(self, batches: Iterable[Batch]) -> Iterator[Batch]:
        """The batches unchanged: each step splits its batch over the virtual nodes (and the
        processes of the world) itself."""
        return iter(batches)

    def predict(self, model: nn.Module, inputs: torch.Tensor, batch_size: int = 512) -> torch.Tensor:
        return self.inner.predict(model, inputs, batch_size)

    def reset_peak_memory(self) -> None:
        self.inner.reset_peak_memory()

    def peak_memory(self) -> int:
        return self.inner.peak_memory()

    def describe(self) -> dict[str, object]:
        shares = self.engine.shares() if self.engine is not None else self.shares
        info: dict[str, object] = {
            "backend": self.name, "device": str(self.device), "virtual_nodes": self.virtual_nodes,
            "world_size": self.world_size, "shares": shares, "inner": self.inner_name}
        if self.advice is not None:
            info["node_batch_advice"] = self.advice.text()
        return info

    def trial_outputs(self) -> tuple[dict[str, float], dict[str, str | bytes]]:
        """``vnode_*`` metrics of the evaluation that just ran in this thread (none if it did
        not use the backend) plus the inner backend's outputs: ``vnode_virtual_nodes``,
        ``vnode_world_size``, ``vnode_nproc``, ``vnode_steps`` (training steps), and
        ``vnode_share_rank<r>``, the virtual nodes rank ``r`` ran per step (once known)."""
        metrics, artifacts = self.inner.trial_outputs()
        steps = getattr(self._usage, "steps", None)
        if steps is None:
            return metrics, artifacts
        del self._usage.steps
        ours: dict[str, float] = {"vnode_virtual_nodes": float(self.virtual_nodes),
                                  "vnode_world_size": float(self.world_size),
                                  "vnode_nproc": float(self.nproc), "vnode_steps": float(steps)}
        with self._lock:
            shares = self.engine.shares() if self.engine is not None else self.shares
        if shares is None and self.throughput != "measure":
            shares = even_shares(self.virtual_nodes, self.world_size)
        for rank, share in enumerate(shares or ()):
            ours[f"vnode_share_rank{rank}"] = float(share)
        return {**metrics, **ours}, artifacts

    def release(self) -> None:
        """Stop the worker processes; they are started again if the backend is used again."""
        with self._lock:
            if self._world is not None:
                self._world.close()
            self._sent = None

    def close(self) -> None:
        self.release()
        self.inner.close()


