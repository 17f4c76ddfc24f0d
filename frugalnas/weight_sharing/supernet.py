"""Supernet: one weight store for a whole search space, trained once, read by every candidate.

A candidate's network is built by its space's shared builder (its ``WeightSharing`` capability's ``shared_builder``) from
modules of a :class:`~frugalnas.nn.weight_store.WeightStore`, so sub-networks *are*
views of the supernet: their parameters are the store's tensors. Training follows single-path
one-shot NAS (SPOS, Guo et al., ECCV 2020): each step trains one architecture drawn uniformly
from the space, so every operation is trained about equally often.

Few-shot NAS (Zhao et al., ICML 2021) splits the supernet on chosen decisions: after the
one-shot phase the store is copied into ``groups`` sub-supernets, each owning a block of the
split decisions' values, and training goes on with every architecture routed to its own
sub-supernet. Co-adaptation between operations that never appear together then stops.

With ``sandwich = n`` each step instead trains the space's largest network on the labels and
``n`` more on its predictions (BigNAS's sandwich rule with in-place distillation,
:mod:`frugalnas.weight_sharing.sandwich`): the smallest network and ``n - 1`` drawn ones, or
under progressive shrinking ``n`` drawn from the current phase.

Batch-norm statistics of a path differ from those accumulated over all paths, so every
evaluation first recalibrates them (running statistics reset, then averaged over a few
training batches); the result depends only on the architecture and the data.
"""

from __future__ import annotations

import ast
import contextlib
import copy
import dataclasses
import functools
import math
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import nn

from frugalnas.ports.capabilities import ProgressiveShrinking, WeightSharing, require_capability
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.backend import Backend
from frugalnas.ports.data import Dataset
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.space import SearchSpace
from frugalnas.engine.training import TrainConfig, backend_step, make_optimizer, run_steps
from frugalnas.engine.training import split_metric
from frugalnas.engine.training import train as train_model
from frugalnas.nn.weight_store import WeightStore
from frugalnas.weight_sharing.batch_norm import calibration_batches, recalibrated
from frugalnas.weight_sharing.sandwich import SandwichNetwork, sandwich_bounds, sandwich_loss

#: Bumped when the checkpoint layout changes.
CHECKPOINT_VERSION = 1


@dataclass(frozen=True)
class FewShotSplit:
    """Split on ``decisions`` into ``groups`` sub-supernets: the values of the split decisions
    (their product, in the space's order) are cut into ``groups`` contiguous blocks."""

    decisions: tuple[str, ...]
    groups: int

    @classmethod
    def create(cls, space: SearchSpace, decisions: Sequence[str] | str | None,
               groups: int | None) -> "FewShotSplit | None":
        if not decisions:
            if groups not in (None, 1):
                raise ConfigError(f"few_shot_groups {groups!r} needs few_shot_split (the "
                                  "decisions to split on)")
            return None
        decisions = (decisions,) if isinstance(decisions, str) else tuple(decisions)
        dists = space.distributions()
        for d in decisions:
            if d not in dists or not hasattr(dists[d], "choices"):
                raise ConfigError(f"invalid few_shot_split decision {d!r}; categorical decisions "
                                  f"of space {space.name!r}: {', '.join(k for k, v in dists.items() if hasattr(v, 'choices'))}")
        total = math.prod(len(dists[d].choices) for d in decisions)
        groups = total if groups is None else groups
        check_range("few_shot_groups", groups, 1, total)
        return cls(decisions, int(groups))

    def group_of(self, arch: Architecture, space: SearchSpace) -> int:
        dists = space.distributions()
        index, total = 0, 1
        for d in self.decisions:
            choices = dists[d].choices
            index = index * len(choices) + list(choices).index(arch[d])
            total *= len(choices)
        return index * self.groups // total


@dataclass
class SupernetHistory:
    """What training did: epochs per phase, mean loss per epoch, seconds."""

    one_shot_epochs: int = 0
    few_shot_epochs: int = 0
    losses: list[float] = field(default_factory=list)
    seconds: float = 0.0


