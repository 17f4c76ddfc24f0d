"""The virtual-node step: per-node gradients and batch-norm statistics, reduced in node order.

:class:`VirtualNodeEngine` is the SPMD building block. Every process of a
``torch.distributed`` world (or a single process) calls :meth:`VirtualNodeEngine.compute`
with the same global batch and the same parameters; each process runs its contiguous share
of the ``V`` virtual nodes one at a time, the per-node gradient vectors are gathered, and
their sum is taken in node order 0..V-1. The result is therefore bitwise the same for any
number of processes and any split of the nodes (given identical kernels: same device type,
same intra-op thread count)."""

from __future__ import annotations

import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

import torch
import torch.distributed as dist
from torch import nn

from frugalnas.ports.backend import Backend, LossFn
from frugalnas.ports.errors import ConfigError, TrialFailure, check_choice
from frugalnas.backends.virtual_node.batchnorm import (BatchNormRecorder, apply_running_updates, preserved_buffers,
                              stats_width, tracked_batchnorms)
from frugalnas.backends.virtual_node.plan import check_shares, even_shares, offsets, shares_from_speed, split_sizes, vn_seed

THROUGHPUT_CHOICES = (None, "even", "measure")
_TAIL = 3  # scaled loss, example count, error flag


@contextmanager
def num_threads(n: int | None) -> Iterator[None]:
    """Run the block with ``n`` intra-op CPU threads (unchanged when ``n`` is None)."""
    old = torch.get_num_threads()
    if n is None or n == old:
        yield
        return
    torch.set_num_threads(n)
    try:
        yield
    finally:
        torch.set_num_threads(old)


