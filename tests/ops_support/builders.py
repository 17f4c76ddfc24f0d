"""Define-by-run builders for the isolation tests: ``mixed_abort`` calls ``os.abort()`` for
every architecture whose two widths differ (its first and last choices are whole), and the
``ops-build`` estimator, which builds the candidate's network and scores its size. Load the
estimator with ``-p ops_support.builders`` (``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

import os
from typing import Any

from torch import nn

from frugalnas.host.plugins import hookimpl
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext


def mixed_abort(trial: Any, widths: tuple[int, ...] = (4, 8, 16)) -> nn.Module:
    """Two convolutions; the process aborts when their widths differ."""
    first = trial.suggest_categorical("width0", list(widths))
    second = trial.suggest_categorical("width1", list(widths))
    if first != second:
        os.abort()
    return nn.Sequential(nn.Conv2d(trial.in_channels, first, 3, padding=1), nn.ReLU(),
                         nn.Conv2d(first, second, 3, padding=1), nn.AdaptiveAvgPool2d(1),
                         nn.Flatten(), nn.Linear(second, trial.num_classes))


class BuildSize(Estimator):
    """Builds the network (10 classes, 3x8x8 input) and scores its number of parameters;
    ``evaluator_pid`` says which process built it."""

    name = "ops-build"
    needs_dataset = False

    def evaluate(self, arch: Any, context: TrialContext) -> EstimateResult:
        model = context.space.build(arch, 10, (3, 8, 8))
        size = float(sum(p.numel() for p in model.parameters()))
        return EstimateResult(value=size, metrics={"evaluator_pid": float(os.getpid())})


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"ops-build": BuildSize}
