"""A virtual-node world survives its ranks: a rank killed during a step fails that trial with
one line naming it, a rank killed between trials is replaced, and the next trial trains on a
new world (real worker processes killed with SIGKILL; a remote rank started by hand)."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import time

import pytest
import torch
import torch.distributed as dist
from torch import nn

import frugalnas
from frugalnas.backends.virtual_node.backend import VirtualNodeBackend
from frugalnas.backends.virtual_node.checks import SECRET_ENV
from frugalnas.backends.virtual_node.world import ProcessWorld
from frugalnas.ports.errors import TrialFailure


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def batch(step: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(step)
    return torch.randn(8, 1, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)


def fresh(backend: VirtualNodeBackend) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(0)
    model = backend.prepare(nn.Sequential(nn.Flatten(), nn.Linear(64, 16), nn.ReLU(),
                                          nn.Linear(16, 10)))
    return model, torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)


def step(backend, model, opt, s: int, loss_fn=None) -> float:
    return backend.train_step(model, opt, loss_fn or nn.CrossEntropyLoss(), *batch(s), s)


def dies_in_rank_1():
    """A loss function that kills the worker process of rank 1 (sent by value to the worker)."""
    base = nn.CrossEntropyLoss()

    def loss(out, target):
        if os.environ.get("RANK") == "1":
            os.kill(os.getpid(), signal.SIGKILL)
        return base(out, target)

    return loss


@pytest.mark.slow
def test_a_rank_killed_during_a_step_fails_that_step_and_the_next_builds_a_new_world(capfd):
    reference = VirtualNodeBackend(virtual_nodes=2, device="cpu")
    model, opt = fresh(reference)
    expected = [step(reference, model, opt, s) for s in (0, 2, 3)]   # step 1 never happened
    backend = VirtualNodeBackend(virtual_nodes=2, nproc=2, device="cpu", timeout=60)
    try:
        model, opt = fresh(backend)
        got = [step(backend, model, opt, 0)]
        started = ProcessWorld.started
        with pytest.raises(TrialFailure) as failure:
            step(backend, model, opt, 1, dies_in_rank_1())
        assert str(failure.value) == ("virtual-node world broken: rank 1 was killed by SIGKILL; "
                                      "the next training step starts a new world")
        assert not backend._world.running                    # closed at once
        got.append(step(backend, model, opt, 2))             # a new world
        assert ProcessWorld.started == started + 1
        # killed between steps: noticed before the next one, which runs on a new world
        victim = backend._world.procs[0]
        victim.send_signal(signal.SIGKILL)
        victim.wait()
        got.append(step(backend, model, opt, 3))
        assert ProcessWorld.started == started + 2
    finally:
        backend.close()
    assert got == expected                                   # nothing else was lost
    err = capfd.readouterr().err
    assert "virtual-node rank 1 was killed by SIGKILL; starting a new world" in err


@pytest.mark.slow
def test_a_study_goes_on_after_rank_1_is_killed():
    study = frugalnas.create_study(
        space="nb201", strategy="random", estimator="train", dataset="digits", seed=1,
        space_options={"N": 1, "C": 4}, estimator_options={"epochs": 1, "max_steps": 3},
        backend="virtual-node", backend_options={"virtual_nodes": 2, "nproc": 2, "timeout": 60},
        disable_plugins=["mlflow"])
    killed = []

    def kill_rank_1(_study, trial) -> None:   # between trials 0 and 1, and 1 and 2
        if trial.number < 2:
            proc = study.backend._world.procs[0]
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            killed.append(proc.pid)

    started = ProcessWorld.started
    study.optimize(3, callbacks=[kill_rank_1])
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert len(set(killed)) == 2 and ProcessWorld.started - started == 3


@pytest.mark.slow
def test_a_study_goes_on_when_rank_1_is_killed_during_a_trial():
    """Killed while a trial trains: that trial fails with the line naming the rank (or, when
    the kill falls between two steps, trains on a new world), and the next trial completes."""
    study = frugalnas.create_study(
        space="nb201", strategy="random", estimator="train", dataset="digits", seed=2,
        space_options={"N": 1, "C": 4}, estimator_options={"epochs": 3},
        backend="virtual-node", backend_options={"virtual_nodes": 2, "nproc": 2, "timeout": 60},
        disable_plugins=["mlflow"])
    killed = []

    def killer() -> None:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            world = study.backend._world  # the study makes its backend once, under a lock
            if world is not None and world.running and dist.is_initialized():
                time.sleep(0.5)   # the world has started: well inside the first trial's training
                world.procs[0].send_signal(signal.SIGKILL)
                killed.append(world.procs[0].pid)
                return
            time.sleep(0.01)

    thread = threading.Thread(target=killer)
    thread.start()
    study.optimize(2)
    thread.join()
    first, second = study.trials
    assert killed and second.state.name == "COMPLETE"
    if first.state.name == "FAIL":
        assert first.user_attrs["fail_reason"] == (
            "TrialFailure: virtual-node world broken: rank 1 was killed by SIGKILL; the next "
            "training step starts a new world")
    else:
        assert first.state.name == "COMPLETE"


@pytest.mark.slow
def test_a_world_whose_remote_rank_does_not_come_fails_the_trial(monkeypatch):
    monkeypatch.setenv(SECRET_ENV, "a-shared-secret-for-this-test")
    backend = VirtualNodeBackend(virtual_nodes=2, nproc=1, world_size=2, device="cpu",
                                 master_port=free_port(), timeout=2)
    try:
        model, opt = fresh(backend)
        with pytest.raises(TrialFailure, match="^virtual-node world could not start: "):
            step(backend, model, opt, 0)
        assert not backend._world.running
    finally:
        backend.close()


@pytest.mark.slow
def test_a_remote_rank_serves_one_world_after_another(monkeypatch, tmp_path):
    """A worker started by hand (rank 1 of a world of 2 whose main process has nproc=1) does
    not exit when a world is released: it joins the next one (each optimize of a study).
    Killed, it fails the running step with a line saying a remote rank or the network
    failed; started again, it joins the world the next step builds."""
    secret = "a-shared-secret-for-this-test"
    monkeypatch.setenv(SECRET_ENV, secret)
    port = free_port()
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK="1",
               WORLD_SIZE="2", FRUGALNAS_VNODE_TIMEOUT="60")
    err = (tmp_path / "remote.err").open("w")

    def start_remote() -> subprocess.Popen:
        return subprocess.Popen([sys.executable, "-m", "frugalnas.backends.virtual_node.worker"],
                                env=env, stderr=err)

    remote = start_remote()
    try:
        backend = VirtualNodeBackend(virtual_nodes=2, nproc=1, world_size=2, device="cpu",
                                     master_port=port, timeout=60)
        reference = VirtualNodeBackend(virtual_nodes=2, device="cpu")
        for _ in range(2):   # two optimize-like runs: the backend is released in between
            model, opt = fresh(backend)
            ref_model, ref_opt = fresh(reference)
            assert step(backend, model, opt, 0) == step(reference, ref_model, ref_opt, 0)
            backend.release()
            assert remote.poll() is None                 # it waits for the next world
        # the remote rank killed: the main process learns it at the next step's collective
        model, opt = fresh(backend)
        ref_model, ref_opt = fresh(reference)
        expected = [step(reference, ref_model, ref_opt, s) for s in (0, 2)]
        got = [step(backend, model, opt, 0)]
        remote.send_signal(signal.SIGKILL)
        remote.wait()
        with pytest.raises(TrialFailure, match=r"^virtual-node world broken: a remote rank "
                                               r"\(rank 1\) or the network failed: "):
            step(backend, model, opt, 1)
        remote = start_remote()                          # started again by its owner
        got.append(step(backend, model, opt, 2))         # a new world, with it
        assert got == expected
        backend.close()
    finally:
        remote.send_signal(signal.SIGTERM)
        try:
            remote.wait(timeout=10)
        except subprocess.TimeoutExpired:
            remote.kill()
            remote.wait()
        err.close()
    assert "Traceback" not in (tmp_path / "remote.err").read_text()
