"""The ``local`` launcher: N worker processes on this machine, so that one ``frugalnas run
--workers N`` uses every core. Each process is a fresh interpreter (``python -c``, never a
fork of a process holding torch threads) that receives its :class:`WorkerJob` on stdin."""

from __future__ import annotations

import os
import pickle
import signal
import subprocess
import sys

from frugalnas.ports.errors import FrugalnasError, one_line
from frugalnas.distribution.launcher import (LaunchError, Launcher, WorkerJob,
                                     check_shared_storage, positive_workers)
from frugalnas.engine.storage_url import operational_failure

_CHILD = "from frugalnas.launchers.local import worker_main; worker_main()"


class LocalLauncher(Launcher):
    """Run a study's trials on ``workers`` processes of this machine (default: one per CPU)
    sharing its storage (sqlite on a local disk is fine)."""

    def __init__(self, workers: int | None = None):
        self.workers = positive_workers(workers if workers is not None else os.cpu_count() or 1,
                                        "number of workers")
        self.where = f"--workers {self.workers}"

    def shared_storage(self, storage: object) -> str:
        """Workers on this machine share its files: a relative sqlite path is made absolute
        (as this process resolves it) instead of refused."""
        if isinstance(storage, str) and storage.startswith("sqlite:///") \
                and not storage[len("sqlite:///"):].startswith(("/", ":memory:")):
            storage = "sqlite:///" + os.path.abspath(storage[len("sqlite:///"):])
        return check_shared_storage(storage, self.where)

    def launch(self, job: WorkerJob) -> None:
        payload = pickle.dumps(job)
        procs: list[subprocess.Popen[bytes]] = []
        try:
            for _ in range(self.workers):
                proc = subprocess.Popen([sys.executable, "-c", _CHILD], stdin=subprocess.PIPE)
                procs.append(proc)
                assert proc.stdin is not None
                proc.stdin.write(payload)
                proc.stdin.close()
            codes = [proc.wait() for proc in procs]
        except BaseException:
            # Ctrl-C or an error here: SIGTERM records each worker's running trial FAIL at once
            # and drains its MLflow writes (as it does for ``frugalnas worker``).
            for proc in procs:
                if proc.poll() is None:
                    proc.send_signal(signal.SIGTERM)
            for proc in procs:
                proc.wait()
            raise
        killed = [(p.pid, -c) for p, c in zip(procs, codes) if c < 0]
        for pid, signum in killed:
            print(f"frugalnas: warning: worker process {pid} was killed by "
                  f"{signal.Signals(signum).name}; its running trial was failed and its "
                  "architecture proposed again", file=sys.stderr, flush=True)
        failed = [(p.pid, c) for p, c in zip(procs, codes) if c > 0]
        if failed:
            raise LaunchError(f"{len(failed)} of {self.workers} worker process(es) failed "
                              f"(process {failed[0][0]}: exit status {failed[0][1]}; its "
                              "error is above)")


def worker_main() -> None:
    """The body of one local worker process: read the job from stdin, run it; an error is
    one line on stderr (exit status 2), an interrupt exit status 130."""
    job: WorkerJob = pickle.loads(sys.stdin.buffer.read())
    try:
        job.run()
    except FrugalnasError as exc:
        print(f"frugalnas: error: worker {os.getpid()}: {exc}", file=sys.stderr, flush=True)
        sys.exit(2)
    except KeyboardInterrupt:
        sys.exit(130)
    except Exception as exc:
        failure = operational_failure(exc, job.storage)
        print(f"frugalnas: error: worker {os.getpid()}: {failure or one_line(exc)}",
              file=sys.stderr, flush=True)
        sys.exit(2)
