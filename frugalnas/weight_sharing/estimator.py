"""The ``supernet`` estimator: scores any architecture with weights inherited from a supernet
trained once per study (SPOS), so any strategy searches on one-shot estimates.

The first evaluation trains the supernet (``epochs`` one-shot epochs, then ``few_shot_epochs``
with a few-shot split) and saves it to ``checkpoint``; later evaluations, a resumed study and
other workers load it (a file lock lets one process train while the others wait). Every
training epoch's loss is reported to the study (``supernet_train_loss``, tracked in MLflow).

Hybrid scoring (``hybrid_proxies``): the value becomes a weighted mean of two percentile ranks
within the study's population (the completed trials holding the same metrics, plus the
candidate): the inherited accuracy's, and that of a zero-cost rank ensemble of the named
proxies (as the ``rank-ensemble`` estimator computes it). Like that estimator's, a hybrid value
is a standing among the trials seen so far; ``valid_accuracy`` stays the inherited accuracy.

On language-modelling data (the ``text`` dataset) the metric is the dataset task's,
``valid_loss`` in nats per token (minimise it), in place of ``valid_accuracy``.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from frugalnas.ports.capabilities import ProgressiveShrinking, WeightSharing, require_capability
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.ports.errors import ConfigError, check_choice, check_range
from frugalnas.ports.space import SearchSpace
from frugalnas.engine.training import TrainConfig, seed_everything
from frugalnas.proxies.ensemble import RankEnsembleEstimator, rank_average, stored_population
from frugalnas.spaces.nb201.supernet import SHARING
from frugalnas.weight_sharing.sandwich import sandwich_bounds
from frugalnas.weight_sharing.supernet import FewShotSplit, Supernet


class SupernetEstimator(Estimator):
    """Validation accuracy (%) of the candidate with weights inherited from a supernet trained
    by uniform single-path sampling (SPOS), batch-norm statistics recalibrated per candidate.

    ``sharing``: ``"operation"`` (one module per operation and position) or
    ``"operation-across-inputs"`` (one per operation and target node). ``few_shot_split`` /
    ``few_shot_groups`` / ``few_shot_epochs``: few-shot NAS (split decisions, number of
    sub-supernets, epochs after the split). ``checkpoint``: file for the trained supernet
    (default: beside a sqlite study database, ``<db>.<study>.supernet.pt``; none for other
    storages unless given). ``hybrid_proxies`` / ``hybrid_weight``: hybrid scoring with a
    zero-cost rank ensemble of those proxies (a list, or a preset name such as ``"selected"``,
    :data:`frugalnas.proxies.ensemble.MEMBER_PRESETS`), the inherited accuracy's rank weighted
    ``hybrid_weight`` and the ensemble's ``1 - hybrid_weight``. ``finetune_steps``: score a
    private copy of the candidate's inherited weights trained that many SGD steps further
    (the training options' SGD, a cosine schedule, the same batches for every candidate); the
    supernet itself is never changed by scoring. ``progressive_shrinking``: train the
    one-shot epochs in the space's progressive-shrinking phases (Once-for-All: the largest
    network first, then ever more of the space; spaces that declare phases: mobilenet).
    ``sandwich``: each step trains the space's largest network on the labels and this many
    more on its predictions, the smallest among them (BigNAS's sandwich rule with in-place
    distillation; 0: one drawn network per step; spaces with a largest and smallest
    network: mobilenet, gpt, vit). ``optimizer``: ``"sgd"`` (with ``momentum``) or
    ``"adam"``, which transformers (gpt, vit) train far better with."""

    name = "supernet"
    provides: tuple[str, ...] = ("valid_accuracy", "supernet_epochs")
    measures = ("seconds",)

    def __init__(self, epochs: int = 5, batch_size: int = 64, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 3e-4, sharing: str = "operation",
                 few_shot_split: Sequence[str] | str | None = None,
                 few_shot_groups: int | None = None, few_shot_epochs: int = 0,
                 bn_batches: int = 4, checkpoint: str | None = None,
                 hybrid_proxies: Sequence[str] | str | None = None, hybrid_weight: float = 0.5,
                 finetune_steps: int = 0, progressive_shrinking: bool = False,
                 sandwich: int = 0, optimizer: str = "sgd", host: Any = None):
        check_range("epochs", epochs, 0)
        check_range("sandwich", sandwich, 0)
        self.sandwich = int(sandwich)
        check_range("finetune_steps", finetune_steps, 0)
        check_range("few_shot_epochs", few_shot_epochs, 0)
        check_range("bn_batches", bn_batches, 0)
        check_choice("sharing", sharing, SHARING)
        self.config = TrainConfig(epochs=max(epochs, 1), batch_size=batch_size, lr=lr,
                                  momentum=momentum, weight_decay=weight_decay,
                                  optimizer=optimizer)
        self.epochs, self.few_shot_epochs = int(epochs), int(few_shot_epochs)
        self.sharing, self.bn_batches = sharing, int(bn_batches)
        self.few_shot_split, self.few_shot_groups = few_shot_split, few_shot_groups
        self.checkpoint = checkpoint
        self.finetune_steps = int(finetune_steps)
        self.progressive_shrinking = bool(progressive_shrinking)
        self.supernet_: Supernet | None = None
        check_range("hybrid_weight", hybrid_weight, 0.0, 1.0)
        self.hybrid_weight = float(hybrid_weight)
        self.ensemble: RankEnsembleEstimator | None = None
        if hybrid_proxies:
            if host is None:
                raise ConfigError("hybrid_proxies needs the plugin host that registers the "
                                  "proxies (host=); a study passes its own")
            self.ensemble = RankEnsembleEstimator(hybrid_proxies, host=host)
            self.provides = (*self.provides, *self.ensemble.provides)

    def checkpoint_path(self, context: TrialContext) -> Path | None:
        """``checkpoint``, else ``<db file>.<study>.<options hash>.supernet.pt`` beside the
        study's sqlite database (``context.artifact_file``), else none."""
        if self.checkpoint:
            return Path(self.checkpoint)
        if context.study_name is None:
            return None
        tag = hashlib.sha1(repr(self.options()).encode()).hexdigest()[:8]
        return context.artifact_file(f"{context.study_name}.{tag}.supernet.pt")

    def options(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "few_shot_epochs": self.few_shot_epochs,
                "train": vars(self.config), "sharing": self.sharing,
                "few_shot": [self.few_shot_split, self.few_shot_groups],
                **({"progressive": True} if self.progressive_shrinking else {}),
                **({"sandwich": self.sandwich} if self.sandwich else {})}

    def trained_supernet(self, context: TrialContext) -> Supernet:
        """The study's supernet, trained (or loaded from its checkpoint) on first use."""
        if self.supernet_ is not None:
            return self.supernet_
        data = context.dataset
        split = FewShotSplit.create(context.space, self.few_shot_split, self.few_shot_groups)
        supernet = Supernet(context.space, data.num_classes, data.input_shape, self.sharing,
                            seed=context.seed, few_shot=split,
                            progressive=self.progressive_shrinking, sandwich=self.sandwich)
        path = self.checkpoint_path(context)
        with _locked(path):
            if path is not None and path.exists() and supernet.load(path):
                pass
            wanted = (self.epochs, self.few_shot_epochs if split else 0)
            if (supernet.history.one_shot_epochs, supernet.history.few_shot_epochs) < wanted:
                seed_everything(context.seed)

                def on_epoch(epoch: int, loss: float) -> None:
                    context.log_metrics({"supernet_train_loss": loss}, epoch)
                    if path is not None:  # an interrupted training resumes from here
                        supernet.save(path)

                supernet.train(data, context.backend, self.config, epochs=self.epochs,
                               few_shot_epochs=self.few_shot_epochs, on_epoch=on_epoch)
                if path is not None:
                    supernet.save(path)
        self.supernet_ = supernet.to(context.backend.device)
        return supernet

    def check_space(self, space: SearchSpace) -> None:
        require_capability(space, WeightSharing, "estimator 'supernet'")
        if self.progressive_shrinking:
            require_capability(space, ProgressiveShrinking, "progressive_shrinking")
        sandwich_bounds(space, self.sandwich, few_shot=bool(self.few_shot_split))

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        supernet = self.trained_supernet(context)
        start = time.perf_counter()
        acc = supernet.accuracy(arch, context.dataset, context.backend,
                                bn_batches=self.bn_batches, batch_size=self.config.batch_size,
                                finetune_steps=self.finetune_steps, finetune=self.config)
        h = supernet.history
        task = context.dataset.task
        metrics = {task.metric: acc, **task.derived_metrics(acc),
                   "supernet_epochs": float(h.one_shot_epochs + h.few_shot_epochs)}
        cost = Cost(seconds=time.perf_counter() - start)
        value = acc
        if self.ensemble is not None:
            values, proxy_cost = self.ensemble.measure(arch, context)
            population = stored_population(context, self.ensemble.proxies,
                                           extra=(task.metric,))
            population = [row for row in population if task.metric in row]
            sign = 1.0 if task.direction == "maximize" else -1.0
            value = self.hybrid(sign * acc, values,
                                [{**row, "valid_accuracy": sign * row[task.metric]}
                                 for row in population])
            metrics.update(values, population=float(len(population) + 1))
            cost = cost + proxy_cost
        return EstimateResult(value, metrics, cost)

    def hybrid(self, accuracy: float, proxy_values: dict[str, float],
               population: list[dict[str, float]]) -> float:
        """The candidate's hybrid score within ``population`` + itself: the weighted mean of
        its inherited accuracy's percentile rank and its proxy ensemble's."""
        assert self.ensemble is not None
        ensemble = self.ensemble.population_scores(proxy_values, population, None)
        accuracies = [row["valid_accuracy"] for row in population] + [accuracy]
        both = np.column_stack([accuracies, ensemble])
        return float(rank_average(both, [self.hybrid_weight, 1.0 - self.hybrid_weight])[-1])


@contextlib.contextmanager
def _locked(path: Path | None) -> Iterator[None]:
    if path is None:
        yield
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(fh, fcntl.LOCK_UN)
