"""Kill random workers, again and again, while they share one study."""

from __future__ import annotations

import os
import random
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from ops_support.faults import read_log


@dataclass
class ChaosReport:
    kills: int = 0
    in_trials: int = 0  # kills after the victim had begun evaluating a trial
    started: int = 0
    survivors: list[subprocess.Popen] = field(default_factory=list)
    evaluated: set[int] = field(default_factory=set)
    seconds: float = 0.0
    kill_phase: float = 0.0        # seconds until the last kill
    ended_in_kill_phase: int = 0   # evaluations that ended before the last kill


def chaos(start: Callable[[str], subprocess.Popen], log: Path, *, workers: int, kills: int,
          seed: int, max_delay: float, timeout: float = 400) -> ChaosReport:
    """Keep ``workers`` worker processes (``start(name)``) on the study and SIGKILL one at a
    random moment, then start a replacement, ``kills`` times; then let the remaining workers
    finish. Half the victims (chosen by ``seed``) die up to ``max_delay`` seconds after they
    began evaluating a trial (in the evaluation, while recording it, writing to MLflow or
    proposing the next one), the others at a random moment of their start-up (creating or
    joining the study, opening MLflow, reconciling it, the first proposal). Fails if the
    study finishes before the kills are done (give it more trials) or a survivor fails."""
    rng = random.Random(seed)
    report = ChaosReport()
    t0 = time.monotonic()
    alive: list[subprocess.Popen] = []
    born: dict[int, float] = {}
    in_trial: dict[int, bool] = {}
    due: dict[int, float] = {}
    startup: list[float] = []  # seconds from start to the first evaluation, per worker

    def spawn() -> None:
        proc = start(f"w{report.started:02d}")
        alive.append(proc)
        born[proc.pid] = time.monotonic()
        in_trial[proc.pid] = rng.random() < 0.5
        report.started += 1

    for _ in range(workers):
        spawn()
    while report.kills < kills:
        assert time.monotonic() - t0 < timeout, f"chaos: only {report.kills} kills in {timeout} s"
        events = read_log(log) if log.exists() else []
        evaluating = {pid for e, _, pid in events if e == "start"}
        now = time.monotonic()
        for proc in list(alive):
            if proc.poll() is not None:
                raise AssertionError(
                    f"worker {proc.pid} exited ({proc.returncode}) after {report.kills} kills: "
                    "the study finished before the chaos was over (give it more trials)"
                    if proc.returncode == 0 else f"worker {proc.pid} failed with {proc.returncode}")
            pid = proc.pid
            if pid in evaluating and pid not in due:
                startup.append(now - born[pid])
                if in_trial[pid]:
                    due[pid] = now + rng.uniform(0, max_delay)
            if pid not in due and not in_trial[pid] and startup:
                # a random moment of a typical start-up, as measured on this machine
                due[pid] = born[pid] + rng.uniform(0.3, 1.0) * sum(startup) / len(startup)
            if pid in due and now >= due[pid] and report.kills < kills:
                proc.send_signal(signal.SIGKILL)
                proc.wait(timeout=30)
                alive.remove(proc)
                report.kills += 1
                report.in_trials += pid in evaluating
                if report.kills < kills or not alive:
                    spawn()  # (the last victim is not replaced: the survivors finish)
        time.sleep(0.05)
    report.kill_phase = time.monotonic() - t0
    report.ended_in_kill_phase = sum(e == "end" for e, _, _ in read_log(log))
    for proc in alive:
        try:
            proc.wait(timeout=max(60.0, timeout - (time.monotonic() - t0)))
        except subprocess.TimeoutExpired:
            for p in alive:
                p.kill()
            raise AssertionError("chaos: the surviving workers did not finish") from None
    report.survivors = alive
    report.evaluated = {n for e, n, _ in read_log(log) if e == "start"}
    report.seconds = time.monotonic() - t0
    return report


def process_alive(pid: int) -> bool:
    """Whether process ``pid`` runs; a zombie (killed, not yet reaped by its parent) is dead."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    status = Path(f"/proc/{pid}/stat")
    return status.exists() and status.read_text().split(")")[-1].split()[0] != "Z"


def env_with_tests(tests: Path) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(tests), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env["FRUGALNAS_PROGRESS"] = "0"
    env["PYTHONWARNINGS"] = "ignore"
    return env
