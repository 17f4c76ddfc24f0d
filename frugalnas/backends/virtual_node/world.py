"""The main process's side of a multi-process virtual-node world: rendezvous, local worker
processes, commands, clean shutdown, and what to say when a rank dies.

The rendezvous store listens on ``master_addr`` only (loopback by default), and what rank 0
writes there is sealed with the world's secret: a random one for a world on this machine
(handed to the local workers on their standard input), the user's ``FRUGALNAS_VNODE_SECRET``
for a world that spans machines."""

from __future__ import annotations

import atexit
import ipaddress
import os
import re
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from datetime import timedelta
from typing import Any

import torch.distributed as dist

from frugalnas.ports.errors import ConfigError, one_line
from frugalnas.backends.virtual_node.checks import SECRET_ENV, world_secret
from frugalnas.backends.virtual_node.comm import (CONFIG_KEY, dumps, error_key, post_command,
                                                  ready_key, reset_group_names, seal)
from frugalnas.backends.virtual_node.worker import PARENT_ENV, SECRET_STDIN_FLAG

_ACTIVE: "ProcessWorld | None" = None  # torch.distributed allows one default group per process


def _make_active(world: "ProcessWorld | None", replacing: "ProcessWorld | None" = None) -> None:
    """Record ``world`` as this process's world (``None``: none), unless ``replacing`` is
    given and another world became active meanwhile."""
    global _ACTIVE
    if replacing is None or _ACTIVE is replacing:
        _ACTIVE = world


def is_loopback(addr: str) -> bool:
    """Whether every address ``addr`` resolves to is a loopback address."""
    try:
        infos = socket.getaddrinfo(addr, None, type=socket.SOCK_STREAM)
    except OSError:
        return False
    return bool(infos) and all(ipaddress.ip_address(i[4][0].split("%")[0]).is_loopback
                               for i in infos)


def loopback_interface() -> str | None:
    """The name of the loopback network interface (``lo`` on Linux, ``lo0`` on macOS)."""
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return None
    return next((n for n in names if n in ("lo", "lo0")), None)


def listening_socket(addr: str, port: int) -> socket.socket:
    """A TCP socket bound to ``addr``:``port`` (0: a free port) and listening."""
    try:
        family, kind, proto, _, where = socket.getaddrinfo(addr, port, type=socket.SOCK_STREAM)[0]
        sock = socket.socket(family, kind, proto)
    except OSError as exc:
        raise ConfigError(f"invalid master_addr {addr!r}: {exc}") from None
    try:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind(where)
        sock.listen(128)
    except OSError as exc:
        sock.close()
        raise ConfigError(f"cannot listen on master_addr {addr!r}, master_port {port}: "
                          f"{exc.strerror or exc}") from None
    return sock


def exit_text(code: int) -> str:
    """How a process ended, from its return code."""
    if code < 0:
        try:
            return f"was killed by {signal.Signals(-code).name}"
        except ValueError:
            return f"was killed by signal {-code}"
    return f"exited with code {code}"


