"""The virtual-node command channel, attacked from outside: its listeners are on loopback,
and nothing another process writes into the rendezvous store is run by a worker (real worker
processes, a real outsider process, real TCPStores)."""

from __future__ import annotations

import io
import ipaddress
import os
import socket
import subprocess
import sys
import textwrap
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
from torch import nn

from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
from frugalnas.backends.virtual_node.checks import SECRET_ENV
from frugalnas.backends.virtual_node.comm import CONFIG_KEY, PREFIX, loads, seal
from frugalnas.backends.virtual_node.world import listening_socket
from frugalnas.ports.errors import ConfigError

#: The outsider: a pickle that creates ``marker`` when it is loaded, written into the store
#: as the configuration and as the next commands, bare and with a made-up 32-byte tag.
OUTSIDER = '''
import sys, torch, io, torch.distributed as dist
from datetime import timedelta

class Evil:
    def __reduce__(self):
        return (open, (sys.argv[2], "w"))

buf = io.BytesIO()
torch.save(Evil(), buf)
evil = buf.getvalue()
open(sys.argv[3], "wb").write(evil)
store = dist.TCPStore("127.0.0.1", int(sys.argv[1]), is_master=False, timeout=timedelta(seconds=20))
first = int(sys.argv[4])
store.set("frugalnas-vnode/config", evil)
for seq in range(first, first + 40):
    store.set(f"frugalnas-vnode/cmd/{seq}", (b"\\0" * 32 + evil) if seq % 2 else evil)
print("written")
'''


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)


def losses(backend: VirtualNodeBackend, model: nn.Module, opt, steps: range) -> list[float]:
    return [backend.train_step(model, opt, nn.CrossEntropyLoss(), *batch(s), s) for s in steps]


