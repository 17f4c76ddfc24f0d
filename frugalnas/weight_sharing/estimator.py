"""The ``supernet`` estimator: scores any architecture with weights inherited from a supernet
trained once per study (SPOS), so any strategy searches on one-shot estimates.

The first evaluation trains the supernet (``epochs`` one-shot epochs, then ``few_shot_epochs``
with a few-shot split) and saves it to ``checkpoint``; later evaluations, a resumed study and
other workers load it (a file lock lets one process train while the others wait). Every
training epoch's loss is reported to the study (``supernet_train_loss``, tracked in MLflow).
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

from frugalnas.core import optuna_compat
from frugalnas.core.architecture import Architecture
from frugalnas.core.cost import Cost
from frugalnas.core.estimator import EstimateResult, EvaluationContext, Estimator
from frugalnas.core.errors import check_range
from frugalnas.core.training import TrainConfig, seed_everything
from frugalnas.weight_sharing.supernet import FewShotSplit, Supernet


class SupernetEstimator(Estimator):
    """Validation accuracy (%) of the candidate with weights inherited from a supernet trained
    by uniform single-path sampling (SPOS), batch-norm statistics recalibrated per candidate.

    ``sharing``: ``"operation"`` (one module per operation and position) or
    ``"operation-across-inputs"`` (one per operation and target node). ``few_shot_split`` /
    ``few_shot_groups`` / ``few_shot_epochs``: few-shot NAS (split decisions, number of
    sub-supernets, epochs after the split). ``checkpoint``: file for the trained supernet
    (default: beside a sqlite study database, ``<db>.<study>.supernet.pt``; none for other
    storages unless given)."""

    name = "supernet"
    provides: tuple[str, ...] = ("valid_accuracy", "supernet_epochs")
    measures = ("seconds",)

    def __init__(self, epochs: int = 5, batch_size: int = 64, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 3e-4, sharing: str = "operation",
                 few_shot_split: Sequence[str] | str | None = None,
                 few_shot_groups: int | None = None, few_shot_epochs: int = 0,
                 bn_batches: int = 4, checkpoint: str | None = None):
        check_range("epochs", epochs, 0)
        check_range("few_shot_epochs", few_shot_epochs, 0)
        check_range("bn_batches", bn_batches, 0)
        from frugalnas.core.errors import check_choice
        from frugalnas.spaces.nb201.supernet import SHARING

        check_choice("sharing", sharing, SHARING)
        self.config = TrainConfig(epochs=max(epochs, 1), batch_size=batch_size, lr=lr,
                                  momentum=momentum, weight_decay=weight_decay)
        self.epochs, self.few_shot_epochs = int(epochs), int(few_shot_epochs)
        self.sharing, self.bn_batches = sharing, int(bn_batches)
        self.few_shot_split, self.few_shot_groups = few_shot_split, few_shot_groups
        self.checkpoint = checkpoint
        self.supernet_: Supernet | None = None

    def checkpoint_path(self, context: EvaluationContext) -> Path | None:
        if self.checkpoint:
            return Path(self.checkpoint)
        study = context.study
        if study is None:
            return None
        url = optuna_compat.storage_url(study.optuna_study) or ""
        if not url.startswith("sqlite:///"):
            return None
        db = Path(url[len("sqlite:///"):])
        tag = hashlib.sha1(repr(self.options()).encode()).hexdigest()[:8]
        return db.with_name(f"{db.name}.{study.name}.{tag}.supernet.pt")

    def options(self) -> dict[str, Any]:
        return {"epochs": self.epochs, "few_shot_epochs": self.few_shot_epochs,
                "train": vars(self.config), "sharing": self.sharing,
                "few_shot": [self.few_shot_split, self.few_shot_groups]}

    def trained_supernet(self, context: EvaluationContext) -> Supernet:
        """The study's supernet, trained (or loaded from its checkpoint) on first use."""
        if self.supernet_ is not None:
            return self.supernet_
        data = context.dataset
        split = FewShotSplit.create(context.space, self.few_shot_split, self.few_shot_groups)
        supernet = Supernet(context.space, data.num_classes, data.input_shape, self.sharing,
                            seed=context.seed, few_shot=split)
        path = self.checkpoint_path(context)
        with _locked(path):
            if path is not None and path.exists() and supernet.load(path):
                pass
            wanted = (self.epochs, self.few_shot_epochs if split else 0)
            if (supernet.history.one_shot_epochs, supernet.history.few_shot_epochs) < wanted:
                seed_everything(context.seed)

                def on_epoch(epoch: int, loss: float) -> None:
                    context.log_study_metrics({"supernet_train_loss": loss}, epoch)
                    if path is not None:  # an interrupted training resumes from here
                        supernet.save(path)

                supernet.train(data, context.backend, self.config, epochs=self.epochs,
                               few_shot_epochs=self.few_shot_epochs, on_epoch=on_epoch)
                if path is not None:
                    supernet.save(path)
        self.supernet_ = supernet.to(context.backend.device)
        return supernet

    def evaluate(self, arch: Architecture, context: EvaluationContext) -> EstimateResult:
        supernet = self.trained_supernet(context)
        start = time.perf_counter()
        acc = supernet.accuracy(arch, context.dataset, context.backend,
                                bn_batches=self.bn_batches, batch_size=self.config.batch_size)
        h = supernet.history
        return EstimateResult(acc, {"valid_accuracy": acc,
                                    "supernet_epochs": float(h.one_shot_epochs + h.few_shot_epochs)},
                              Cost(seconds=time.perf_counter() - start))


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
