"""Child processes of a study: started with ``python -c`` (never forked from the study's
process, so torch's threads and CUDA state are not copied), talking to the study's process
over a socket, reaped with how they died and their peak memory; the one-line fail reason of
a trial whose child failed; and which estimators are isolated by default. Both the
evaluation processes (:mod:`frugalnas.engine.isolation`) and the builder's guard processes
(:mod:`frugalnas.engine.builder_guard`) are such children."""

from __future__ import annotations

import contextlib
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
import time
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any


from frugalnas.ports.errors import TrialFailure

if TYPE_CHECKING:
    from frugalnas.ports.estimator import Estimator


class CandidateFailure(TrialFailure):
    """A trial failure whose message is the trial's whole fail reason (no exception name in
    front): a crashed evaluation process, a refused candidate, or an exception of the child
    that could not travel back as itself."""


def trains(estimator: Estimator) -> bool:
    """Whether ``estimator`` trains networks (what ``auto`` isolates): it needs a dataset and
    measures epochs, as ``train``, the low-fidelity estimators and ``inherited`` do."""
    return bool(estimator.needs_dataset) and "epochs" in estimator.measures


def death_reason(status: int, maxrss_kib: int) -> tuple[str, str]:
    """How a child with wait status ``status`` ended (``"SIGABRT"``, ``"exit 3"``) and the
    one-line fail reason that says so with its peak memory."""
    if os.WIFSIGNALED(status):
        number = os.WTERMSIG(status)
        try:
            how = signal.Signals(number).name
        except ValueError:
            how = f"signal {number}"
        text = f"candidate process killed by {how}"
        if how == "SIGKILL":
            text += " (the kernel's out-of-memory killer sends SIGKILL)"
    else:
        how = f"exit {os.WEXITSTATUS(status) if os.WIFEXITED(status) else status}"
        text = f"candidate process ended during its trial ({how})"
    return how, f"{text}; peak memory {maxrss_kib / 1024:.0f} MiB"


class _ChildDied(Exception):
    pass


class _Deadline(Exception):
    pass


class _Child:
    """One evaluation (or builder guard) process and the parent's end of its socket;
    ``entry`` (``"module:function"``) is what the process runs, given its socket's number."""

    def __init__(self, init: dict[str, Any],
                 entry: str = "frugalnas.engine.isolation:child_main"):
        mine, theirs = socket.socketpair()
        fd = theirs.fileno()
        module, _, function = entry.partition(":")
        code = (f"import sys; from {module} import {function}; "
                f"{function}(int(sys.argv[1]))")
        try:
            self.proc = subprocess.Popen([sys.executable, "-c", code, str(fd)], pass_fds=(fd,),
                                         stdin=subprocess.DEVNULL, close_fds=True)
        finally:
            theirs.close()
        self.conn = Connection(mine.detach())
        self.conn.send(init)
        self.ready = False
        self.ended: tuple[str, str] | None = None

    def recv(self, deadline: float | None) -> Any:
        while True:
            wait = 1.0 if deadline is None else max(0.0, min(1.0, deadline - time.monotonic()))
            try:
                if self.conn.poll(wait):
                    return self.conn.recv()
            except (EOFError, OSError):
                raise _ChildDied() from None
            if self.proc.poll() is not None:
                raise _ChildDied()
            if deadline is not None and time.monotonic() >= deadline:
                raise _Deadline()

    def send(self, message: Any) -> None:
        try:
            self.conn.send(message)
        except OSError:
            raise _ChildDied() from None

    def reap(self) -> tuple[str, str]:
        """Wait for the dead child: how it died and the fail reason (see :func:`death_reason`)."""
        if self.ended is None:
            try:
                _, status, usage = os.wait4(self.proc.pid, 0)
                self.proc.returncode = -os.WTERMSIG(status) if os.WIFSIGNALED(status) \
                    else os.waitstatus_to_exitcode(status)
                self.ended = death_reason(status, usage.ru_maxrss)
            except ChildProcessError:  # reaped already (by Popen.poll): no rusage left
                code = self.proc.returncode or 0
                status = (-code) if code < 0 else (code << 8)
                self.ended = death_reason(status, 0)
        self.conn.close()
        return self.ended

    def kill(self) -> None:
        with contextlib.suppress(OSError):
            self.proc.kill()
        with contextlib.suppress(Exception):
            self.reap()

    def close(self) -> None:
        """Ask the child to release its backend and exit; kill it if it does not."""
        with contextlib.suppress(Exception):
            self.conn.send(("close",))
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        self.conn.close()


def _portable(exc: BaseException) -> BaseException:
    """``exc`` if it pickles and unpickles, else a CandidateFailure with its one-line reason."""
    try:
        pickle.loads(pickle.dumps(exc))
        return exc
    except Exception:
        return CandidateFailure(failure_reason(exc))


def _watch_parent(parent: int) -> None:
    """Exit when the parent is gone (killed): nothing would read this child's result."""
    while True:
        time.sleep(1.0)
        if os.getppid() != parent:
            os._exit(1)


def failure_reason(exc: BaseException) -> str:
    """A one-line reason for a failed trial; out-of-memory errors say so plainly."""
    import torch

    if isinstance(exc, CandidateFailure):
        return str(exc).splitlines()[0][:2000]
    if isinstance(exc, torch.OutOfMemoryError) or "out of memory" in str(exc).lower():
        if torch.cuda.is_available():
            torch.cuda.empty_cache()
        return f"out of memory: {exc}".splitlines()[0][:2000]
    return f"{type(exc).__name__}: {exc}".splitlines()[0][:2000]


def _child_start(fd: int) -> tuple[Connection, dict[str, Any]]:
    """What every child does first: leave SIGINT and SIGTERM to the parent (which stops its
    children itself), exit when the parent is gone, read the parent's init message."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    threading.Thread(target=_watch_parent, args=(os.getppid(),), daemon=True,
                     name="frugalnas-isolation-parent").start()
    conn = Connection(fd)
    init = _receive(conn)
    sys.path[:] = init["sys_path"]
    return conn, init


def _send(conn: Connection, message: Any) -> None:
    """Send to the parent; a parent that is gone (closed its end) ends this child quietly."""
    try:
        conn.send(message)
    except OSError:
        os._exit(0)


def _receive(conn: Connection) -> Any:
    """Receive from the parent; a parent that is gone ends this child quietly."""
    try:
        return conn.recv()
    except (EOFError, OSError):
        os._exit(0)
