"""Built-in plugin: a progress bar over a study's trials (block it with ``-p no:progress``)."""

from __future__ import annotations

import math
import os
import sys
from typing import Any

from frugalnas.core.plugins import hookimpl

PLUGIN = "progress"


def _enabled() -> bool:
    return os.environ.get("FRUGALNAS_PROGRESS", "auto") != "0"


class _Bar:
    """One study's bar and the best objective value seen, kept in ``study.plugin_state``."""

    def __init__(self, study: Any):
        from tqdm.auto import tqdm

        self.single = len(study.directions) == 1
        self.maximize = study.directions[0] == "maximize"
        self.constraints = dict(study.config.constraints)
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

    def finished(self, state: str, values: list[float] | None, result: Any) -> None:
        # The hook runs before optuna records the trial, so the best is kept here.
        if self.single and state == "COMPLETE" and values and self._feasible(result):
            value = float(values[0])
            if math.isfinite(value) and (self.best is None or (
                    value > self.best if self.maximize else value < self.best)):
                self.best = value
        best = f" best={self.best:.4g}" if self.best is not None else ""
        self.tqdm.set_postfix_str(f"last={state.lower()}{best}")
        self.tqdm.update(1)

    def _feasible(self, result: Any) -> bool:
        if not self.constraints or result is None:
            return True
        try:
            return all(float(result.objective(name)) <= bound
                       for name, bound in self.constraints.items())
        except KeyError:
            return False


@hookimpl
def frugalnas_study_started(study: Any) -> None:
    if _enabled():
        study.plugin_state[PLUGIN] = _Bar(study)


@hookimpl
def frugalnas_trial_finished(study: Any, trial: Any, architecture: Any, state: str,
                             values: list[float] | None, result: Any, error: str | None) -> None:
    bar = study.plugin_state.get(PLUGIN)
    if bar is not None:
        bar.finished(state, values, result)


@hookimpl
def frugalnas_study_finished(study: Any) -> None:
    bar = study.plugin_state.pop(PLUGIN, None)
    if bar is not None:
        bar.tqdm.close()
