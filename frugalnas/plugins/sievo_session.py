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
from pathlib import Path
from typing import Any

import optuna
import torch
from torch import nn

from ..core.architecture import Architecture
from ..core.backend import Backend
from ..core.cost import count_flops
from ..core.data import Dataset
from ..core.errors import ConfigError
from ..search_spaces.dag import DagNetwork, DagSpace
from ..search_spaces.weight_store import WeightStore

CHECKPOINT_SUFFIX = ".sievo.pt"


def checkpoint_path(study: optuna.Study, checkpoint_dir: str | None = None) -> Path:
    """Where the weight store of ``study`` is saved: ``checkpoint_dir``, else a folder next to
    a sqlite storage file (``<db>-sievo/``), else a temporary folder."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study.study_name)
    if checkpoint_dir is not None:
        return Path(checkpoint_dir) / f"{safe}{CHECKPOINT_SUFFIX}"
    storage = study._storage
    url = getattr(getattr(storage, "_backend", storage), "url", None)
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
        if path is not None and path.exists():
            meta = self.store.load(path)
            self.trained_generation = int(meta.get("generation", -1))

    def network(self, arch: Architecture) -> nn.Module:
        """A network whose every module is the store's (shared ``nn.Parameter`` objects)."""
        return DagNetwork(self.space, arch, self.store.get)

    def flops_per_sample(self, arch: Architecture, sample: torch.Tensor) -> float:
        """Forward FLOPs per example (counted on two examples: batch statistics need two)."""
        if arch.key not in self._flops:
            self._flops[arch.key] = count_flops(self.network(arch), sample[:2]) / len(sample[:2])
        return self._flops[arch.key]

    def score(self, arch: Architecture, backend: Backend, x: torch.Tensor,
              y: torch.Tensor) -> tuple[float, float]:
        """Validation accuracy (%) with the stored weights, and the FLOPs that cost."""
        model = backend.prepare(self.network(arch))
        logits = backend.predict(model, x)
        acc = float((logits.argmax(1) == y).float().mean().item() * 100.0)
        return acc, self.flops_per_sample(arch, x) * len(x)

    def train(self, population: list[Architecture], dataset: Dataset, backend: Backend, *,
              generation: int, batches: int, batch_size: int, lr: float, momentum: float,
              weight_decay: float) -> dict[str, float]:
        """Sampled training: ``batches`` steps, each on one parent drawn at random from
        ``population``, through ``backend.train_step``. Returns loss, seconds and FLOPs."""
        start = time.perf_counter()
        rng = random.Random(self.seed * 7919 + generation)
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
                i = rng.randrange(len(models))
                models[i].train()
                loss = backend.train_step(models[i], optimizer, loss_fn, x, y, step)
                if math.isfinite(loss):
                    losses.append(loss)
                flops += 3.0 * flops_each[i] * len(x)
                step += 1
                if step >= batches:
                    break
            epoch += 1
        self.trained_generation = generation
        return {"loss": sum(losses[-20:]) / max(1, len(losses[-20:])),
                "seconds": time.perf_counter() - start, "flops": flops}

    def save(self, **meta: Any) -> None:
        if self.path is not None:
            self.store.save(self.path, generation=self.trained_generation, **meta)
