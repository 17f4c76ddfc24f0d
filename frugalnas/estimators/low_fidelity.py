"""Low-fidelity training: few epochs, a data subset, lower resolution, a narrower or
shallower network. Scores validation accuracy like ``train``, at a fraction of its cost
(cf. Zela et al. 2018 and the reduced-setting studies of Zhou et al., "EcoNAS", CVPR 2020)."""

from __future__ import annotations

from frugalnas.ports.capabilities import Scaling, require_capability
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.data import Dataset
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.estimator import EstimateResult, TrialContext
from frugalnas.estimators.train import TrainEstimator


class LowFidelityEstimator(TrainEstimator):
    """Short training on reduced data, resolution or width; scores validation accuracy (%).

    ``report_every_epoch=True`` reports after each full epoch as ``train`` does (for a
    pruner; off by default, since low-fidelity budgets are often a fraction of an epoch).
    ``precision``, ``channels_last`` and ``compile`` are those of ``train``."""

    provides = (*TrainEstimator.provides, "fidelity_subset", "fidelity_epochs")

    name = "low-fidelity"

    def __init__(self, epochs: float = 1.0, subset: float = 0.25, resize: int | None = None,
                 width: int | None = None, depth: int | None = None, batch_size: int = 64,
                 lr: float = 0.05, momentum: float = 0.9, weight_decay: float = 5e-4,
                 optimizer: str = "sgd", max_steps: int | None = None,
                 report_every_epoch: bool = False, precision: str = "fp32",
                 channels_last: bool = False, compile: bool = False):
        if not isinstance(report_every_epoch, bool):
            raise ConfigError(f"invalid low-fidelity report_every_epoch {report_every_epoch!r}; "
                              "expected true or false")
        super().__init__(epochs=epochs, batch_size=batch_size, lr=lr, momentum=momentum,
                         weight_decay=weight_decay, optimizer=optimizer, max_steps=max_steps,
                         report_every_epoch=report_every_epoch, precision=precision,
                         channels_last=channels_last, compile=compile)
        if not 0 < subset <= 1:
            raise ConfigError(f"invalid low-fidelity subset {subset!r}; valid range: (0, 1]")
        for what, v in (("resize", resize), ("width", width), ("depth", depth)):
            if v is not None:
                check_range(f"low-fidelity {what}", v, 1)
        self.epochs, self.subset, self.resize = epochs, subset, resize
        self.width, self.depth = width, depth

    def prepare_data(self, dataset: Dataset, seed: int) -> Dataset:
        data = dataset.subset(self.subset, seed=seed) if self.subset < 1 else dataset
        return data.resized(int(self.resize)) if self.resize else data

    def build(self, arch: Architecture, context: TrialContext, dataset: Dataset):
        space = context.space
        if self.width is not None or self.depth is not None:
            try:
                scaling = require_capability(space, Scaling, "low-fidelity width/depth")
            except ConfigError as e:
                raise ConfigError(f"{e}; leave width/depth unset") from None
            space = scaling.scaled(width=self.width, depth=self.depth)
        return space.build(arch, dataset.num_classes, dataset.input_shape)

    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        result = super().evaluate(arch, context)
        result.metrics["fidelity_subset"] = float(self.subset)
        result.metrics["fidelity_epochs"] = float(self.epochs)
        return result