class Supernet:
    """The weight store(s) of one space for one dataset shape, with SPOS training, few-shot
    splitting, BN recalibration and checkpoints.

    ``eager=False`` creates a module only when a network first asks for its key (SI-EvoNAS's
    store, whose size tells how much of the space was visited); callers that build one
    optimizer for the whole store must then create the keys they train first.
    ``checkpoint_meta`` holds the ``meta`` of the last checkpoint loaded."""

    def __init__(self, space: SearchSpace, num_classes: int, input_shape: tuple[int, ...],
                 sharing: str = "operation", seed: int = 0, few_shot: FewShotSplit | None = None,
                 *, eager: bool = True, progressive: bool = False, sandwich: int = 0):
        self.space, self.seed, self.few_shot = space, int(seed), few_shot
        self.bounds = sandwich_bounds(space, sandwich, few_shot=few_shot is not None)
        self.sandwich = int(sandwich)
        self.phases = require_capability(space, ProgressiveShrinking, "progressive shrinking").shrinking_phases() \
            if progressive else []
        self.builder = require_capability(space, WeightSharing, "a supernet").shared_builder(
            num_classes, input_shape, sharing)
        self.sharing, self.eager = sharing, bool(eager)
        self.stores: list[WeightStore] = [self._new_store()]
        self.history = SupernetHistory()
        self.checkpoint_meta: dict[str, Any] = {}

    def _new_store(self) -> WeightStore:
        store = WeightStore(self.builder.factory, seed=self.seed)
        if self.eager:
            for key in self.builder.keys():  # all modules exist before an optimizer is built
                store.get(key)
        return store

    @property
    def split(self) -> bool:
        return len(self.stores) > 1

    def store_for(self, arch: Architecture) -> WeightStore:
        if not self.split:
            return self.stores[0]
        return self.stores[self.few_shot.group_of(arch, self.space)]  # type: ignore[union-attr]

    def subnet(self, arch: Architecture) -> nn.Module:
        """The network of ``arch``, made of the supernet's own modules (no copy)."""
        return self.builder.subnet(arch, self.store_for(arch).get)

    def to(self, device: torch.device) -> "Supernet":
        for store in self.stores:
            store.to(device)
        return self

    def num_parameters(self) -> int:
        return sum(s.num_parameters() for s in self.stores)

    # -- training ------------------------------------------------------------------------
    def split_now(self) -> None:
        """Copy the one-shot store into ``few_shot.groups`` sub-supernets."""
        if self.few_shot is None or self.split:
            return
        state = self.stores[0].checkpoint()
        device = self.stores[0].device
        stores = []
        for _ in range(self.few_shot.groups):
            store = self._new_store()
            store.load_checkpoint(state)
            if device is not None:
                store.to(device)
            stores.append(store)
        self.stores = stores

    def train(self, dataset: Dataset, backend: Backend, cfg: TrainConfig, *, epochs: int,
              few_shot_epochs: int = 0,
              on_epoch: Callable[[int, float], None] | None = None) -> SupernetHistory:
        """SPOS training: ``epochs`` one-shot epochs, then (with a few-shot split)
        ``few_shot_epochs`` epochs with every architecture routed to its sub-supernet. Resumes
        from ``self.history``: epochs already done are skipped."""
        self.to(backend.device)
        start = time.perf_counter()
        per_epoch = math.ceil(dataset.num_examples("train") / cfg.batch_size)
        phases = [("one-shot", epochs), ("few-shot", few_shot_epochs if self.few_shot else 0)]
        for phase, n_epochs in phases:
            done = self.history.one_shot_epochs if phase == "one-shot" else self.history.few_shot_epochs
            if done >= n_epochs:
                continue
            if phase == "few-shot":
                self.split_now()
            self._train_phase(phase, dataset, backend, cfg, done=done, n_epochs=n_epochs,
                              per_epoch=per_epoch, on_epoch=on_epoch)
        self.history.seconds += time.perf_counter() - start
        return self.history

    def _train_phase(self, phase: str, dataset: Dataset, backend: Backend, cfg: TrainConfig, *,
                     done: int, n_epochs: int, per_epoch: int,
                     on_epoch: Callable[[int, float], None] | None) -> None:
        """Epochs ``done .. n_epochs - 1`` of ``phase``: every step trains one uniformly
        drawn architecture's sub-network (prepared by ``backend``, as every trained network
        is) in the sub-supernet it belongs to, under a cosine
        schedule over the phase's steps (all sub-supernets share the clock, and a resumed
        phase continues it from its step)."""
        optimizers = [make_optimizer(store, cfg) for store in self.stores]
        total = n_epochs * per_epoch
        draws: dict[int, random.Random] = {}

        def draw(epoch: int, rng: random.Random) -> Architecture:
            if self.phases and phase == "one-shot":  # progressive shrinking
                return self.phases[min(len(self.phases) - 1,
                                       epoch * len(self.phases) // max(1, n_epochs))][1](rng)
            return self.space.sample(rng)

        def pick(step: int) -> tuple[nn.Module, torch.optim.Optimizer]:
            epoch = step // per_epoch
            rng = draws.setdefault(epoch, random.Random(f"spos:{self.seed}:{phase}:{epoch}"))
            net: nn.Module
            if self.bounds is not None:
                largest, smallest = self.bounds
                students = [draw(epoch, rng) for _ in range(self.sandwich)] if self.phases \
                    else [smallest, *(draw(epoch, rng) for _ in range(self.sandwich - 1))]
                # the phase of the largest network alone has nothing to distil into
                net = SandwichNetwork([self.subnet(a) for a in
                                       (largest, *(s for s in students if s != largest))])
                arch = largest
            else:
                arch = draw(epoch, rng)
                net = self.subnet(arch)
            index = self.stores.index(self.store_for(arch))
            for group in optimizers[index].param_groups:
                group["lr"] = 0.5 * cfg.lr * (1 + math.cos(math.pi * min(step, total) / total))
            return backend.prepare(net), optimizers[index]

        def each_epoch(epoch: int, losses: list[float]) -> None:
            mean = sum(losses) / len(losses)
            self.history.losses.append(mean)
            if phase == "one-shot":
                self.history.one_shot_epochs = epoch + 1
            else:
                self.history.few_shot_epochs = epoch + 1
            if on_epoch is not None:
                on_epoch(len(self.history.losses), mean)

        run_steps(lambda epoch: dataset.batches("train", cfg.batch_size, seed=self.seed,
                                                epoch=epoch),
                  backend_step(backend, pick, loss_fn=functools.partial(sandwich_loss, task=dataset.task)
                               if self.bounds else dataset.task),
                  total_steps=total - done * per_epoch,
                  steps_per_epoch=per_epoch, first_step=done * per_epoch, first_epoch=done,
                  on_epoch=each_epoch, what=f"supernet {phase}")

    # -- evaluation ----------------------------------------------------------------------
    def finetuned(self, arch: Architecture, dataset: Dataset, backend: Backend, steps: int,
                  cfg: TrainConfig) -> nn.Module:
        """A private copy of ``arch``'s sub-network trained ``steps`` SGD steps further (a
        cosine schedule from ``cfg.lr``) on a fixed draw of training batches, the same for
        every candidate; the supernet is left unchanged."""
        model = copy.deepcopy(self.subnet(arch)).to(backend.device)
        per_epoch = max(1, math.ceil(dataset.num_examples("train") / cfg.batch_size))  # 0: train refuses
        train_model(model, dataset, backend, dataclasses.replace(
            cfg, epochs=math.ceil(steps / per_epoch), max_steps=steps), seed=self.seed + 2)
        return model

    def accuracy(self, arch: Architecture, dataset: Dataset, backend: Backend, *,
                 bn_batches: int = 4, batch_size: int = 64, split: str = "valid",
                 finetune_steps: int = 0, finetune: TrainConfig | None = None) -> float:
        """The task's metric (top-1 accuracy in % for image classes, the loss in nats per
        token for a language model) of ``arch`` with inherited weights on ``split``, its batch norms
        recalibrated for it alone on ``bn_batches`` fixed training batches (0: none, the
        store's statistics: running ones where kept, else the batch's own). With
        ``finetune_steps``, a private copy is first trained that many steps (see
        :meth:`finetuned`; ``finetune`` holds its SGD settings)."""
        model = (self.finetuned(arch, dataset, backend, finetune_steps,
                                finetune or TrainConfig(batch_size=batch_size))
                 if finetune_steps > 0 else self.subnet(arch))
        batches = calibration_batches(dataset, bn_batches, batch_size, seed=self.seed + 1,
                                      epoch=0, device=backend.device)
        with recalibrated(model, batches) if batches else contextlib.nullcontext():
            return split_metric(model, backend, dataset, split)

    # -- checkpoints ---------------------------------------------------------------------
    def describe(self) -> dict[str, Any]:
        """Plain values that must match for a checkpoint to be reused."""
        out = {"version": CHECKPOINT_VERSION, "space": self.space.describe(),
               "sharing": self.sharing, "seed": self.seed,
               "few_shot": None if self.few_shot is None else
               [list(self.few_shot.decisions), self.few_shot.groups]}
        if self.phases:   # only then, so checkpoints without progressive shrinking still match
            out["progressive"] = [name for name, _ in self.phases]
        if self.sandwich:
            out["sandwich"] = self.sandwich
        return out

    def save(self, path: str | Path, **meta: Any) -> None:
        """Write the stores and the training history atomically."""
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        data = {"describe": repr(self.describe()),
                "stores": [s.checkpoint() for s in self.stores],
                "history": {"one_shot_epochs": self.history.one_shot_epochs,
                            "few_shot_epochs": self.history.few_shot_epochs,
                            "losses": list(self.history.losses),
                            "seconds": self.history.seconds},
                "meta": repr(meta)}
        tmp = path.with_suffix(path.suffix + ".tmp")
        torch.save(data, tmp)
        tmp.replace(path)

    def load(self, path: str | Path) -> bool:
        """Load a checkpoint written for the same supernet; ``False`` if it is for another."""
        return self.load_state(torch.load(Path(path), map_location="cpu", weights_only=True))

    def load_state(self, data: dict[str, Any]) -> bool:
        """:meth:`load` from the checkpoint's contents (as ``torch.load`` returns them)."""
        if data.get("describe") != repr(self.describe()):
            return False
        stores = []
        for state in data["stores"]:
            store = self._new_store()
            store.load_checkpoint(state)
            stores.append(store)
        self.stores = stores
        h = data["history"]
        self.history = SupernetHistory(int(h["one_shot_epochs"]), int(h["few_shot_epochs"]),
                                       [float(v) for v in h["losses"]], float(h["seconds"]))
        try:
            meta = ast.literal_eval(data.get("meta", "{}"))
        except (ValueError, SyntaxError):  # a value without a literal repr (e.g. nan)
            meta = {}
        self.checkpoint_meta = dict(meta) if isinstance(meta, dict) else {}
        return True
