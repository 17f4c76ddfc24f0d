"""A virtual-node worker process: ``python -m frugalnas.backends.virtual_node.worker``.

The virtual-node backend starts local workers itself. To add processes on other machines,
start this module there with the usual ``env://`` variables: ``MASTER_ADDR`` and
``MASTER_PORT`` (the main process's ``master_addr``/``master_port``), ``RANK`` (``nproc`` ..
``world_size - 1``), ``WORLD_SIZE`` and optionally ``LOCAL_RANK`` (the GPU index on that
machine). Everything else (inner backend, seed, threads, shares, and the plugin host's spec,
from which the worker rebuilds the main process's plugin host to create a plugin's inner
backend) comes from the main process."""

from __future__ import annotations

import argparse
import os
import sys
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from frugalnas.core.backend import Backend
from frugalnas.core.errors import ConfigError, TrialFailure
from frugalnas.core.plugins import PluginHost
from frugalnas.backends.virtual_node.comm import (CONFIG_KEY, all_ok, broadcast_state, error_key,
                                                  loads, ready_key, wait_command)
from frugalnas.backends.virtual_node.engine import VirtualNodeEngine

PARENT_ENV = "FRUGALNAS_VNODE_PARENT"


def make_inner(name: str, device: str, options: dict[str, Any],
               host: PluginHost | None = None) -> Backend:
    """The backend that runs each virtual node, created from ``host``. The single-device
    backend is built directly (no plugin host needed, so workers start fast); any other is
    looked up in ``host``."""
    if name == "single-device":
        from frugalnas.backends.single_device import SingleDeviceBackend

        return SingleDeviceBackend(device=device, **options)
    if host is None:
        raise ConfigError(f"inner backend {name!r} needs the study's plugin host")
    return host.create("backends", name, device=device, **options)


def host_from_spec(spec: dict[str, Any] | None) -> PluginHost:
    """The main process's plugin host, rebuilt from ``PluginHost.spec()`` (same plugins by
    name, same blocked names)."""
    return PluginHost(**(spec or {}))


def worker_device(config: dict[str, Any], local_rank: int) -> str:
    if config["dist_backend"] == "nccl":
        index = (config["first_gpu"] + local_rank) % max(1, torch.cuda.device_count())
        torch.cuda.set_device(index)
        return f"cuda:{index}"
    return config.get("worker_device", "cpu")


def run_worker(env: dict[str, str] | None = None) -> int:
    """Join the main process's world and serve its commands until told to stop."""
    env = dict(os.environ if env is None else env)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", rank))
    parent = int(env[PARENT_ENV]) if env.get(PARENT_ENV) else None
    store = dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), world, is_master=False,
                          timeout=timedelta(seconds=float(env.get("FRUGALNAS_VNODE_TIMEOUT", 300))))
    config = loads(store.get(CONFIG_KEY))
    if config["threads"] is not None:
        torch.set_num_threads(config["threads"])
    device = worker_device(config, local_rank)
    timeout = timedelta(seconds=config["timeout"])
    try:  # before joining, so that a failure ends start-up at once, with its reason
        host = None if config["inner"] == "single-device" else host_from_spec(config.get("host"))
        inner = make_inner(config["inner"], device, config["inner_options"], host)
    except Exception as exc:
        traceback.print_exc()
        store.set(error_key(rank), f"{type(exc).__name__}: {exc}".encode())
        return 1
    store.set(ready_key(rank), b"1")
    dist.init_process_group(config["dist_backend"], store=store, rank=rank, world_size=world,
                            timeout=timeout)
    try:
        engine = VirtualNodeEngine(config["virtual_nodes"], inner, seed=config["seed"],
                                   shares=config["shares"], throughput=config["throughput"],
                                   threads=config["threads"])
        serve(store, engine, inner, parent)
    finally:
        dist.destroy_process_group()
    return 0


def serve(store: dist.Store, engine: VirtualNodeEngine, inner: Backend, parent: int | None) -> None:
    model, seq = None, 0
    while True:
        payload = wait_command(store, seq, parent)
        if payload is None:
            return
        seq += 1
        kind, *args = loads(payload)
        if kind == "close":
            return
        if kind == "model":
            ok = True
            try:
                model = inner.prepare(loads(args[0], map_location=inner.device))
                engine.reset()
                inner.trial_outputs()  # nobody collects them here: drop the last model's
            except Exception:
                traceback.print_exc()
                ok, model = False, None
            all_ok(ok, engine.comm_device)
        elif kind == "step":
            step, training, loss_fn, inputs, targets = args
            model.train(training)
            broadcast_state(model, engine.comm_device)
            try:
                engine.compute(model, loss_fn, inputs, targets, step, apply=False)
            except TrialFailure as exc:  # rank 0 raises it for the trial; stay available
                print(f"virtual-node worker {engine.rank}: {exc}", file=sys.stderr)


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (all settings come from the environment and the main process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.parse_args(argv)
    return run_worker()


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: the group is already destroyed
