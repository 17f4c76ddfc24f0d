"""The shared-weight side of SI-EvoNAS: a :class:`~frugalnas.weight_sharing.supernet.Supernet`,
its sampled training, inherited-weight scoring and its checkpoint file, for one study.

The supernet is the one :mod:`frugalnas.weight_sharing` trains with SPOS, built with
``sharing="operation"`` and ``eager=False``: a module is created when a network first asks
for its key, so the store grows with the part of the space the search visits. On the ``dag``
space its keys are those of :class:`~frugalnas.spaces.dag.space.DagMacro`; any space with a
``WeightSharing`` capability (NB201 built in) works the same way.

Checkpoints are :meth:`Supernet.save` files with ``meta`` ``{"generation": ..., ...}``. A file
of the layout used before (a bare :class:`WeightStore` checkpoint: ``keys``, ``state``,
``meta``) is migrated: its tensors are loaded, and the next save writes the new layout.
"""

from __future__ import annotations

import ast
import math
import random
import re
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import optuna
import torch
from torch import nn

from frugalnas.ports.capabilities import WeightSharing, supports
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.backend import Backend
from frugalnas.ports.cost import count_flops
from frugalnas.ports.data import Dataset
from frugalnas.ports.errors import ConfigError
from frugalnas.engine.training import TrainReport, backend_step, run_steps
from frugalnas.ports.space import SearchSpace
from frugalnas.engine.trial_context import study_artifact_dir
from frugalnas.spaces.dag.space import DagSpace
from frugalnas.nn.weight_store import Key, WeightStore
from frugalnas.weight_sharing.batch_norm import calibration_batches, recalibrated
from frugalnas.weight_sharing.supernet import Supernet

CHECKPOINT_SUFFIX = ".sievo.pt"


