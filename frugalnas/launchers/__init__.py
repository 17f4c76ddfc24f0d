"""Built-in plugin "launchers": a study's trials on many worker processes.

Two launchers are registered (``frugalnas_launchers``): ``local`` starts N worker processes on
this machine, ``dask`` runs workers as tasks on an existing Dask cluster (``tcp://HOST:PORT``).
Every worker runs :class:`~frugalnas.distribution.launcher.WorkerJob`, i.e. ``run_worker`` on the
study's shared storage, so the quota is exact and a worker that dies loses only its running
trial (failed once its heartbeat is stale, its architecture proposed again).

``frugalnas run`` gets ``--workers N``, ``--cluster ADDRESS`` and ``--resources NAME=AMOUNT``
from this plugin (``frugalnas_run_arguments``); they become the plugin's run options
(``plugin_options["launchers"]``: ``workers``, ``cluster``, ``resources``), which workers of one
study may set differently, and ``frugalnas_launcher`` turns them into a launcher. From Python,
:func:`launch` runs a study's quota with a launcher. docs/cluster.md describes both.
"""

from __future__ import annotations

import argparse
import re
from typing import Any

from frugalnas.ports.config import StudyConfig
from frugalnas.ports.errors import ConfigError
from frugalnas.distribution.launcher import Launcher, WorkerJob, check_shared_storage, positive_workers
from frugalnas.host.plugins import PluginHost, hookimpl
from frugalnas.launchers.dask_cluster import DaskLauncher, check_address
from frugalnas.launchers.local import LocalLauncher
from frugalnas.ports.lazy import lazy_attributes
from frugalnas.ports.secrets import OptionRoles

# The plugin loads with every command; launch (the engine, optuna, torch) when first used.
__getattr__ = lazy_attributes(__name__, {"launch": "frugalnas.launchers.launching"})

PLUGIN = "launchers"
OPTIONS = ("cluster", "workers", "resources")
_RESOURCE = re.compile(r"^([A-Za-z_][A-Za-z0-9_\-]*)=([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)$")


def parse_resources(values: list[str] | str) -> dict[str, float]:
    """``["GPU=1", "MEMORY=4e9"]`` (or ``"GPU=1,MEMORY=4e9"``) as ``{"GPU": 1.0, ...}``."""
    items = [values] if isinstance(values, str) else list(values)
    out: dict[str, float] = {}
    for item in items:
        for part in re.split(r"[,\s]+", item.strip()):
            if not part:
                continue
            match = _RESOURCE.match(part)
            if match is None:
                raise ConfigError(f"invalid resource {part!r}; expected NAME=AMOUNT with a "
                                  "number >= 0, e.g. --resources GPU=1 (several: GPU=1,MEMORY=4e9)")
            out[match[1]] = float(match[2])
    return out


def check_options(options: dict[str, Any]) -> None:
    """Raise ConfigError for a launcher option (``plugin_options["launchers"]``) that cannot
    work, naming it and the valid ones."""
    for key in options:
        if key not in OPTIONS:
            raise ConfigError(f"unknown option {key!r} of plugin {PLUGIN!r}; valid options: "
                              f"{', '.join(OPTIONS)}")
    cluster = options.get("cluster")
    if cluster is not None:
        check_address(cluster)
    if options.get("workers") is not None:
        positive_workers(options["workers"], "number of workers")
    resources = options.get("resources")
    if resources is not None:
        if not isinstance(resources, dict) or not all(
                isinstance(k, str) and isinstance(v, (int, float)) and not isinstance(v, bool)
                and v >= 0 for k, v in resources.items()):
            raise ConfigError(f"invalid resources {resources!r}; expected {{NAME: AMOUNT}}, "
                              "e.g. {GPU = 1}")
        if cluster is None:
            raise ConfigError("--resources (launchers.resources) needs a Dask cluster "
                              "(--cluster tcp://HOST:PORT), whose workers declare them")


def launcher_from_options(options: dict[str, Any], host: PluginHost) -> Launcher | None:
    """The launcher that ``options`` (``plugin_options["launchers"]``) ask for, or ``None``."""
    check_options(options)
    if options.get("cluster") is not None:
        launcher: Launcher = host.create("launchers", "dask", address=options["cluster"],
                                         workers=options.get("workers"),
                                         resources=options.get("resources") or {})
        return launcher
    if options.get("workers") is not None:
        local: Launcher = host.create("launchers", "local", workers=options["workers"])
        return local
    return None


# -- the plugin's hooks --------------------------------------------------------------------
@hookimpl
def frugalnas_launchers() -> dict[str, Any]:
    return {"local": LocalLauncher, "dask": DaskLauncher}


@hookimpl
def frugalnas_option_roles() -> OptionRoles:
    # Where a run's workers run is a setting of that run: another run of the same study may
    # use another cluster, or none.
    return OptionRoles(run=OPTIONS)


@hookimpl
def frugalnas_run_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--workers", type=int, metavar="N",
                        help="run the trials on N worker processes: on this machine, or with "
                             "--cluster as N tasks on the cluster (default: one per worker "
                             "thread); needs a storage the workers share")
    parser.add_argument("--cluster", metavar="tcp://HOST:PORT",
                        help="run the trials on the workers of this Dask cluster (its "
                             "scheduler's address)")
    parser.add_argument("--resources", action="append", metavar="NAME=AMOUNT",
                        help="Dask worker resources each worker task holds while it runs "
                             "trials, e.g. GPU=1 (repeatable; with --cluster)")


@hookimpl
def frugalnas_run_settings(args: argparse.Namespace, settings: dict[str, Any]) -> None:
    given = {"cluster": getattr(args, "cluster", None), "workers": getattr(args, "workers", None),
             "resources": getattr(args, "resources", None)}
    given = {k: v for k, v in given.items() if v is not None}
    if not given:
        return
    if getattr(args, "command", None) == "worker":
        raise ConfigError(f"--{', --'.join(given)} {'is a flag' if len(given) == 1 else 'are flags'}"
                          " of frugalnas run; frugalnas worker is one worker process")
    options = settings.setdefault("plugin_options", {}).setdefault(PLUGIN, {})
    if "resources" in given:
        given["resources"] = parse_resources(given["resources"])
    options.update(given)
    check_options(options)


@hookimpl
def frugalnas_check_config(config: StudyConfig, host: PluginHost) -> None:
    check_options(dict(config.plugin_options.get(PLUGIN, {})))


@hookimpl
def frugalnas_launcher(config: StudyConfig, host: PluginHost) -> Launcher | None:
    return launcher_from_options(dict(config.plugin_options.get(PLUGIN, {})), host)


__all__ = ["launch", "parse_resources", "check_shared_storage", "Launcher", "WorkerJob"]
