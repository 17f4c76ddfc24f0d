"""The main process's side of a multi-process virtual-node world: rendezvous, local worker
processes, commands, clean shutdown."""

from __future__ import annotations

import atexit
import os
import subprocess
import sys
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from frugalnas.core.errors import ConfigError
from frugalnas.backends.virtual_node.comm import CONFIG_KEY, dumps, error_key, post_command, ready_key
from frugalnas.backends.virtual_node.worker import PARENT_ENV

_ACTIVE: "ProcessWorld | None" = None  # torch.distributed allows one default group per process


class ProcessWorld:
    """Rank 0 of a ``torch.distributed`` world of ``world_size`` processes, ``nproc - 1`` of
    them started here as ``python -m frugalnas.backends.virtual_node.worker``; the others
    (ranks ``nproc`` and up) join from other machines."""

    #: Worlds started in this process so far (tests check that a study starts one).
    started = 0

    def __init__(self, nproc: int, world_size: int, config: dict[str, Any], *,
                 master_addr: str = "127.0.0.1", master_port: int = 0, timeout: float = 300.0):
        self.nproc, self.world_size, self.config = nproc, world_size, config
        self.master_addr, self.master_port, self.timeout = master_addr, master_port, timeout
        self.store: dist.TCPStore | None = None
        self.procs: list[subprocess.Popen] = []
        self.seq = 0

    @property
    def running(self) -> bool:
        return self.store is not None

    def start(self) -> None:
        """Start the rendezvous and the local workers; block until every rank has joined."""
        global _ACTIVE
        if _ACTIVE is not None and _ACTIVE is not self:
            _ACTIVE.close()  # an older backend's world; it restarts itself if used again
        if dist.is_initialized():
            raise ConfigError("a torch.distributed default process group already exists in this "
                              "process; the virtual-node backend (nproc > 1) needs its own, or use "
                              "VirtualNodeEngine inside your SPMD program")
        store = dist.TCPStore(self.master_addr, self.master_port, self.world_size, is_master=True,
                              wait_for_workers=False, timeout=timedelta(seconds=self.timeout))
        store.set(CONFIG_KEY, dumps(self.config))
        self.store, self.seq = store, 0
        _ACTIVE = self
        ProcessWorld.started += 1
        atexit.register(self.close)
        try:
            self._spawn(store.port)
            self._wait_ready()
            dist.init_process_group(self.config["dist_backend"], store=store, rank=0,
                                    world_size=self.world_size, timeout=timedelta(seconds=self.timeout))
        except BaseException:
            self.close()
            raise

    def _spawn(self, port: int) -> None:
        for rank in range(1, self.nproc):
            env = dict(os.environ, MASTER_ADDR=self.master_addr, MASTER_PORT=str(port),
                       RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.world_size),
                       FRUGALNAS_VNODE_TIMEOUT=str(self.timeout), **{PARENT_ENV: str(os.getpid())})
            if self.config["threads"] is not None:
                env["OMP_NUM_THREADS"] = str(self.config["threads"])
            self.procs.append(subprocess.Popen(
                [sys.executable, "-m", "frugalnas.backends.virtual_node.worker"], env=env))

    def _wait_ready(self) -> None:
        """Wait for the local workers to reach the rendezvous, failing fast if one dies."""
        deadline = time.monotonic() + self.timeout
        pending = set(range(1, self.nproc))
        while pending:
            pending = {r for r in pending if not self.store.check([ready_key(r)])}
            dead = [(r, p.returncode) for r, p in enumerate(self.procs, 1) if p.poll() is not None]
            if dead:
                reasons = [f"rank {r}: {self.store.get(error_key(r)).decode()}"
                           for r, _ in dead if self.store.check([error_key(r)])]
                if reasons:  # the worker could not create its inner backend
                    raise ConfigError("virtual-node worker(s) could not start: "
                                      + "; ".join(reasons))
                raise RuntimeError(f"virtual-node worker(s) exited during start-up: {dead}")
            if time.monotonic() > deadline:
                raise TimeoutError(f"virtual-node workers {sorted(pending)} did not start within "
                                   f"{self.timeout:.0f} s")
            time.sleep(0.01)

    def post(self, *command: Any) -> None:
        """Send a command to every worker (they act on them in order)."""
        post_command(self.store, self.seq, dumps(command))
        self.seq += 1

    def close(self) -> None:
        """Stop the workers (politely, then by force) and leave the process group."""
        global _ACTIVE
        if self.store is None:
            return
        try:
            if dist.is_initialized():
                self.post("close")
        except Exception:
            pass
        deadline = time.monotonic() + 15
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        if dist.is_initialized():
            dist.destroy_process_group()
        self.store = None
        if _ACTIVE is self:
            _ACTIVE = None
        atexit.unregister(self.close)
