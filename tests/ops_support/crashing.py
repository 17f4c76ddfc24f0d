"""Test plugin ``ops_support.crashing``: an estimator that kills its own process on one
architecture, and a strategy that keeps proposing that architecture, for the trial-isolation
tests. Load it with ``-p ops_support.crashing`` (``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path
from typing import Any

import optuna

from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.host.plugins import hookimpl
from frugalnas.spaces.nb201.table import NB201TableEstimator
from ops_support.faults import note_event

HOW = ("abort", "segv", "kill")


class CrashOn(Estimator):
    """NB201 table lookup after ``seconds``; on architecture ``crash_on`` the process dies
    (``how``: ``abort`` calls ``os.abort()``, ``segv`` and ``kill`` send itself SIGSEGV or
    SIGKILL). Before dying it allocates ``allocate_mib`` MiB (a peak the parent must see).
    Each evaluation reports one step and logs one study metric (both go to the parent when
    isolated), and writes ``"start|end TRIAL PID"`` lines to ``log``. A process whose pid is
    a file name in ``control_dir`` hangs in its next trial."""

    name = "ops-crash"
    needs_dataset = False

    def __init__(self, crash_on: str = "", how: str = "abort", seconds: float = 0.1,
                 allocate_mib: int = 0, log: str | None = None, control_dir: str | None = None):
        if how not in HOW:
            raise ValueError(f"invalid how {how!r}; valid: {', '.join(HOW)}")
        self.crash_on, self.how, self.seconds = crash_on, how, float(seconds)
        self.allocate_mib, self.log, self.control_dir = int(allocate_mib), log, control_dir
        self.table = NB201TableEstimator()

    def evaluate(self, arch: Any, context: TrialContext) -> EstimateResult:
        number = context.trial_number if context.trial_number is not None else -1
        note_event(self.log, "start", number)
        if self.control_dir and Path(self.control_dir, "hang").exists():
            note_event(self.log, "hang", number)
            time.sleep(600)
        time.sleep(self.seconds)
        if str(arch) == self.crash_on:
            ballast = bytearray(self.allocate_mib * 2**20)
            for i in range(0, len(ballast), 4096):  # touch every page: resident, not reserved
                ballast[i] = 1
            if self.how == "abort":
                os.abort()
            os.kill(os.getpid(), signal.SIGSEGV if self.how == "segv" else signal.SIGKILL)
        result = self.table.evaluate(arch, context)
        context.report(0, {"value": result.value})
        context.log_metrics({"crash_test_seen": float(number)}, number)
        result.metrics["evaluator_pid"] = float(os.getpid())
        note_event(self.log, "end", number)
        return result


class OftenFirst(optuna.samplers.BaseSampler):
    """Every trial whose number is a multiple of ``every`` proposes the first choice of every
    decision (one architecture, again and again); the others are random."""

    def __init__(self, space: Any = None, seed: int = 0, host: Any = None, every: int = 2):
        self.every = int(every)
        self.random = optuna.samplers.RandomSampler(seed=None)

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        if trial.number % self.every == 0:
            return param_distribution.choices[0]
        return self.random.sample_independent(study, trial, param_name, param_distribution)


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"ops-crash": CrashOn}


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"ops-often-first": OftenFirst}
