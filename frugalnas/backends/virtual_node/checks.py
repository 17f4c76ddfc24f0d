"""What the virtual-node backend checks without torch, so that its plugin checks a study's
options before the first trial without importing the backend: the options themselves
(:func:`check_config`), whether worker processes can create the inner backend, and the shared
secret of a world that spans machines."""

from __future__ import annotations

import os
import secrets
from collections.abc import Mapping
from typing import Any

from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost

#: The backend's registered name (``VirtualNodeBackend.name``).
NAME = "virtual-node"
#: The shared secret of a world that spans machines (set on every machine).
SECRET_ENV = "FRUGALNAS_VNODE_SECRET"
MIN_SECRET_CHARS = 16


def secret_from_env(env: Mapping[str, str]) -> bytes | None:
    """The user's shared secret from ``FRUGALNAS_VNODE_SECRET``; None when unset. Raises
    ConfigError when it is too short to be a secret."""
    value = env.get(SECRET_ENV)
    if not value:
        return None
    if len(value) < MIN_SECRET_CHARS:
        raise ConfigError(f"invalid {SECRET_ENV}: {len(value)} characters; expected at least "
                          f"{MIN_SECRET_CHARS} (for example: python -c 'import secrets; "
                          "print(secrets.token_hex(32))')")
    return value.encode()


def world_secret(nproc: int, world_size: int, env: Mapping[str, str]) -> bytes:
    """The key that seals rank 0's messages: random for a world on this machine, the user's
    ``FRUGALNAS_VNODE_SECRET`` (which remote ranks read too) for one that spans machines."""
    if world_size == nproc:
        return secrets.token_bytes(32)
    secret = secret_from_env(env)
    if secret is None:
        raise ConfigError(
            f"a virtual-node world with ranks on other machines (world_size {world_size} > "
            f"nproc {nproc}) needs a shared secret: set {SECRET_ENV} to the same random string "
            f"(at least 16 characters) here and for every remote worker")
    return secret


def check_inner_travels(host: PluginHost, inner: str, workers: int) -> None:
    """Raise ConfigError unless worker processes can create backend ``inner``: they rebuild
    the plugin host from ``host.spec()``, which names plugins; a plugin given as an object
    cannot travel."""
    component = host.registry("backends").get(inner)
    info = host.infos.get(component.plugin)
    if info is not None and info.source == "explicit" and component.plugin not in host.named_plugins:
        raise ConfigError(
            f"invalid inner {inner!r} with {workers} worker process(es): backend {inner!r} comes "
            f"from plugin {component.plugin!r}, which was passed as an object; worker processes "
            "rebuild the plugin host from plugin names and cannot load it. Pass the plugin by "
            "module name or entry point name (plugins=['my_package.my_plugin']), or use nproc=1")


def check_config(config: Any, host: Any) -> None:
    """Before a study starts (the plugin's ``frugalnas_check_config``): the inner backend
    exists, takes its ``inner_options``, and can be created by the worker processes (its
    plugin travels by name); a world across machines has its shared secret."""
    if config.backend != NAME:
        return
    options = config.backend_options
    inner = options.get("inner", "single-device")
    if not isinstance(inner, str) or inner == NAME:
        return  # the constructor says what is wrong
    component = host.registry("backends").get(inner)
    inner_options = options.get("inner_options") or {}
    if isinstance(inner_options, dict):
        component.check_options(dict(inner_options))
    nproc = options.get("nproc", 1)
    world = options.get("world_size") or nproc
    if inner != "single-device" and isinstance(world, int) and world > 1:
        check_inner_travels(host, inner, world - 1)
    if isinstance(nproc, int) and isinstance(world, int) and world > nproc:
        world_secret(nproc, world, os.environ)