@contextmanager
def environment(values: Mapping[str, str]) -> Iterator[None]:
    """``values`` set in ``os.environ`` (those the user has not set) for the block's duration:
    gloo and NCCL read their network interface from the environment when a group is made."""
    added = {k: v for k, v in values.items() if k not in os.environ}
    os.environ.update(added)
    try:
        yield
    finally:
        for key in added:
            os.environ.pop(key, None)


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
        self.secret = b""
        self.world_id = ""

    @property
    def local(self) -> bool:
        """Whether every rank runs on this machine."""
        return self.world_size == self.nproc

    def network_env(self) -> dict[str, str]:
        """Settings that keep a local gloo world's listeners on the loopback interface (NCCL
        opens its own sockets when it first communicates; see docs/virtual_node.md)."""
        lo = loopback_interface()
        if not self.local or lo is None or not is_loopback(self.master_addr):
            return {}
        return {"GLOO_SOCKET_IFNAME": lo}

    @property
    def running(self) -> bool:
        return self.store is not None

    def start(self) -> None:
        """Start the rendezvous and the local workers; block until every rank has joined."""
        if _ACTIVE is not None and _ACTIVE is not self:
            _ACTIVE.close()  # an older backend's world; it restarts itself if used again
        if dist.is_initialized():
            raise ConfigError("a torch.distributed default process group already exists in this "
                              "process; the virtual-node backend (nproc > 1) needs its own, or use "
                              "VirtualNodeEngine inside your SPMD program")
        secret = world_secret(self.nproc, self.world_size, os.environ)
        listener = listening_socket(self.master_addr, self.master_port)
        port = listener.getsockname()[1]
        fd = listener.detach()  # the store owns (and closes) the socket from here on
        try:
            store = dist.TCPStore(self.master_addr, port, self.world_size, is_master=True,
                                  wait_for_workers=False, timeout=timedelta(seconds=self.timeout),
                                  master_listen_fd=fd)
        except BaseException:
            os.close(fd)
            raise
        self.secret, self.world_id = secret, secrets.token_hex(8)
        config = dict(self.config, world=self.world_id)
        store.set(CONFIG_KEY, seal(secret, CONFIG_KEY, dumps(config)))
        self.store, self.seq = store, 0
        _make_active(self)
        ProcessWorld.started += 1
        atexit.register(self.close)
        try:
            self._spawn(store.port)
            self._wait_ready()
            with environment(self.network_env()):
                dist.init_process_group(self.config["dist_backend"], store=store, rank=0,
                                        world_size=self.world_size,
                                        timeout=timedelta(seconds=self.timeout))
        except BaseException:
            self.close()
            raise

    def _spawn(self, port: int) -> None:
        base = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
        base.update(self.network_env())
        for rank in range(1, self.nproc):
            env = dict(base, MASTER_ADDR=self.master_addr, MASTER_PORT=str(port),
                       RANK=str(rank), LOCAL_RANK=str(rank), WORLD_SIZE=str(self.world_size),
                       FRUGALNAS_VNODE_TIMEOUT=str(self.timeout), **{PARENT_ENV: str(os.getpid())})
            if self.config["threads"] is not None:
                env["OMP_NUM_THREADS"] = str(self.config["threads"])
            # the secret goes through a pipe: not in the store, nor on a command line
            proc = subprocess.Popen([sys.executable, "-m", "frugalnas.backends.virtual_node.worker",
                                     SECRET_STDIN_FLAG], env=env, stdin=subprocess.PIPE)
            self.procs.append(proc)
            proc.stdin.write(self.secret.hex().encode() + b"\n")
            proc.stdin.close()

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
                raise RuntimeError("virtual-node worker(s) exited during start-up: " + ", ".join(
                    f"rank {r} {exit_text(code)}" for r, code in dead))
            if time.monotonic() > deadline:
                raise TimeoutError(f"virtual-node workers {sorted(pending)} did not start within "
                                   f"{self.timeout:.0f} s")
            time.sleep(0.01)

    def post(self, *command: Any) -> None:
        """Send a command to every worker (they act on them in order)."""
        post_command(self.store, self.secret, self.world_id, self.seq, dumps(command))
        self.seq += 1

    def dead_ranks(self) -> list[tuple[int, int]]:
        """Local workers that have ended, as (rank, return code)."""
        return [(r, p.returncode) for r, p in enumerate(self.procs, 1) if p.poll() is not None]

    def failure(self, exc: BaseException, wait: float = 2.0) -> str:
        """What broke the world, given the error a collective raised in rank 0: the local
        ranks that died (waiting up to ``wait`` s for a dying one to be reaped), otherwise the
        error itself, which then comes from a remote rank or the network."""
        deadline = time.monotonic() + wait
        dead = self.dead_ranks()
        while not dead and self.procs and time.monotonic() < deadline:
            time.sleep(0.05)
            dead = self.dead_ranks()
        if dead:
            return "; ".join(f"rank {r} {exit_text(code)}" for r, code in dead)
        error = re.sub(r"\[/[^\]]*\] ", "", one_line(exc))  # gloo's source file and line
        if self.world_size > self.nproc:
            remote = (f"rank {self.nproc}" if self.world_size - self.nproc == 1
                      else f"ranks {self.nproc}-{self.world_size - 1}")
            return f"a remote rank ({remote}) or the network failed: {error}"
        return f"a collective failed: {error}"

    def close(self, force: bool = False) -> None:
        """Stop the workers (politely, then by force; at once with ``force``, for a broken
        world) and leave the process group."""
        if self.store is None:
            return
        try:
            if dist.is_initialized():  # also tells remote ranks of a broken world to rejoin
                self.post("close")
        except Exception:
            pass
        deadline = time.monotonic() + (0 if force else 15)
        for p in self.procs:
            try:
                p.wait(timeout=max(0.1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                p.kill()
                p.wait()
        self.procs = []
        if dist.is_initialized():
            dist.destroy_process_group()
        reset_group_names()
        self.store = None
        _make_active(None, replacing=self)
        atexit.unregister(self.close)
