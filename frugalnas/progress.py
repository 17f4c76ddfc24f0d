"""Built-in plugin: a progress bar over a study's trials (block it with ``-p no:progress``)."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from optuna.trial import TrialState

from frugalnas.core.plugins import hookimpl
from frugalnas.core.trial_report import TrialReport

PLUGIN = "progress"


def _enabled() -> bool:
    return os.environ.get("FRUGALNAS_PROGRESS", "auto") != "0"


class _Bar:
    """One study's bar and the best objective value seen, kept in ``study.plugin_state``."""

    def __init__(self, study: Any):
        from tqdm.auto import tqdm

        self.single = len(study.directions) == 1
        self.maximize = study.directions[0] == "maximize"
        self.best: float | None = None
        if self.single:
            try:
                self.best = float(study.best_value)
            except (ValueError, RuntimeError):  # nothing (feasible) completed yet
                self.best = None
        self.tqdm = tqdm(total=study.planned_trials, desc=f"study {study.name}", unit="trial",
                         file=sys.stderr, dynamic_ncols=True,
                         disable=os.environ.get("FRUGALNAS_PROGRESS") != "1"
                         and not sys.stderr.isatty())

    def finished(self, report: TrialReport) -> None:
        # The hook runs before optuna records the trial, so the best is kept here.
        if (self.single and report.state == TrialState.COMPLETE and report.values
                and report.feasible is not False):
            value = float(report.values[0])
            if math.isfinite(value) and (self.best is None or (
                    value > self.best if self.maximize else value < self.best)):
                self.best = value
        best = f" best={self.best:.4g}" if self.best is not None else ""
        self.tqdm.set_postfix_str(f"last={report.state.name.lower()}{best}")
        self.tqdm.update(1)


@hookimpl
def frugalnas_study_started(study: Any) -> None:
    if _enabled():
        study.plugin_state[PLUGIN] = _Bar(study)


@hookimpl
def frugalnas_trial_finished(study: Any, report: TrialReport) -> None:
    bar = study.plugin_state.get(PLUGIN)
    if bar is not None:
        bar.finished(report)


@hookimpl
def frugalnas_study_finished(study: Any) -> None:
    bar = study.plugin_state.pop(PLUGIN, None)
    if bar is not None:
        bar.tqdm.close()
