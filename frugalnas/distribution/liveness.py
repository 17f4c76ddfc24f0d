"""Who beats for a trial, and whether that process still runs.

A heartbeat tells when a trial's process last wrote to the storage. On a loaded machine a
live process can miss the grace: its heartbeat thread waits for a core, or the whole process
is stopped (``SIGSTOP``, a swapped-out container). Failing its trial then would run the
architecture twice. So the process that beats for a trial records who it is
(:class:`ProcessId`), and a stale check that runs on the same machine asks the kernel rather
than the clock: a trial whose process runs is never failed as stale, however old its
heartbeat; a trial whose process is gone is failed after the grace, as optuna does. On other
machines (and where ``/proc`` is missing) the heartbeat by the storage's clock is all there is.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

#: The trial system attribute naming the process that beats for the trial.
BEATING_PROCESS_ATTR = "frugalnas:beating_process"

_PROC = Path("/proc")


@dataclass(frozen=True)
class ProcessId:
    """A process, told apart from every other one that ran or runs anywhere: its machine
    (the kernel's boot id and the PID namespace), its pid, and when it started (clock ticks
    after boot, so a pid the kernel reused is a different process)."""

    machine: str
    pid: int
    started: int

    def text(self) -> str:
        return f"{self.machine} {self.pid} {self.started}"

    @classmethod
    def parse(cls, text: object) -> ProcessId | None:
        """The ProcessId :meth:`text` wrote, or ``None`` for anything else."""
        if not isinstance(text, str):
            return None
        parts = text.split(" ")
        if len(parts) != 3 or not parts[1].isdigit() or not parts[2].isdigit():
            return None
        return cls(parts[0], int(parts[1]), int(parts[2]))


def _machine() -> str | None:
    try:
        boot = (_PROC / "sys/kernel/random/boot_id").read_text().strip()
        namespace = os.readlink(_PROC / "self/ns/pid")
    except OSError:
        return None
    return f"{boot}/{namespace.strip('pid:[]')}"


def _start_and_state(pid: int) -> tuple[int, str] | None:
    """(start time, state letter) of process ``pid``, or ``None`` when there is none."""
    try:
        stat = (_PROC / str(pid) / "stat").read_text()
    except OSError:
        return None
    fields = stat.rsplit(")", 1)[-1].split()  # the name in parentheses may hold spaces
    return int(fields[19]), fields[0]


def this_process() -> ProcessId | None:
    """This process, or ``None`` where the kernel does not say (no ``/proc``)."""
    machine = _machine()
    found = _start_and_state(os.getpid())
    if machine is None or found is None:
        return None
    return ProcessId(machine, os.getpid(), found[0])


def is_running(process: ProcessId) -> bool | None:
    """Whether ``process`` runs (a stopped process does; a zombie does not), or ``None`` when
    this machine cannot tell (the process is on another machine or PID namespace)."""
    if process.machine != _machine():
        return None
    found = _start_and_state(process.pid)
    return found is not None and found[0] == process.started and found[1] not in "ZX"
