"""First-order differentiable search (DARTS, Liu et al., ICLR 2019) over a shared weight store.

Every edge outputs the softmax(alpha)-weighted mix of all its operations (the space's
``shared_builder(...).mixed``). Training alternates a weight step on a training batch with an
alpha step on a validation batch (first-order: the weight gradient ignores how alpha moves the
optimum, Liu et al.'s cheaper variant). The architecture is read off the mixing weights: the
strongest operation of every edge.

The ``darts`` strategy runs the search the first time it is asked for a candidate (on the
study's dataset and backend, every epoch reported to the study) and then proposes the
architecture read off alpha, followed by draws from softmax(alpha) not yet evaluated, so the
study's estimator (usually ``train``) checks the search's choice and its close alternatives.
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch
from optuna.trial import FrozenTrial
from torch import nn

from frugalnas.ports.capabilities import (DartsRelaxation, WeightSharing, capability,
                                          require_capability)
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.backend import Backend
from frugalnas.ports.data import Dataset
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.engine.training import run_steps
from frugalnas.ports.network import Relaxation, RelaxedBuilder
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.strategy import StrategyServices
from frugalnas.nn.weight_store import WeightStore
from frugalnas.strategies.base import ArchSampler
from frugalnas.strategies.history import History


@dataclass
class DartsResult:
    """Mixing weights per decision (rows) and choice (columns), the architecture read off
    them, and the per-epoch record."""

    alphas: torch.Tensor
    architecture: Architecture
    train_losses: list[float] = field(default_factory=list)
    valid_accuracies: list[float] = field(default_factory=list)
    seconds: float = 0.0
    initial_alphas: torch.Tensor | None = None


def decisions_of(space: SearchSpace) -> tuple[list[str], list[tuple[Any, ...]]]:
    """The space's categorical decisions and their choices (DARTS needs every decision
    categorical with the same number of choices, as in cell spaces)."""
    names, choices = [], []
    for name, dist in space.distributions().items():
        if not hasattr(dist, "choices"):
            raise ConfigError(f"DARTS needs categorical decisions; {name!r} of space "
                              f"{space.name!r} is {type(dist).__name__}")
        names.append(name)
        choices.append(tuple(dist.choices))
    if len({len(c) for c in choices}) != 1:
        raise ConfigError(f"DARTS needs the same number of choices for every decision of "
                          f"space {space.name!r}")
    return names, choices


def read_architecture(space: SearchSpace, alphas: torch.Tensor) -> Architecture:
    """The architecture DARTS reads off ``alphas`` for ``space``."""
    return relaxation_of(space).read(alphas)


class DecisionRelaxation:
    """DARTS's relaxation of a cell space whose decisions are all categorical with the same
    number of choices (NB201: one decision per edge): one row of mixing weights per decision,
    the network from the space's shared builder's ``mixed``; the strongest choice of every
    decision is read off."""

    def __init__(self, space: SearchSpace):
        self.space = space
        self.names, self.choices = decisions_of(space)
        self.shape = (len(self.names), len(self.choices[0]))

    def weights(self, alphas: torch.Tensor) -> torch.Tensor:
        return torch.softmax(alphas, dim=-1)

    def network(self, builder: Any, get: Callable[[Any], nn.Module],
                alphas: torch.Tensor) -> nn.Module:
        if not isinstance(builder, RelaxedBuilder):
            raise ConfigError(f"space {self.space.name!r} has no relaxed (mixed) network for DARTS")
        return builder.mixed(get, alphas)

    def read(self, alphas: torch.Tensor) -> Architecture:
        picks = alphas.argmax(dim=1).tolist()
        return self.space.from_params({n: c[i] for n, c, i in zip(self.names, self.choices, picks)})

    def sample(self, alphas: torch.Tensor, rng: random.Random) -> Architecture:
        probs = self.weights(alphas).tolist()
        return self.space.from_params({n: rng.choices(c, weights=p)[0]
                                       for n, c, p in zip(self.names, self.choices, probs)})


def relaxation_of(space: SearchSpace) -> Relaxation:
    """The space's own relaxation (its :class:`~frugalnas.ports.capabilities.DartsRelaxation`,
    e.g. the ``dag`` space's, which mixes inputs too), else :class:`DecisionRelaxation`;
    ConfigError when neither fits."""
    own = capability(space, DartsRelaxation)
    return own if own is not None else DecisionRelaxation(space)


def darts_search(space: SearchSpace, dataset: Dataset, backend: Backend, *, epochs: int = 10,
                 batch_size: int = 64, lr: float = 0.025, momentum: float = 0.9,
                 weight_decay: float = 3e-4, alpha_lr: float = 3e-4,
                 alpha_weight_decay: float = 1e-3, seed: int = 0,
                 on_epoch: Callable[[int, float, float], None] | None = None) -> DartsResult:
    """Run first-order DARTS; optimiser settings default to Liu et al.'s CIFAR-10 ones."""
    check_range("epochs", epochs, 1)
    relaxation = relaxation_of(space)
    torch.manual_seed(seed)
    builder = require_capability(space, WeightSharing, "darts").shared_builder(
        dataset.num_classes, dataset.input_shape, "operation")
    store = WeightStore(builder.factory, seed=seed)
    for key in builder.keys():
        store.get(key)
    store.to(backend.device)
    alphas = (1e-3 * torch.randn(*relaxation.shape)).to(backend.device).requires_grad_()
    model = relaxation.network(builder, store.get, alphas)
    w_opt = torch.optim.SGD(store.parameters(), lr=lr, momentum=momentum,
                            weight_decay=weight_decay)
    a_opt = torch.optim.Adam([alphas], lr=alpha_lr, betas=(0.5, 0.999),
                             weight_decay=alpha_weight_decay)
    per_epoch = math.ceil(dataset.num_examples("train") / batch_size)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(w_opt, T_max=epochs * per_epoch)
    loss_fn = nn.CrossEntropyLoss()
    result = DartsResult(alphas, relaxation.read(alphas.detach().cpu()),
                         initial_alphas=alphas.detach().cpu().clone())
    valid: dict[int, Iterator[tuple[torch.Tensor, torch.Tensor]]] = {}

    def valid_batch(epoch: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The next validation batch of ``epoch`` (a second order of the split once the
        first runs out)."""
        if epoch not in valid:
            valid.clear()
            valid[epoch] = dataset.batches("valid", batch_size, seed=seed, epoch=epoch)
        try:
            return next(valid[epoch])
        except StopIteration:
            valid[epoch] = dataset.batches("valid", batch_size, seed=seed + 1, epoch=epoch)
            return next(valid[epoch])

    def step(index: int, x: torch.Tensor, y: torch.Tensor) -> float:
        """First-order DARTS: a mixing-weight step on a validation batch, then a weight step
        on the training batch (gradients clipped at 5)."""
        vx, vy = valid_batch(index // per_epoch)
        model.train()
        a_opt.zero_grad(set_to_none=True)
        loss_fn(model(vx.to(backend.device)), vy.to(backend.device)).backward()
        a_opt.step()
        w_opt.zero_grad(set_to_none=True)
        alphas.grad = None
        loss = loss_fn(model(x.to(backend.device)), y.to(backend.device))
        loss.backward()
        nn.utils.clip_grad_norm_(store.parameters(), 5.0)
        w_opt.step()
        schedule.step()
        return float(loss.detach())

    def each_epoch(epoch: int, losses: list[float]) -> None:
        parts = [(backend.predict(model, x), y) for x, y in dataset.eval_batches("valid")]
        logits, valid_y = torch.cat([p[0] for p in parts]), torch.cat([p[1] for p in parts])
        acc = float((logits.argmax(1) == valid_y).float().mean() * 100)
        result.train_losses.append(sum(losses) / len(losses))
        result.valid_accuracies.append(acc)
        if on_epoch is not None:
            on_epoch(epoch + 1, result.train_losses[-1], acc)

    report = run_steps(lambda epoch: dataset.batches("train", batch_size, seed=seed, epoch=epoch),
                       step, total_steps=epochs * per_epoch, steps_per_epoch=per_epoch,
                       on_epoch=each_epoch, what="DARTS")
    result.seconds = report.seconds
    result.alphas = alphas.detach().cpu()
    result.architecture = relaxation.read(result.alphas)
    return result


class DartsSampler(ArchSampler):
    """Strategy ``darts``: proposes the architecture first-order DARTS reads off its mixing
    weights, then draws from softmax(alpha) it has not proposed. The search runs once, on the
    study's dataset and backend, when the first candidate is asked for; ``checkpoint`` keeps
    its result (the mixing weights) so a resumed study does not search again."""

    fixed_options = ("n_init", "warm_start_proxy", "warm_start_pool", "warm_start_options",
                     "constraint_model", "feasibility_threshold", "screen_size",
                     "violation_penalty", "bridge_infeasible")

    def __init__(self, space: SearchSpace, seed: int = 0, epochs: int = 10, batch_size: int = 64,
                 lr: float = 0.025, alpha_lr: float = 3e-4, checkpoint: str | None = None,
                 host: Any = None):
        super().__init__(space, seed=seed, n_init=1, host=host)
        check_range("epochs", epochs, 1)
        self.relaxation = relaxation_of(space)  # refuse a space DARTS cannot relax now
        self.epochs, self.batch_size, self.lr, self.alpha_lr = int(epochs), int(batch_size), lr, alpha_lr
        self.checkpoint = checkpoint
        self.services: StrategyServices | None = None
        self.result: DartsResult | None = None

    def bind(self, services: StrategyServices) -> None:
        super().bind(services)
        if services.load_dataset is None and not (
                self.checkpoint and Path(self.checkpoint).exists()):
            raise ConfigError("strategy 'darts' trains a supernet on the study's dataset; the "
                              "study has none (set dataset=..., e.g. 'digits')")
        self.services = services

    def search(self) -> DartsResult:
        if self.result is not None:
            return self.result
        path = Path(self.checkpoint) if self.checkpoint else None
        if path is not None and path.exists():
            saved = torch.load(path, map_location="cpu", weights_only=True)
            alphas = saved["alphas"]
            self.result = DartsResult(alphas, self.relaxation.read(alphas),
                                      list(saved["train_losses"]), list(saved["valid_accuracies"]))
            return self.result
        services = self.services
        if services is None or services.load_dataset is None:
            raise ConfigError("strategy 'darts' needs its study's dataset: use it in a study "
                              "(create_study(strategy='darts', ...))")

        def on_epoch(epoch: int, loss: float, acc: float) -> None:
            services.log_metrics({"darts_train_loss": loss, "darts_valid_accuracy": acc}, epoch)

        self.result = darts_search(self.space, services.load_dataset(), services.backend(),
                                   epochs=self.epochs, batch_size=self.batch_size, lr=self.lr,
                                   alpha_lr=self.alpha_lr, seed=self.seed, on_epoch=on_epoch)
        if path is not None:
            path.parent.mkdir(parents=True, exist_ok=True)
            torch.save({"alphas": self.result.alphas, "train_losses": self.result.train_losses,
                        "valid_accuracies": self.result.valid_accuracies}, path)
        return self.result

    def _next(self, study: optuna.Study, trial: FrozenTrial, hist: History,
              rng: random.Random) -> Architecture:
        return self.choose(study, trial, hist, rng)

    def choose(self, study: optuna.Study, trial: FrozenTrial, hist: History,
               rng: random.Random) -> Architecture:
        result = self.search()
        if result.architecture.key not in hist.seen:
            return result.architecture
        for _ in range(1000):
            arch = self.relaxation.sample(result.alphas, rng)
            if arch.key not in hist.seen:
                return arch
        return self.fresh_random(hist, rng)
