"""Dask tasks for the cluster tests: functions the `dask worker` processes import from here
(the tests folder is on their PYTHONPATH)."""

from __future__ import annotations

import os
import time
from pathlib import Path


def hold_lock(address: str, name: str, marker: str) -> None:
    """Take the scheduler lock ``name``, write this process's id to ``marker``, and keep the
    lock until the worker dies."""
    from frugalnas.engine.dask_storage import SchedulerLock

    SchedulerLock(address, name).acquire()
    Path(marker).write_text(str(os.getpid()))
    time.sleep(300)
