"""Test plugin ``ops_support.interrupts``: a strategy that is slow while optuna creates a
trial (in ``before_trial``, before the objective runs), so a test can interrupt a run at
that moment. Load it with ``-p ops_support.interrupts`` (``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import optuna

from frugalnas.host.plugins import hookimpl


class SlowAsk(optuna.samplers.BaseSampler):
    """Random architectures; while the file ``slow`` exists in ``control_dir``, each trial's
    creation writes its number to ``asking`` there and takes ``seconds``."""

    def __init__(self, space: Any = None, seed: int = 0, host: Any = None,
                 control_dir: str | None = None, seconds: float = 3.0):
        self.control_dir, self.seconds = control_dir, float(seconds)
        self.random = optuna.samplers.RandomSampler(seed=seed)

    def before_trial(self, study, trial):
        control = Path(self.control_dir) if self.control_dir else None
        if control is not None and (control / "slow").exists():
            (control / "asking").write_text(str(trial.number))
            time.sleep(self.seconds)

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return self.random.sample_independent(study, trial, param_name, param_distribution)


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"ops-slow-ask": SlowAsk}
