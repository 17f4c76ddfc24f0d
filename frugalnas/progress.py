"""Built-in plugin: a progress bar over a study's trials (block it with ``-p no:progress``)."""

from __future__ import annotations

import os
import sys
from typing import Any

from frugalnas.core.plugins import hookimpl

_BARS: dict[int, Any] = {}


def _enabled() -> bool:
    return os.environ.get("FRUGALNAS_PROGRESS", "auto") != "0"


@hookimpl
def frugalnas_study_started(study: Any) -> None:
    if not _enabled():
        return
    from tqdm.auto import tqdm

    _BARS[id(study)] = tqdm(total=study.planned_trials, desc=f"study {study.name}", unit="trial",
                            file=sys.stderr, dynamic_ncols=True,
                            disable=os.environ.get("FRUGALNAS_PROGRESS") != "1" and not sys.stderr.isatty())


@hookimpl
def frugalnas_trial_finished(study: Any, trial: Any, architecture: Any, state: str,
                             values: list[float] | None, result: Any, error: str | None) -> None:
    bar = _BARS.get(id(study))
    if bar is None:
        return
    try:
        best = study.optuna_study.best_value if len(study.directions) == 1 else None
    except ValueError:
        best = None
    bar.set_postfix_str(f"last={state.lower()}" + (f" best={best:.4g}" if best is not None else ""))
    bar.update(1)


@hookimpl
def frugalnas_study_finished(study: Any) -> None:
    bar = _BARS.pop(id(study), None)
    if bar is not None:
        bar.close()
