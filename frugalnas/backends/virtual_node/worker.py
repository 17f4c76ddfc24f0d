"""A virtual-node worker process: ``python -m frugalnas.backends.virtual_node.worker``.

The virtual-node backend starts local workers itself. To add processes on other machines,
start this module there with the usual ``env://`` variables: ``MASTER_ADDR`` and
``MASTER_PORT`` (the main process's ``master_addr``/``master_port``), ``RANK`` (``nproc`` ..
``world_size - 1``), ``WORLD_SIZE`` and optionally ``LOCAL_RANK`` (the GPU index on that
machine), and ``FRUGALNAS_VNODE_SECRET``, the secret the main process was started with.
Everything else (inner backend, seed, threads, shares, and the plugin host's spec, from which
the worker rebuilds the main process's plugin host to create a plugin's inner backend) comes
from the main process, sealed with that secret; nothing whose seal does not verify is read.
Such a worker serves one world after another (each ``optimize`` of the main process, and the
world rebuilt after a rank died) until it is stopped; ``--once`` ends it after one world."""

from __future__ import annotations

import argparse
import os
import sys
import time
import traceback
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from frugalnas.ports.backend import Backend
from frugalnas.ports.errors import ConfigError, TrialFailure, one_line
from frugalnas.host.plugins import PluginHost
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.backends.virtual_node.checks import SECRET_ENV, secret_from_env
from frugalnas.backends.virtual_node.comm import (CONFIG_KEY, all_ok, broadcast_state, error_key,
                                                  loads, ready_key, reset_group_names, unseal,
                                                  wait_command)
from frugalnas.backends.virtual_node.engine import VirtualNodeEngine

PARENT_ENV = "FRUGALNAS_VNODE_PARENT"
#: Local workers read the world's secret (hex) from their standard input.
SECRET_STDIN_FLAG = "--secret-stdin"


class Refused(Exception):
    """The store holds a configuration whose seal does not verify under this worker's secret."""


def make_inner(name: str, device: str, options: dict[str, Any],
               host: PluginHost | None = None) -> Backend:
    """The backend that runs each virtual node, created from ``host``. The single-device
    backend is built directly (no plugin host needed, so workers start fast); any other is
    looked up in ``host``."""
    if name == "single-device":
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


def connect(env: dict[str, str]) -> dist.TCPStore:
    """A client of the main process's rendezvous store (waits up to the timeout for it)."""
    return dist.TCPStore(env["MASTER_ADDR"], int(env["MASTER_PORT"]), int(env["WORLD_SIZE"]),
                         is_master=False,
                         timeout=timedelta(seconds=float(env.get("FRUGALNAS_VNODE_TIMEOUT", 300))))


def read_config(store: dist.Store, secret: bytes) -> dict[str, Any]:
    """The world's configuration, once its seal verifies; Refused otherwise (unread)."""
    payload = unseal(secret, CONFIG_KEY, store.get(CONFIG_KEY))
    if payload is None:
        raise Refused(f"refused the world's configuration: its seal does not verify (a "
                      f"different {SECRET_ENV} than the main process's, or a value that rank 0 "
                      "did not write); nothing of it was read")
    return loads(payload)


def run_worker(env: dict[str, str] | None = None, secret: bytes | None = None,
               store: dist.Store | None = None, config: dict[str, Any] | None = None) -> int:
    """Join the main process's world and serve its commands until told to stop. ``secret``
    defaults to ``FRUGALNAS_VNODE_SECRET``; ``store`` and ``config``, when given, are an
    already connected store and the configuration read from it."""
    env = dict(os.environ if env is None else env)
    rank, world = int(env["RANK"]), int(env["WORLD_SIZE"])
    local_rank = int(env.get("LOCAL_RANK", rank))
    parent = int(env[PARENT_ENV]) if env.get(PARENT_ENV) else None
    if secret is None:
        secret = secret_from_env(env)
        if secret is None:
            raise ConfigError(f"{SECRET_ENV} is not set; set it to the main process's secret")
    store = connect(env) if store is None else store
    if config is None:
        try:
            config = read_config(store, secret)
        except Refused as exc:
            print(f"virtual-node worker rank {rank}: {exc}", file=sys.stderr)
            store.set(error_key(rank), str(exc).encode())
            return 1
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
        serve(store, engine, inner, parent, secret, config["world"])
    finally:
        dist.destroy_process_group()
    return 0


def serve(store: dist.Store, engine: VirtualNodeEngine, inner: Backend, parent: int | None,
          secret: bytes, world: str) -> None:
    model, seq = None, 0

    def refused(n: int) -> None:
        print(f"virtual-node worker rank {engine.rank}: ignored command {n}: its seal does not "
              "verify (rank 0 did not write it)", file=sys.stderr, flush=True)

    while True:
        payload = wait_command(store, secret, world, seq, parent, refused)
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


def serve_worlds(env: dict[str, str], secret: bytes, retry: float = 2.0) -> int:
    """A remote rank's life: join the main process's world whenever it has one, serve it,
    and wait for the next (a world this worker served already is skipped: its store may still
    be up while the main process closes it). Ends with 2 when the main process's
    configuration does not verify (a different secret)."""
    rank, served, waiting = int(env["RANK"]), "", False
    while True:
        try:
            store = connect(env)
            config = read_config(store, secret)
            if config["world"] == served:
                time.sleep(retry / 4)
                continue
        except Refused as exc:
            print(f"frugalnas: error: virtual-node worker rank {rank}: {exc}", file=sys.stderr)
            return 2
        except dist.DistError:
            if not waiting:
                print(f"virtual-node worker rank {rank}: waiting for the main process at "
                      f"{env['MASTER_ADDR']}:{env['MASTER_PORT']}", file=sys.stderr, flush=True)
            waiting = True
            time.sleep(retry)
            continue
        waiting, served = False, config["world"]
        try:
            run_worker(env, secret, store, config)
        except Exception as exc:  # the world broke (a rank or the main process died)
            print(f"virtual-node worker rank {rank}: the world ended ({one_line(exc)}); waiting "
                  "for the next one", file=sys.stderr, flush=True)
            if dist.is_initialized():
                dist.destroy_process_group()
            reset_group_names()
        del store


def main(argv: list[str] | None = None) -> int:
    """Command-line entry point (all settings come from the environment and the main process)."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(SECRET_STDIN_FLAG, action="store_true",
                        help="read the world's secret (hex) from standard input (the main "
                             "process starts its local workers so)")
    parser.add_argument("--once", action="store_true",
                        help="serve one world, then exit (default for local workers)")
    args = parser.parse_args(argv)
    env = dict(os.environ)
    try:
        if args.secret_stdin:
            secret = bytes.fromhex(sys.stdin.readline().strip())
        else:
            secret = secret_from_env(env)
            if secret is None:
                raise ConfigError(f"{SECRET_ENV} is not set: set it to the secret the main "
                                  "process was started with")
    except (ConfigError, ValueError) as exc:
        print(f"frugalnas: error: {exc}", file=sys.stderr)
        return 2
    if args.secret_stdin or args.once or env.get(PARENT_ENV):
        return run_worker(env, secret)
    return serve_worlds(env, secret)


if __name__ == "__main__":
    code = main()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)  # skip interpreter teardown: the group is already destroyed