class VirtualNodeEngine:
    """Computes the gradient of one global batch split into ``virtual_nodes`` virtual nodes.

    ``inner`` runs each node's forward and backward (its ``forward_backward``). ``shares``
    gives the nodes per process; ``throughput="measure"`` derives them from a timed node on
    each process at the first step after :meth:`reset`. With ``distributed=True`` and an
    initialised default process group (or ``group``) the nodes are spread over its ranks;
    otherwise everything runs in this process. ``threads`` fixes the CPU intra-op thread count
    while nodes run, which bitwise reproducibility across processes requires."""

    def __init__(self, virtual_nodes: int, inner: Backend, *, seed: int = 0,
                 shares: Sequence[int] | None = None, throughput: str | None = None,
                 distributed: bool = True, group: object | None = None, threads: int | None = 1):
        if not isinstance(virtual_nodes, int) or isinstance(virtual_nodes, bool) or virtual_nodes < 1:
            raise ConfigError(f"invalid virtual_nodes {virtual_nodes!r}; expected an integer >= 1")
        check_choice("throughput", throughput, THROUGHPUT_CHOICES)
        if shares is not None and throughput == "measure":
            raise ConfigError("give either shares or throughput='measure', not both")
        self.virtual_nodes = virtual_nodes
        self.inner = inner
        self.seed = seed
        self.throughput = throughput
        self.threads = threads
        self.group = group
        self.distributed = bool(distributed and dist.is_available() and dist.is_initialized())
        self.rank = dist.get_rank(group) if self.distributed else 0
        self.world_size = dist.get_world_size(group) if self.distributed else 1
        self.user_shares = None if shares is None else check_shares(shares, virtual_nodes, self.world_size)
        self.measured_speeds: list[float] | None = None
        self._shares: list[int] | None = None

    @property
    def comm_device(self) -> torch.device:
        """Where collective buffers live: the GPU for NCCL, the CPU otherwise."""
        if self.distributed and dist.get_backend(self.group) == "nccl":
            return torch.device("cuda", torch.cuda.current_device())
        return torch.device("cpu")

    def reset(self) -> None:
        """Forget measured shares (call when a new model is prepared)."""
        self._shares = None
        self.measured_speeds = None

    def shares(self) -> list[int] | None:
        """Virtual nodes per rank in use (None before the first step when measuring)."""
        if self.user_shares is not None:
            return list(self.user_shares)
        if self.throughput == "measure":
            return None if self._shares is None else list(self._shares)
        return even_shares(self.virtual_nodes, self.world_size)

    # -- one global step -------------------------------------------------------------------

    def compute(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor,
                targets: torch.Tensor, step: int, apply: bool = True) -> float:
        """Set ``.grad`` of ``model`` to the gradient of the mean loss over the global batch and
        update batch-norm running estimates, exactly as if the virtual nodes had run in order
        on one device. Returns the mean loss. With ``apply=False`` only this rank's share is
        computed and contributed (a helper rank whose parameters are overwritten each step)."""
        sizes = split_sizes(len(inputs), self.virtual_nodes)
        shares = self._ensure_shares(model, loss_fn, inputs, targets, sizes)
        params = list(model.parameters())
        bns = tracked_batchnorms(model)
        widths = (sum(p.numel() for p in params), len(params), stats_width(bns), len(bns))
        dtype = torch.float64 if any(p.dtype == torch.float64 for p in params) else torch.float32
        first = offsets(shares)[self.rank]
        local = range(first, first + shares[self.rank])
        length = sum(widths) + _TAIL
        device = params[0].device if params else torch.device("cpu")
        if not self.distributed:
            # One process: sum rows as they come (same order, same result, one row of memory).
            summed: list[torch.Tensor] = []
            per_node = torch.zeros(self.virtual_nodes, length - widths[0], dtype=dtype, device=device)

            def sink(i: int, row: torch.Tensor) -> None:
                if summed:
                    summed[0] += row
                else:
                    summed.append(row.clone())
                per_node[i] = row[widths[0]:]

            error = self._local_rows(model, loss_fn, inputs, targets, step, sizes, local, params,
                                     bns, widths, length, dtype, device, sink)
            if error is not None:
                raise error
            return self._apply(model, params, bns, widths, summed[0], per_node)
        rows = torch.zeros(max(1, len(local)), length, dtype=dtype, device=device)
        error = self._local_rows(model, loss_fn, inputs, targets, step, sizes, local, params, bns,
                                 widths, length, dtype, device, lambda i, row: rows[i].copy_(row))
        if error is not None:
            rows[:, -1] = 1.0  # tells every rank, which then raise together instead of hanging
        table = self._gather(rows, shares)
        if float(table[:, -1].sum()) > 0:
            bad = [v for v in range(self.virtual_nodes) if table[v, -1] > 0]
            msg = f"virtual nodes {bad} failed" + (f" (here: {error!r})" if error else "")
            raise TrialFailure(msg) from error
        if not apply:
            return float("nan")
        total = table[0].clone()
        for v in range(1, table.shape[0]):
            total += table[v]  # sequential sum in node order: the same for every world size
        return self._apply(model, params, bns, widths, total, table[:, widths[0]:])

    def _local_rows(self, model, loss_fn, inputs, targets, step, sizes, local, params, bns,
                    widths, length, dtype, device, sink) -> BaseException | None:
        """Run this rank's nodes in order, passing each node's row to ``sink(i, row)``."""
        row = torch.zeros(length, dtype=dtype, device=device)
        starts = offsets(sizes)
        recorder = BatchNormRecorder(bns)
        batch = len(inputs)
        try:
            with preserved_buffers(bns), recorder.recording(), num_threads(self.threads):
                for i, v in enumerate(local):
                    n = sizes[v]
                    row.zero_()
                    if n > 0:
                        model.zero_grad(set_to_none=True)
                        recorder.reset()
                        with self._seeded(vn_seed(self.seed, step, v), device):
                            loss = float(self.inner.forward_backward(
                                model, loss_fn, inputs[starts[v]:starts[v] + n],
                                targets[starts[v]:starts[v] + n], loss_scale=n / batch))
                        self._fill_row(row, params, recorder, widths, loss * n / batch, n)
                    sink(i, row)
            model.zero_grad(set_to_none=True)
        except Exception as exc:  # reported to every rank through the error flag
            return exc
        return None

    @staticmethod
    def _fill_row(row: torch.Tensor, params: list[nn.Parameter], recorder: BatchNormRecorder,
                  widths: tuple[int, int, int, int], scaled_loss: float, n: int) -> None:
        n_grad, n_params, n_stats, n_bn = widths
        col = 0
        for j, p in enumerate(params):
            if p.grad is not None:
                row[col:col + p.numel()] = p.grad.reshape(-1)
                row[n_grad + j] = 1.0
            col += p.numel()
        col = n_grad + n_params
        for k, stats in enumerate(recorder.stats):
            width = recorder.bns[k].num_features * 2
            if stats is not None:
                row[col:col + width] = stats
                row[n_grad + n_params + n_stats + k] = 1.0
            col += width
        row[-3] = scaled_loss
        row[-2] = n

    @contextmanager
    def _seeded(self, seed: int, device: torch.device) -> Iterator[None]:
        # The generators are reseeded directly: torch.manual_seed is slow per call.
        cpu = torch.default_generator
        cpu_state = cpu.get_state()
        cuda_state = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
        cpu.manual_seed(seed)
        if cuda_state is not None:
            torch.cuda.default_generators[device.index or 0].manual_seed(seed)
        try:
            yield
        finally:
            cpu.set_state(cpu_state)
            if cuda_state is not None:
                torch.cuda.set_rng_state(cuda_state, device)

    def _gather(self, rows: torch.Tensor, shares: list[int]) -> torch.Tensor:
        """All ranks' rows, concatenated in global virtual-node order."""
        pad = max(1, max(shares))
        send = torch.zeros(pad, rows.shape[1], dtype=rows.dtype, device=self.comm_device)
        send[:rows.shape[0]] = rows.to(self.comm_device)
        recv = [torch.empty_like(send) for _ in range(self.world_size)]
        dist.all_gather(recv, send, group=self.group)
        table = torch.cat([recv[r][:shares[r]] for r in range(self.world_size)])
        errors = torch.stack([recv[r][:, -1].max() for r in range(self.world_size)])
        if float(errors.max()) > 0 and float(table[:, -1].sum()) == 0:
            table[:, -1] = 1.0  # a rank with no nodes failed
        return table.to(rows.device)

    def _apply(self, model: nn.Module, params: list[nn.Parameter], bns, widths,
               total: torch.Tensor, per_node: torch.Tensor) -> float:
        """Install the summed gradient and replay the batch-norm updates in node order.
        ``per_node`` holds every node's columns after the gradient block."""
        n_grad, n_params, n_stats, n_bn = widths
        has_grad = total[n_grad:n_grad + n_params].cpu().tolist()  # one device sync
        col = 0
        for j, p in enumerate(params):
            size = p.numel()
            p.grad = (total[col:col + size].view_as(p).to(p.dtype).clone()
                      if has_grad[j] > 0 else None)
            col += size
        stats = per_node[:, n_params:n_params + n_stats]
        seen = per_node[:, n_params + n_stats:n_params + n_stats + n_bn].cpu()
        apply_running_updates(bns, stats, seen)
        return float(total[-3])

    # -- heterogeneous shares --------------------------------------------------------------

    def _ensure_shares(self, model, loss_fn, inputs, targets, sizes) -> list[int]:
        current = self.shares()
        if current is not None:
            return current
        error = None
        try:
            speed = self._time_one_node(model, loss_fn, inputs, targets, sizes)
        except Exception as exc:  # every rank must still take part in the exchange below
            speed, error = -1.0, exc
        speeds = [speed]
        if self.distributed:
            mine = torch.tensor([speed], dtype=torch.float64, device=self.comm_device)
            out = [torch.empty_like(mine) for _ in range(self.world_size)]
            dist.all_gather(out, mine, group=self.group)
            speeds = [float(t) for t in out]
        if min(speeds) < 0:
            failed = [r for r, v in enumerate(speeds) if v < 0]
            raise TrialFailure(f"virtual nodes failed while measuring throughput on ranks {failed}"
                               + (f" (here: {error!r})" if error else "")) from error
        self.measured_speeds = speeds
        self._shares = shares_from_speed(self.virtual_nodes, speeds)
        return list(self._shares)

    def _time_one_node(self, model, loss_fn, inputs, targets, sizes, reps: int = 2) -> float:
        """Examples per second of one node's forward and backward on this rank."""
        if sizes[0] == 0:
            return 1.0
        return self.examples_per_second(model, loss_fn, inputs, targets, sizes[0], reps)

    def examples_per_second(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor,
                            targets: torch.Tensor, n: int, reps: int = 2) -> float:
        """Examples per second of the inner backend's forward and backward on the first
        ``n`` examples (after one warm-up pass), leaving no trace: buffers, random state and
        gradients are as they were."""
        bns = tracked_batchnorms(model)
        device = next(model.parameters()).device
        params = list(model.parameters())
        grads = [p.grad for p in params]  # kept aside: the passes accumulate into .grad
        for p in params:
            p.grad = None
        elapsed = 0.0
        with preserved_buffers(bns), num_threads(self.threads), self._seeded(0, device):
            for rep in range(reps + 1):
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                start = time.perf_counter()
                self.inner.forward_backward(model, loss_fn, inputs[:n], targets[:n])
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                if rep > 0:  # the first run warms caches up
                    elapsed += time.perf_counter() - start
        for p, g in zip(params, grads):
            p.grad = g
        return n * reps / max(elapsed, 1e-9)
