"""The shared-weight side of SI-EvoNAS: a DAG weight store, its sampled training and its
checkpoint file, for one study."""

from __future__ import annotations

import math
import os
import random
import re
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import torch
from torch import nn

from frugalnas.core import optuna_compat
from frugalnas.core.architecture import Architecture
from frugalnas.core.backend import Backend
from frugalnas.core.cost import count_flops
from frugalnas.core.data import Dataset
from frugalnas.core.errors import ConfigError
from frugalnas.spaces.dag.space import DagNetwork, DagSpace
from frugalnas.spaces.dag.ops import recalibrated_bn
from frugalnas.spaces.dag.weight_store import Key, WeightStore

CHECKPOINT_SUFFIX = ".sievo.pt"


def checkpoint_path(study: optuna.Study, checkpoint_dir: str | None = None) -> Path:
    """Where the weight store of ``study`` is saved: ``checkpoint_dir``, else a folder next to
    a sqlite storage file (``<db>-sievo/``), else a temporary folder."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study.study_name)
    if checkpoint_dir is not None:
        return Path(checkpoint_dir) / f"{safe}{CHECKPOINT_SUFFIX}"
    url = optuna_compat.storage_url(study)
    if isinstance(url, str) and url.startswith("sqlite:///") and ":memory:" not in url:
        db = Path(url[len("sqlite:///"):])
        return db.parent / f"{db.stem}-sievo" / f"{safe}{CHECKPOINT_SUFFIX}"
    folder = Path(tempfile.gettempdir()) / "frugalnas-sievo"
    if url is None:  # in-memory: nothing to resume, keep processes apart
        folder = folder / str(os.getpid())
    return folder / f"{safe}{CHECKPOINT_SUFFIX}"


class SievoSession:
    """A weight store for one study and data shape, with sampled training, inherited-weight
    scoring and checkpointing. ``trained_generation`` is the last generation trained."""

    def __init__(self, space: DagSpace, dataset: Dataset, path: Path | None, seed: int = 0):
        if not isinstance(space, DagSpace):
            raise ConfigError(f"shared-weight estimation needs the 'dag' search space, got "
                              f"{getattr(space, 'name', space)!r}")
        self.space, self.path, self.seed = space, path, seed
        self.macro = space.macro(dataset.num_classes, dataset.input_shape, shared=True)
        self.store = WeightStore(self.macro.make, seed=seed)
        self.trained_generation = -1
        self.lock = threading.RLock()
        self._flops: dict[str, float] = {}
        self._flops_of_key: dict[Key, float] = {}
        self._input_shapes: dict[tuple[str, int], tuple[int, ...]] = {}
        if path is not None and path.exists():
            meta = self.store.load(path)
            self.trained_generation = int(meta.get("generation", -1))

    def network(self, arch: Architecture) -> nn.Module:
        """A network whose every module is the store's (shared ``nn.Parameter`` objects)."""
        return DagNetwork(self.space, arch, self.store.get)

    def flops_per_sample(self, arch: Architecture, sample: torch.Tensor) -> float:
        """Forward FLOPs per example: the sum of the FLOPs of the modules the network calls
        (every counted operation, convolutions and linear layers, sits in a store module, so
        this equals counting the whole network), each key counted once on two examples."""
        if arch.key not in self._flops:
            self._flops[arch.key] = sum(self._key_flops(k, sample) for k in self.macro.arch_keys(arch))
        return self._flops[arch.key]

    def _key_flops(self, key: Key, sample: torch.Tensor) -> float:
        if key not in self._flops_of_key:
            if not self._input_shapes:
                self._trace_shapes(sample[:2])
            kind = key[0]
            if kind == "stem":
                shape = tuple(sample.shape[1:])
            elif kind == "head":
                shape = (self.macro.out_channels,)
            elif kind == "final":  # the last cell's output
                last = self._input_shapes[("node", len(self.macro.cells) - 1)]
                shape = (self.macro.out_channels, *last[1:])
            elif kind in ("pre0", "pre1"):
                shape = self._input_shapes[(kind, key[1])]
            elif kind == "edge" and int(key[4]) < 2:
                shape = self._input_shapes[("state", key[1])]
            else:
                shape = self._input_shapes[("node", key[1])]
            module = self.store.get(key)
            x = torch.zeros(2, *shape, device=next(module.parameters(), sample).device)
            self._flops_of_key[key] = count_flops(module, x) / 2
        return self._flops_of_key[key]

    def _trace_shapes(self, x: torch.Tensor) -> None:
        """Input shapes of every kind of module, from one forward of some candidate."""
        net = self.network(self.space.sample(random.Random(0)))
        shapes, hooks = self._input_shapes, []
        for i, cell in enumerate(net.cells):
            def pre(module, inputs, output, i=i, name="pre0"):
                shapes[(name, i)] = tuple(inputs[0].shape[1:])
                shapes[("state", i)] = tuple(output.shape[1:])
            hooks.append(cell.pre0.register_forward_hook(pre))
            hooks.append(cell.pre1.register_forward_hook(
                lambda m, inp, out, i=i: shapes.__setitem__(("pre1", i), tuple(inp[0].shape[1:]))))
            c = self.macro.cells[i]["c"]
            hooks.append(cell.register_forward_hook(
                lambda m, inp, out, i=i, c=c: shapes.__setitem__(("node", i), (c, *out.shape[2:]))))
        try:
            with torch.no_grad():
                net.eval()
                net(x.to(next(net.parameters()).device))
        finally:
            for h in hooks:
                h.remove()

    def calibration_batches(self, dataset: Dataset, batches: int,
                            batch_size: int) -> list[torch.Tensor]:
        """The first ``batches`` training batches of a fixed shuffle: every candidate's batch
        norm is recalibrated on the same examples."""
        out = []
        for x, _ in dataset.batches("train", batch_size, seed=self.seed, epoch=-1):
            if len(out) >= batches:
                break
            out.append(x)
        return out

    def score(self, arch: Architecture, backend: Backend, x: torch.Tensor, y: torch.Tensor,
              calibration: list[torch.Tensor] | None = None) -> tuple[float, float]:
        """Validation accuracy (%) with the stored weights, and the FLOPs that cost. With
        ``calibration`` batches, batch norm is first recalibrated for this candidate alone
        (see :func:`recalibrated_bn`); without, it normalises with the validation batches."""
        model = backend.prepare(self.network(arch))
        seen = 0
        if calibration:
            with recalibrated_bn(model, [b.to(backend.device) for b in calibration]) as seen:
                logits = backend.predict(model, x)
        else:
            logits = backend.predict(model, x)
        acc = float((logits.argmax(1) == y).float().mean().item() * 100.0)
        return acc, self.flops_per_sample(arch, x) * (len(x) + seen)

    def train(self, population: list[Architecture] | Callable[[random.Random], Architecture],
              dataset: Dataset, backend: Backend, *, generation: int, batches: int,
              batch_size: int, lr: float, momentum: float,
              weight_decay: float) -> dict[str, float]:
        """Sampled training: ``batches`` steps, each on one parent drawn at random from
        ``population``, through ``backend.train_step``. ``population`` may instead be a
        function ``rng -> architecture`` drawing a new candidate for every step (the warm-up:
        every key of the space is created first, so all can train). Returns loss, seconds,
        FLOPs and the number of steps."""
        start = time.perf_counter()
        rng = random.Random(self.seed * 7919 + generation)
        warmup = callable(population)
        if warmup:
            draw = population
            for key in self.macro.all_keys():
                self.store.get(key)
            models, flops_each = [], []
        else:
            models = [backend.prepare(self.network(a)) for a in population]
            flops_each = [self.flops_per_sample(a, dataset.train_x) for a in population]
        params = [p for p in self.store.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        loss_fn = nn.CrossEntropyLoss()
        losses: list[float] = []
        flops, step, epoch = 0.0, 0, 0
        drop_last = len(dataset.train_y) > batch_size  # batch statistics need > 1 example
        while step < batches:
            for x, y in dataset.batches("train", batch_size, seed=self.seed,
                                        epoch=generation * 10_007 + epoch, drop_last=drop_last):
                if not warmup:
                    i = rng.randrange(len(models))
                    model, per_sample = models[i], flops_each[i]
                else:
                    arch = draw(rng)
                    model = backend.prepare(self.network(arch))
                    per_sample = self.flops_per_sample(arch, dataset.train_x)
                model.train()
                loss = backend.train_step(model, optimizer, loss_fn, x, y, step)
                if math.isfinite(loss):
                    losses.append(loss)
                flops += 3.0 * per_sample * len(x)
                step += 1
                if step >= batches:
                    break
            epoch += 1
        if not warmup:
            self.trained_generation = generation
        return {"loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
                "seconds": time.perf_counter() - start, "flops": flops, "steps": step}

    def save(self, **meta: Any) -> None:
        if self.path is not None:
            self.store.save(self.path, generation=self.trained_generation, **meta)