def checkpoint_file(folder: Path | str, study_name: str) -> Path:
    """The weight-store file of study ``study_name`` in ``folder``."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", study_name)
    return Path(folder) / f"{safe}{CHECKPOINT_SUFFIX}"


def checkpoint_path(study: optuna.Study, checkpoint_dir: str | None = None) -> Path:
    """Where the weight store of ``study`` is saved: ``checkpoint_dir``, else a folder next to
    a sqlite storage file (``<db>-sievo/``), else a temporary folder (the study's
    ``artifact_dir("sievo")``, which the ``inherited`` estimator asks its context for)."""
    folder = checkpoint_dir if checkpoint_dir is not None else study_artifact_dir(study, "sievo")
    return checkpoint_file(folder, study.study_name)


def _differing(saved: str, wanted: dict[str, Any]) -> list[str]:
    """The fields of a supernet description that differ from the saved one (its repr)."""
    try:
        old = ast.literal_eval(saved)
    except (ValueError, SyntaxError):
        return ["the description"]
    return [k for k in wanted if not isinstance(old, dict) or old.get(k) != wanted[k]] or ["layout"]


def supports_weight_sharing(space: Any) -> bool:
    """Whether ``space`` declares weight sharing (a :class:`WeightSharing` capability)."""
    return isinstance(space, SearchSpace) and supports(space, WeightSharing)


def check_weight_sharing(space: Any, what: str = "estimator 'inherited'") -> None:
    """Raise :class:`ConfigError` unless ``space`` supports weight sharing."""
    if not supports_weight_sharing(space):
        name = space.name if isinstance(space, SearchSpace) else space
        raise ConfigError(f"{what} needs a search space with weight sharing (a "
                          f"WeightSharing capability); space {name!r} has none; "
                          "built-in spaces that have one: nb201, dag, mobilenet")


class SievoSession:
    """A supernet for one study and data shape, with sampled training, inherited-weight
    scoring and checkpointing. ``trained_generation`` is the last generation trained;
    ``candidate_steps`` counts the steps of per-candidate training (:meth:`train_candidate`)."""

    def __init__(self, space: Any, dataset: Dataset, path: Path | None, seed: int = 0):
        check_weight_sharing(space)
        self.space, self.path, self.seed = space, path, seed
        self.supernet = Supernet(space, dataset.num_classes, dataset.input_shape, "operation",
                                 seed=seed, eager=False)
        self.trained_generation = -1
        self.candidate_steps = 0
        self.lock = threading.RLock()
        self._flops: dict[str, float] = {}
        self._flops_of_key: dict[Key, float] = {}
        self._input_shapes: dict[tuple[str, int], tuple[int, ...]] = {}
        if path is not None and path.exists():
            meta = self._load(path)
            self.trained_generation = int(meta.get("generation", -1))
            self.candidate_steps = int(meta.get("candidate_steps", 0))

    @property
    def store(self) -> WeightStore:
        """The supernet's (only) weight store."""
        return self.supernet.stores[0]

    @property
    def macro(self) -> Any:
        """The ``dag`` space's macro skeleton (keys and channels); only for ``dag``."""
        return self.supernet.builder.macro

    def _load(self, path: Path) -> dict[str, Any]:
        data = torch.load(path, map_location="cpu", weights_only=True)
        if "describe" in data:
            if not self.supernet.load_state(data):
                raise ConfigError(
                    f"checkpoint {path} holds the weights of another supernet (differing: "
                    f"{', '.join(_differing(data['describe'], self.supernet.describe()))}); "
                    "delete the file or give the estimator another checkpoint_dir")
            return self.supernet.checkpoint_meta
        if "keys" in data and "state" in data:  # the bare WeightStore layout used before
            return self.store.load_checkpoint(data)
        raise ConfigError(f"checkpoint {path} is not a weight-store checkpoint (entries: "
                          f"{', '.join(map(str, data))})")

    def network(self, arch: Architecture) -> nn.Module:
        """A network whose every module is the store's (shared ``nn.Parameter`` objects)."""
        return self.supernet.subnet(arch)

    def flops_per_sample(self, arch: Architecture, sample: torch.Tensor) -> float:
        """Forward FLOPs per example: the sum of the FLOPs of the modules the network calls
        (every counted operation, convolutions and linear layers, sits in a store module, so
        this equals counting the whole network), each key counted once on two examples.
        Outside the ``dag`` space the network is counted as a whole (on two examples)."""
        if arch.key not in self._flops and not isinstance(self.space, DagSpace):
            net = self.network(arch)
            device = next(net.parameters(), sample).device
            self._flops[arch.key] = count_flops(net, sample[:2].to(device)) / 2
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
        """Input shapes of every kind of module, from one forward of some candidate on the CPU.
        The probe network has modules of its own (made under a forked RNG), so the store gains
        no keys and none of its modules, which may sit on several devices, is called. The
        shapes are kept only when the whole forward succeeded."""
        local: dict[Key, nn.Module] = {}

        def make(key: Key) -> nn.Module:
            if key not in local:
                local[key] = self.supernet.builder.factory(key)
            return local[key]

        with torch.random.fork_rng(devices=[]):
            net = self.supernet.builder.subnet(self.space.sample(random.Random(0)), make)
        shapes: dict[tuple[str, int], tuple[int, ...]] = {}
        hooks = []
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
                net(x.detach().cpu())
        finally:
            for h in hooks:
                h.remove()
        self._input_shapes.update(shapes)

    def calibration_batches(self, dataset: Dataset, batches: int,
                            batch_size: int) -> list[torch.Tensor]:
        """The first ``batches`` training batches of a fixed shuffle: every candidate's batch
        norm is recalibrated on the same examples."""
        return calibration_batches(dataset, batches, batch_size, seed=self.seed, epoch=-1)

    def score(self, arch: Architecture, backend: Backend, x: torch.Tensor, y: torch.Tensor,
              calibration: list[torch.Tensor] | None = None) -> tuple[float, float]:
        """Validation accuracy (%) with the stored weights, and the FLOPs that cost. With
        ``calibration`` batches, batch norm is first recalibrated for this candidate alone
        (see :func:`recalibrated`); without, shared batch norms normalise with the validation
        batches and ordinary ones with their running statistics."""
        model = backend.prepare(self.network(arch))
        seen = 0
        if calibration:
            with recalibrated(model, [b.to(backend.device) for b in calibration]) as seen:
                logits = backend.predict(model, x)
        else:
            logits = backend.predict(model, x)
        acc = float((logits.argmax(1) == y).float().mean().item() * 100.0)
        return acc, self.flops_per_sample(arch, x) * (len(x) + seen)

    def train(self, population: list[Architecture] | Callable[[random.Random], Architecture],
              dataset: Dataset, backend: Backend, *, generation: int, batches: int,
              batch_size: int, lr: float, momentum: float,
              weight_decay: float) -> TrainReport:
        """Sampled training: ``batches`` steps, each on one parent drawn at random from
        ``population``, through ``backend.train_step``. ``population`` may instead be a
        function ``rng -> architecture`` drawing a new candidate for every step (the warm-up:
        every key of the space is created first, so all can train). The report counts the
        training FLOPs (three forward passes' worth a sample)."""
        info = self._sampled_training(population, dataset, backend, stream=generation,
                                      batches=batches, batch_size=batch_size, lr=lr,
                                      momentum=momentum, weight_decay=weight_decay)
        if not callable(population):
            self.trained_generation = generation
        return info

    def train_candidate(self, arch: Architecture, dataset: Dataset, backend: Backend, *,
                        trial: int, steps: int, batch_size: int, lr: float, momentum: float,
                        weight_decay: float) -> TrainReport:
        """``steps`` steps of sampled training on ``arch`` alone, on a batch order drawn for
        ``trial`` (a fresh SGD each call, so momentum restarts). Same return as :meth:`train`."""
        info = self._sampled_training([arch], dataset, backend, stream=trial, batches=steps,
                                      batch_size=batch_size, lr=lr, momentum=momentum,
                                      weight_decay=weight_decay)
        self.candidate_steps += info.steps
        return info

    def _sampled_training(self, population: list[Architecture] | Callable[[random.Random], Architecture],
                          dataset: Dataset, backend: Backend, *, stream: int, batches: int,
                          batch_size: int, lr: float, momentum: float,
                          weight_decay: float) -> TrainReport:
        rng = random.Random(self.seed * 7919 + stream)
        warmup = callable(population)
        if warmup:
            draw = population
            for key in self.supernet.builder.keys():
                self.store.get(key)
            models, flops_each = [], []
        else:
            models = [backend.prepare(self.network(a)) for a in population]
            sample = dataset.head("train", 2)[0]
            flops_each = [self.flops_per_sample(a, sample) for a in population]
        params = [p for p in self.store.parameters() if p.requires_grad]
        optimizer = torch.optim.SGD(params, lr=lr, momentum=momentum, weight_decay=weight_decay)
        flops = [0.0]
        # Batch statistics need > 1 example: with more than a batch every batch is full,
        # else the one batch is the whole split.
        n_train = dataset.num_examples("train")
        drop_last = n_train > batch_size

        def pick(step: int) -> tuple[nn.Module, torch.optim.Optimizer]:
            if not warmup:
                i = rng.randrange(len(models))
                model, per_sample = models[i], flops_each[i]
            else:
                arch = draw(rng)
                model = backend.prepare(self.network(arch))
                per_sample = self.flops_per_sample(arch, dataset.head("train", 2)[0])
            flops[0] += 3.0 * per_sample * min(batch_size, n_train)
            return model, optimizer

        per_epoch = max(1, n_train // batch_size if drop_last
                        else math.ceil(n_train / batch_size))
        report = run_steps(
            lambda epoch: dataset.batches("train", batch_size, seed=self.seed,
                                          epoch=stream * 10_007 + epoch, drop_last=drop_last),
            backend_step(backend, pick), total_steps=batches, steps_per_epoch=per_epoch,
            what="sampled training")
        report.flops = flops[0]
        return report

    def save(self, **meta: Any) -> None:
        """Write the supernet to ``path`` (nothing without one), with the generation trained
        and the per-candidate steps in its ``meta``."""
        if self.path is not None:
            self.supernet.save(self.path, generation=self.trained_generation,
                               candidate_steps=self.candidate_steps, **meta)
