"""Test plugin ``ops_support.faults``: estimators that sleep, raise, return NaN, run out of
memory or hang, so the operations tests can exercise workers and failure isolation with
real processes. Load it with ``-p ops_support.faults`` (``tests/`` on ``PYTHONPATH``)."""

from __future__ import annotations

import math
import os
import time
from pathlib import Path
from typing import Any

import optuna
import torch

from frugalnas.ports.errors import check_choice
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.host.plugins import hookimpl
from frugalnas.spaces.nb201.table import NB201TableEstimator

MODES = ("ok", "raise", "nan", "oom", "hang")



def note_event(log: str | None, event: str, number: int) -> None:
    """Append ``EVENT NUMBER PID`` to the estimator's ``log`` file (when it has one), which
    the tests read back with :func:`read_log`."""
    if log:
        with open(log, "a") as fh:
            fh.write(f"{event} {number} {os.getpid()}\n")

class SleepyTable(Estimator):
    """NB201 table lookup after ``seconds`` of sleep. Writes "start/end/hang TRIAL PID" lines
    to ``log``; a process whose pid is a file name in ``control_dir`` hangs in its next trial
    (so a test can kill a worker mid-trial at a moment it chooses)."""

    name = "ops-sleepy"
    needs_dataset = False

    def __init__(self, seconds: float = 0.5, log: str | None = None, control_dir: str | None = None):
        self.seconds, self.log, self.control_dir = float(seconds), log, control_dir
        self.table = NB201TableEstimator()

    def evaluate(self, arch: Any, context: TrialContext) -> EstimateResult:
        number = context.trial_number if context.trial_number is not None else -1
        note_event(self.log, "start", number)
        if self.control_dir and (Path(self.control_dir) / str(os.getpid())).exists():
            note_event(self.log, "hang", number)
            time.sleep(600)
        time.sleep(self.seconds)
        result = self.table.evaluate(arch, context)
        note_event(self.log, "end", number)
        return result


def nan_loss() -> float:
    """A real NaN loss: a tiny linear model trained with an infinite learning rate."""
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=float("inf"))
    x = torch.randn(8, 4)
    for _ in range(2):
        loss = model(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    loss = float(model(x).pow(2).mean().detach())
    assert math.isnan(loss), loss
    return loss


class Faulty(Estimator):
    """Trial ``i`` behaves as ``modes[i % len(modes)]``: ok, raise, nan, oom or hang."""

    name = "ops-faulty"
    needs_dataset = False

    def __init__(self, modes: list[str] = ("ok",), hang_seconds: float = 30.0):
        for m in modes:
            check_choice("ops-faulty mode", m, MODES)
        self.modes, self.hang_seconds = list(modes), float(hang_seconds)
        self.table = NB201TableEstimator()
        if "nan" in self.modes:
            nan_loss()  # the first optimizer step is slow; keep it out of the timed trial

    def evaluate(self, arch: Any, context: TrialContext) -> EstimateResult:
        mode = self.modes[(context.trial_number or 0) % len(self.modes)]
        if mode == "raise":
            raise RuntimeError(f"candidate {arch} is broken on purpose")
        if mode == "oom":
            # What torch raises when an allocation does not fit (CUDA or CPU caching allocator).
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 64.00 GiB")
        if mode == "hang":
            time.sleep(self.hang_seconds)
        result = self.table.evaluate(arch, context)
        if mode == "nan":
            result.value = nan_loss()
        return result


class RepeatSampler(optuna.samplers.BaseSampler):
    """An optuna sampler that proposes the same architecture for every trial (the first
    choice of every decision), as a sampler that does not look at other trials would."""

    def __init__(self, space: Any = None, seed: int = 0, host: Any = None):
        self.space = space

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return param_distribution.choices[0]


class ProposeThenHang(optuna.samplers.BaseSampler):
    """Random architectures; in a process whose pid is a file name in ``control_dir`` the
    proposal hangs (a worker killed while its strategy proposes)."""

    def __init__(self, space: Any = None, seed: int = 0, host: Any = None,
                 control_dir: str | None = None):
        self.control_dir = control_dir
        self.random = optuna.samplers.RandomSampler(seed=None)

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        if self.control_dir and (Path(self.control_dir) / str(os.getpid())).exists():
            (Path(self.control_dir) / f"{os.getpid()}.proposing").write_text(str(trial.number))
            time.sleep(600)
        return self.random.sample_independent(study, trial, param_name, param_distribution)


@hookimpl
def frugalnas_estimators() -> dict[str, Any]:
    return {"ops-sleepy": SleepyTable, "ops-faulty": Faulty}


@hookimpl
def frugalnas_strategies() -> dict[str, Any]:
    return {"ops-repeat": RepeatSampler, "ops-propose-hang": ProposeThenHang}


def read_log(path: str | Path) -> list[tuple[str, int, int]]:
    """The ``(event, trial, pid)`` lines a :class:`SleepyTable` wrote."""
    rows = []
    for line in Path(path).read_text().splitlines():
        event, number, pid = line.split()
        rows.append((event, int(number), int(pid)))
    return rows