def fresh(backend: VirtualNodeBackend) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = backend.prepare(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(),
                                          nn.Linear(16, 10)))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def tcp_listeners(pid: int) -> list[tuple[str, int]]:
    """(address, port) of every TCP socket process ``pid`` listens on, from /proc."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            link = os.readlink(fd)
        except OSError:
            continue
        if link.startswith("socket:["):
            inodes.add(link[8:-1])
    found = []
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        for line in Path(f"/proc/{pid}/net/{table}").read_text().splitlines()[1:]:
            fields = line.split()
            if fields[3] != "0A" or fields[9] not in inodes:  # 0A: LISTEN
                continue
            addr_hex, port_hex = fields[1].split(":")
            raw = bytes.fromhex(addr_hex)
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))  # host order
            found.append((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return found


@pytest.mark.slow
@pytest.mark.skipif(not Path("/proc/self/net/tcp").exists(), reason="needs Linux /proc")
def test_outsider_writing_into_the_store_runs_nothing(tmp_path, capfd):
    marker, payload = tmp_path / "pwned", tmp_path / "payload.pt"
    reference = VirtualNodeBackend(virtual_nodes=2, device="cpu")
    expected = losses(reference, *fresh(reference), range(6))
    before = set(tcp_listeners(os.getpid()))  # other tests of this process may have some
    backend = VirtualNodeBackend(virtual_nodes=2, nproc=2, device="cpu", timeout=60)
    try:
        model, opt = fresh(backend)
        got = losses(backend, model, opt, range(2))
        world = backend._world
        ours = set(tcp_listeners(os.getpid())) - before
        for proc in world.procs:
            ours |= set(tcp_listeners(proc.pid))
        assert ("127.0.0.1", world.store.port) in ours and len(ours) >= 3  # store, 2 x gloo
        assert all(ipaddress.ip_address(addr).is_loopback for addr, _ in ours), ours
        outsider = subprocess.run(
            [sys.executable, "-c", textwrap.dedent(OUTSIDER), str(world.store.port), str(marker),
             str(payload), str(world.seq)], capture_output=True, text=True, timeout=60, check=False)
        assert outsider.returncode == 0 and "written" in outsider.stdout, outsider.stderr
        got += losses(backend, model, opt, range(2, 6))   # the real commands win
        assert world.running and backend._world is world  # the same world served them
    finally:
        backend.close()
    assert not marker.exists()
    assert got == expected                                # trained exactly as one process
    assert "ignored command" in capfd.readouterr().err
    loads(payload.read_bytes())                           # the payload was a real threat:
    assert marker.exists()                                # loaded unchecked, it runs


@pytest.mark.slow
def test_a_worker_refuses_a_configuration_it_cannot_verify(tmp_path):
    """A worker facing a store whose configuration is not sealed with its secret (written by
    someone else, or a main process with another secret) reads nothing of it and says so."""
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    buf = io.BytesIO()
    torch.save(Evil(), buf)
    listener = listening_socket("127.0.0.1", 0)
    port = listener.getsockname()[1]
    store = dist.TCPStore("127.0.0.1", port, 2, is_master=True, wait_for_workers=False,
                          timeout=timedelta(seconds=30), master_listen_fd=listener.detach())
    store.set(CONFIG_KEY, seal(b"not the worker's secret", CONFIG_KEY, buf.getvalue()))
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="1",
               WORLD_SIZE="2", FRUGALNAS_VNODE_TIMEOUT="30")
    for flag, secret_in, secret_env in (
            (["--secret-stdin"], os.urandom(32).hex() + "\n", None),       # a local worker
            (["--once"], "", "a-remote-secret-of-enough-length"),          # a remote one
            ([], "", "a-remote-secret-of-enough-length")):                 # a persistent one
        run_env = dict(env)
        run_env.pop(SECRET_ENV, None)
        if secret_env:
            run_env[SECRET_ENV] = secret_env
        proc = subprocess.run([sys.executable, "-m", "frugalnas.backends.virtual_node.worker",
                               *flag], input=secret_in, env=run_env, capture_output=True,
                              text=True, timeout=60, check=False)
        assert proc.returncode in (1, 2), proc.stderr
        assert "refused the world's configuration: its seal does not verify" in proc.stderr
        assert "Traceback" not in proc.stderr
    assert store.get(PREFIX + "error/1").startswith(b"refused")
    assert not marker.exists()


def test_a_world_across_machines_needs_a_shared_secret(monkeypatch):
    monkeypatch.delenv(SECRET_ENV, raising=False)
    with pytest.raises(ConfigError, match=f"needs a shared secret: set {SECRET_ENV}"):
        VirtualNodeBackend(nproc=1, world_size=2, device="cpu")
    monkeypatch.setenv(SECRET_ENV, "short")
    with pytest.raises(ConfigError, match=f"invalid {SECRET_ENV}: 5 characters; expected at "
                                          "least 16"):
        VirtualNodeBackend(nproc=1, world_size=2, device="cpu")
    monkeypatch.setenv(SECRET_ENV, "x" * 16)
    assert VirtualNodeBackend(nproc=1, world_size=2, device="cpu").world_size == 2
    VirtualNodeBackend(nproc=2, device="cpu")   # one machine: a random secret, nothing to set


@pytest.mark.slow
def test_a_remote_worker_without_the_secret_stops_with_one_line():
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    env.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="1", RANK="1", WORLD_SIZE="2")
    proc = subprocess.run([sys.executable, "-m", "frugalnas.backends.virtual_node.worker"],
                          env=env, capture_output=True, text=True, timeout=60, check=False)
    assert proc.returncode == 2
    assert proc.stderr == (f"frugalnas: error: {SECRET_ENV} is not set: set it to the secret "
                           "the main process was started with\n")


@pytest.mark.slow
def test_frugalnas_run_refuses_a_world_across_machines_without_a_secret(tmp_path):
    env = {k: v for k, v in os.environ.items() if k != SECRET_ENV}
    work = tmp_path / "work"
    work.mkdir()
    for extra in (["--dry-run"], ["--storage", f"sqlite:///{work / 'study.db'}"]):
        proc = subprocess.run(
            ["frugalnas", "run", "--space", "nb201", "--estimator", "train", "--dataset",
             "digits", "--backend", "virtual-node", "-o", "backend.world_size=2",
             "--n-trials", "1", *extra],
            cwd=work, env=env, capture_output=True, text=True, timeout=120, check=False)
        assert proc.returncode == 2 and proc.stdout == ""
        assert proc.stderr == (
            "frugalnas: error: a virtual-node world with ranks on other machines (world_size 2 "
            f"> nproc 1) needs a shared secret: set {SECRET_ENV} to the same random string (at "
            "least 16 characters) here and for every remote worker\n")
    assert list(work.iterdir()) == []
