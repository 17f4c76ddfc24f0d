"""The background writer: every MLflow call of a study in order on one daemon thread, so
logging stays off the trials' critical path; its errors are kept and reported in one line."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from typing import Any

from frugalnas.ports.errors import OperationalFailure
from frugalnas.ports.secrets import mask_text
from frugalnas.engine.storage_url import operational_failure


WRITER_THREAD = "frugalnas-mlflow"


class _WriterRecords(logging.Filter):
    """Drops the log records MLflow emits on the writer thread (a traceback per failed write,
    "View run" lines): the writer keeps its errors and the study reports them in one line."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not (record.threadName or "").startswith(WRITER_THREAD)


def quiet_writer_logs() -> None:
    """Attach :class:`_WriterRecords` to the handlers of MLflow's logger (idempotent), and
    turn off the two "View run/experiment" lines MLflow writes to stdout for every run it
    ends on a tracking server (MLflow's own switch; a user who set it keeps their value):
    the study's closing lines say where its runs are."""
    os.environ.setdefault("MLFLOW_SUPPRESS_PRINTING_URL_TO_STDOUT", "true")
    for handler in logging.getLogger("mlflow").handlers:
        if not any(isinstance(f, _WriterRecords) for f in handler.filters):
            handler.addFilter(_WriterRecords())


class Writer:
    """Runs MLflow calls in order on a daemon thread; errors are kept, not raised. After a
    failure of the store itself (a full disk, ...) the remaining writes are skipped: the next
    start of the study writes them from the storage."""

    def __init__(self, uri: str = "") -> None:
        self.uri = uri
        self.jobs: queue.Queue = queue.Queue()
        self.errors: list[str] = []
        self.failure: OperationalFailure | None = None
        #: Runs written and jobs done so far: what :meth:`drain` watches for progress.
        self.progress = 0
        self.thread = threading.Thread(target=self._loop, name=WRITER_THREAD, daemon=True)
        self.thread.start()

    def _loop(self) -> None:
        while True:
            job = self.jobs.get()
            try:
                if job is None:
                    return
                if self.failure is None:
                    job()
            except Exception as exc:  # logging must never kill a study
                self.failure = operational_failure(exc, self.uri, "MLflow store",
                                                   disk_only=True)
                if self.failure is None:
                    self.errors.append(mask_text(f"{type(exc).__name__}: {exc}"))
            finally:
                self.progress += 1
                self.jobs.task_done()

    def progressed(self, n: int = 1) -> None:
        """Count ``n`` runs written (within a job that writes many)."""
        self.progress += n

    def submit(self, fn: Any) -> None:
        self.jobs.put(fn)

    def drain(self, stall: float) -> bool:
        """Wait until every submitted job ran; give up (False) when no run was written and no
        job finished for ``stall`` seconds (a tracking server gone away: MLflow retries each
        call for minutes). A long job that keeps writing runs is waited for."""
        seen, since = self.progress, time.monotonic()
        while self.jobs.unfinished_tasks:
            time.sleep(0.02)
            if self.progress != seen:
                seen, since = self.progress, time.monotonic()
            elif time.monotonic() - since > stall:
                return False
        return True

    def close(self) -> None:
        self.jobs.put(None)
        self.thread.join(timeout=5)
