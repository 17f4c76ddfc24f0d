"""The ``frugalnas`` command: run a study, join one as a worker, list plugins; plugins add
flags to ``run``/``worker`` and commands of their own (the MLflow plugin adds ``ui``)."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import signal
import sys
import tomllib
import warnings
from collections.abc import Callable
from dataclasses import asdict
from pathlib import Path
from typing import Any, NoReturn

from frugalnas.ports.config import (DEFAULT_MAX_FAILURES, DEFAULT_RUN_HEARTBEAT, ISOLATION_MODES,
                                   StudyConfig, check_run_settings, check_worker_settings,
                                   load_run_file, parse_constraint)
from frugalnas.host.dotted import is_dotted
from frugalnas.ports.errors import (ConfigConflictError, ConfigError, FrugalnasError, Interrupted,
                                   PluginError, PluginNotAllowedError, one_line, raise_interrupted)
from frugalnas.host.kinds import KINDS, OPTION_GROUPS
from frugalnas.host.loading import refused_plugins
from frugalnas.host.plugins import PluginHost
from frugalnas.ports.secrets import mask_text
from frugalnas.engine import builder_guard
from frugalnas.engine.storage_url import check_storage_url, masked, operational_failure
from frugalnas.ports.keys import FAIL_REASON_ATTR


def _parse_value(raw: str) -> Any:
    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _plugin_args(args: argparse.Namespace) -> tuple[list[str], list[str]]:
    return _split(args.plugin)


def _split(values: list[str]) -> tuple[list[str], list[str]]:
    add = [p for p in values if not p.startswith("no:")]
    block = [p[3:] for p in values if p.startswith("no:")]
    return add, block


def _preparse_plugins(argv: list[str]) -> tuple[list[str], list[str]]:
    """The ``-p`` values of a command line, read before the full parser exists (plugins add
    flags and commands to it, as in pytest)."""
    pre = argparse.ArgumentParser(add_help=False)
    pre.add_argument("-p", dest="plugin", action="append", default=[])
    known, _ = pre.parse_known_args(argv)
    return _split(known.plugin)


def _common(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", dest="plugin", action="append", default=[], metavar="NAME",
                        help="load plugin NAME (entry point or module); 'no:NAME' blocks it")


def _study_args(parser: argparse.ArgumentParser, host: PluginHost) -> None:
    parser.add_argument("config", nargs="?", help="TOML run file (flags override its values)")
    for name in ("space", "strategy", "estimator", "backend", "dataset"):
        parser.add_argument(f"--{name}")
    parser.add_argument("--n-trials", type=int)
    parser.add_argument("--timeout", type=float, help="seconds for the whole study")
    parser.add_argument("--trial-timeout", type=float, help="seconds per trial")
    parser.add_argument("--n-jobs", type=int)
    parser.add_argument("--seed", type=int)
    parser.add_argument("--storage", help="optuna storage URL (default: in memory)")
    parser.add_argument("--study-name")
    parser.add_argument("--direction", action="append", choices=("maximize", "minimize"))
    parser.add_argument("--objective", action="append", help="objective name (repeat for several)")
    parser.add_argument("--constraint", action="append", metavar="NAME<=VALUE",
                        help="upper bound on a metric; quote it for the shell, e.g. --constraint 'latency_ms_pixel3<=10' (repeatable; "
                             "adds to the run file's [constraints])")
    parser.add_argument("--pruner", help="pruner name: 'pareto' (several objectives), 'median', "
                                         "'successive-halving', 'hyperband', 'nop'")
    parser.add_argument("-o", "--option", action="append", default=[], metavar="GROUP.KEY=VALUE",
                        help=f"a component option, GROUP one of {', '.join(OPTION_GROUPS)} "
                             "(e.g. -o estimator.epochs=2), or a plugin's option with the "
                             "plugin's name as GROUP")
    parser.add_argument("--virtual-nodes", type=int, help="shorthand for -o backend.virtual_nodes=N")
    parser.add_argument("--nproc", type=int, help="shorthand for -o backend.nproc=N")
    parser.add_argument("--isolate", choices=ISOLATION_MODES, default="auto",
                        help="where each trial is evaluated: 'process' (a child process: a "
                             "candidate that aborts, segfaults or is killed for memory fails "
                             "its trial only), 'none' (this process), 'auto' (default: "
                             "'process' for estimators that train, else 'none')")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the plan, run nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _common(parser)
    _call_hook(host, "frugalnas_run_arguments", parser=parser)


def _call_hook(plugin_host: PluginHost, hook: str, **kwargs: Any) -> None:
    """Call a command-line hook; an exception names the plugin (one line, exit status 2)."""
    def failed(plugin: str, exc: BaseException) -> None:
        if isinstance(exc, FrugalnasError):
            raise exc
        raise PluginError(f"plugin {plugin!r} failed in {hook}: {one_line(exc)}") from exc

    plugin_host.call_each(hook, kwargs, failed)


def resolve_run(args: argparse.Namespace, host: PluginHost) -> tuple[StudyConfig, dict[str, Any]]:
    """Merge a run file and flags into a StudyConfig and the run keys. A plugin the run file
    names is refused (nothing imported) unless the code-loading policy allows it
    (:func:`refused_plugins`: ``-p NAME``, ``FRUGALNAS_PLUGINS_ALLOW``, ...)."""
    add, block = _plugin_args(args)
    if args.config:
        config, run = load_run_file(args.config)
        blocked = set(block) | set(config.disable_plugins)  # never loaded, so never refused
        refused = refused_plugins([p for p in config.plugins if p not in blocked], allowed=add)
        if refused:
            raise PluginNotAllowedError(refused, f"run file {args.config!r}")
        data = asdict(config)
    else:
        data, run = {}, {}
    for name in ("space", "strategy", "estimator", "backend", "dataset", "seed"):
        if getattr(args, name) is not None:
            data[name] = getattr(args, name)
    if is_dotted(str(data.get("space", ""))):
        # A user's space module beside the run file (or in the current directory without
        # one) is importable, as a script's own directory is for python.
        folder = str(Path(args.config).resolve().parent) if args.config else os.getcwd()
        if folder not in sys.path:
            sys.path.insert(0, folder)
    if args.trial_timeout is not None:
        data["trial_timeout"] = args.trial_timeout
    for text in args.constraint or []:
        name, bound = parse_constraint(text)
        data.setdefault("constraints", {})[name] = bound
    if args.pruner is not None:
        data["pruner"] = args.pruner
    if args.direction:
        data["directions"] = args.direction
    if args.objective:
        data["objectives"] = args.objective
    elif args.direction and len(args.direction) == 1 and "objectives" not in data:
        data["objectives"] = ["value"]
    options = list(args.option)
    if args.virtual_nodes is not None:
        options.append(f"backend.virtual_nodes={args.virtual_nodes}")
    if args.nproc is not None:
        options.append(f"backend.nproc={args.nproc}")
    for item in options:
        key, sep, raw = item.partition("=")
        group, dot, opt = key.partition(".")
        if not sep or not dot or not opt:
            raise ConfigError(f"malformed option {item!r}; expected GROUP.KEY=VALUE, e.g. estimator.epochs=2")
        if group in OPTION_GROUPS:
            data.setdefault(f"{group}_options", {})[opt] = _parse_value(raw)
        elif host.has_plugin(group):
            data.setdefault("plugin_options", {}).setdefault(group, {})[opt] = _parse_value(raw)
        else:
            raise ConfigError(f"unknown option group {group!r} in {item!r}; valid: "
                              f"{', '.join(OPTION_GROUPS)} or a plugin name "
                              f"({', '.join(sorted(host.infos))})")
    data["plugins"] = sorted(set(data.get("plugins", [])) | set(add))
    data["disable_plugins"] = sorted(set(data.get("disable_plugins", [])) | set(block))
    _call_hook(host, "frugalnas_run_settings", args=args, settings=data)
    for key in ("n_trials", "timeout", "n_jobs", "storage", "study_name"):
        if getattr(args, key) is not None:
            run[key] = getattr(args, key)
    check_run_settings(run)
    return StudyConfig.from_mapping(data), run


def host_for(config: StudyConfig) -> PluginHost:
    """The plugin host a study with ``config`` runs with."""
    return PluginHost(config.plugins, config.disable_plugins)


def stop_on_sigterm() -> None:
    """SIGTERM (``kill``, systemd, Slurm, Kubernetes) stops the command as Ctrl-C does: the
    running trial fails naming the signal, MLflow is closed, the exit status is 143."""
    signal.signal(signal.SIGTERM, raise_interrupted)


def guard_builder(config: StudyConfig, host: PluginHost, isolate: str) -> None:
    """Where trials are isolated, a define-by-run builder named by a dotted path runs first in
    a guard process whenever this process runs it, space discovery included
    (:func:`frugalnas.engine.builder_guard.guard_builder`)."""
    if isolate != "none" and is_dotted(config.space):
        builder_guard.guard_builder(host, config, isolate)


def check_run(config: StudyConfig, run: dict[str, Any], host: PluginHost) -> None:
    """The checks of a run that need no engine (nor optuna or torch): the run settings, the
    storage URL (scheme, driver, directory) and every component name (:func:`check_names`).
    The rest (options, dataset paths, objectives, each plugin's ``frugalnas_check_config``)
    runs when the plan is made (:func:`frugalnas.cli.plan.plan`)."""
    check_run_settings(run)
    check_storage_url(run.get("storage"))
    check_names(config, host)


def check_names(config: StudyConfig, host: PluginHost) -> None:
    """An :class:`~frugalnas.ports.errors.UnknownComponentError` for the first component name of
    ``config`` that no plugin registers, read from the registries alone: a misspelt name is
    answered before any component's module (torch, scikit-learn, ...) is imported."""
    for group, kind in (("space", "search_spaces"), ("strategy", "strategies"),
                        ("backend", "backends"), ("dataset", "datasets")):
        name = getattr(config, group)
        if name is not None:
            host.registry(kind).get(name)
    host.estimators().get(config.estimator)
    if config.pruner is not None:
        host.registry("pruners").get(config.pruner)


def cmd_run(args: argparse.Namespace) -> int:
    stop_on_sigterm()
    config, run = resolve_run(args, args.host)
    host = host_for(config)
    guard_builder(config, host, args.isolate)
    check_run(config, run, host)
    # The engine's libraries are imported from here on, once every check without them passed.
    from frugalnas.cli.running import run_study

    return _finish(run_study(args, config, run, host), run.get("storage"))


def cmd_worker(args: argparse.Namespace) -> int:
    stop_on_sigterm()
    config, run = resolve_run(args, args.host)
    storage = run.get("storage")
    if not storage or not isinstance(storage, str):
        raise ConfigError("a worker needs a shared storage URL: --storage sqlite:///study.db "
                          "(or journal:PATH, postgresql://..., mysql://...)")
    if storage in ("sqlite://", "sqlite:///:memory:"):
        raise ConfigError(f"a worker needs a shared storage; {storage!r} is in memory (use "
                          "sqlite:///PATH, journal:PATH, postgresql://... or mysql://...)")
    if run.get("n_trials") is None:
        raise ConfigError("a worker needs the study's total number of trials: --n-trials N")
    check_storage_url(storage)
    check_worker_settings(args.heartbeat, args.grace, args.retries, args.max_failures)
    if args.heartbeat and storage.startswith("journal:"):
        raise ConfigError("heartbeats need an RDB storage (sqlite/postgresql/mysql URL); "
                          f"got {storage!r}")
    host = host_for(config)
    guard_builder(config, host, args.isolate)
    check_run(config, run, host)
    # The engine's libraries are imported from here on, once every check without them passed.
    from frugalnas.cli.running import join_study

    return _finish(join_study(args, config, run, host), storage)


def _finish(outcome: tuple[Any, bool] | None, storage: str | None) -> int:
    """The closing lines of ``run`` and ``worker`` (where the results are) and the exit
    status; ``outcome`` is the study and whether no trial completed (``None``: a dry run)."""
    if outcome is None:
        return 0
    study, none_completed = outcome
    _print_locations(study, storage)
    return _exit_status(study, none_completed)


def _print_locations(study: Any, storage: str | None) -> None:
    """Where the study's results are: the optuna storage, then each plugin's own line."""
    if storage:
        print(f"results: optuna study {study.name!r} in {masked(storage)} (continue it by "
              "running the same command again; frugalnas report --storage "
              f"{masked(storage)} --study-name {study.name} prints its leaderboard)")
    else:
        print("results: the optuna study was in memory and is gone (give --storage "
              "sqlite:///frugalnas.db to keep it)")
    lines: list[str] = []

    def failed(plugin: str, exc: BaseException) -> None:
        print(f"frugalnas: warning: plugin {plugin!r} failed in frugalnas_results_location: "
              f"{one_line(exc)}", file=sys.stderr)

    for impl in reversed(study.host.hook.frugalnas_results_location.get_hookimpls()):
        try:
            line = impl.function(study=study)
        except Exception as exc:
            failed(impl.plugin_name, exc)
            continue
        if line:
            lines.append(line)
    for line in lines:
        print(f"results: {line}")


def _exit_status(study: Any, none_completed: bool) -> int:
    """1 with a one-line summary on stderr when no trial completed or a plugin hook raised;
    2 with that one line when a plugin's store failed (a full disk, ...)."""
    failures = [e for e in study.plugin_errors if e.operational]
    if failures:
        return _error(failures[0].error)
    problems = [f"no trial completed{_failure_summary(study)}"] if none_completed else []
    problems += [str(e) for e in study.plugin_errors]
    if not problems:
        return 0
    print(f"frugalnas: error: {mask_text('; '.join(problems))}", file=sys.stderr)
    return 1


def _failure_summary(study: Any) -> str:
    reasons: dict[str, int] = {}
    for t in study.trials:
        reason = t.user_attrs.get(FAIL_REASON_ATTR)
        if t.state.name == "FAIL" and reason:
            reasons[reason] = reasons.get(reason, 0) + 1
    if not reasons:
        return ""
    return "; failures: " + "; ".join(f"{n} x {r}" for r, n in
                                      sorted(reasons.items(), key=lambda kv: -kv[1])[:3])


def cmd_plugins(args: argparse.Namespace) -> int:
    add, block = _plugin_args(args)
    host = PluginHost(add, block)
    for kind in KINDS:  # a failing registration hook is an error before anything is printed
        host.registry(kind)
    if args.json:
        data = {"plugins": [asdict(i) for i in host.infos.values()],
                "components": {k: host.registry(k).describe(options=True) for k in KINDS}}
        print(json.dumps(data, indent=2))
        return 0

    def option_lines(component: Any) -> list[str]:
        """``NAME = DEFAULT`` per option a user may set, ``NAME (required)`` without one."""
        lines = [f"{n} (required)" if d is inspect.Parameter.empty else f"{n} = {d!r}"
                 for n, d in component.user_options().items()]
        if component.accepts_any_option:
            lines.append("(more keyword options: the component checks them itself)")
        return lines or ["(no options)"]
    print("plugins:")
    for info in host.infos.values():
        where = f"{info.distribution} {info.version}" if info.distribution else "frugalnas (built-in)" \
            if info.source == "builtin" else info.module
        print(f"  {info.name:<16} {info.source:<10} {info.module:<45} {where}")
    for kind, label in KINDS.items():
        reg = host.registry(kind)
        print(f"\n{kind.replace('_', ' ')} ({len(reg)}):")
        for row in reg.describe():
            print(f"  {row['name']:<24} [{row['plugin']}] {row['summary']}")
            if args.verbose:
                for line in option_lines(reg.get(row["name"])):
                    print(f"      {line}")
    return 0


class _OneLineParser(argparse.ArgumentParser):
    """A parser whose usage errors are one line (``frugalnas: error: ...``, exit status 2)
    pointing at ``--help``, instead of a usage block."""

    def error(self, message: str) -> NoReturn:
        text = " ".join(message.split())
        print(f"frugalnas: error: {text} (see '{self.prog} --help')", file=sys.stderr)
        sys.exit(2)


def build_parser(host: PluginHost) -> argparse.ArgumentParser:
    """The full parser: the built-in commands plus those and the flags ``host``'s plugins add."""
    parser = _OneLineParser(prog="frugalnas", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or continue) a study")
    _study_args(run, host)
    run.add_argument("--heartbeat", type=int,
                     help=f"seconds between heartbeats on a database storage (default "
                          f"{DEFAULT_RUN_HEARTBEAT}; 0: none): a later run fails the trials of "
                          "a run that died")
    run.add_argument("--grace", type=int, help="seconds without heartbeat before a trial is "
                                               "stale (default 2x heartbeat)")
    run.set_defaults(func=cmd_run)
    worker = sub.add_parser("worker", help="join a shared study as one of many worker processes")
    _study_args(worker, host)
    worker.add_argument("--heartbeat", type=int, help="seconds between heartbeats (enables stale-trial detection)")
    worker.add_argument("--grace", type=int, help="seconds without heartbeat before a trial is stale (default 2x heartbeat)")
    worker.add_argument("--retries", type=int, default=0, help="re-run a stale trial's architecture up to N times")
    worker.add_argument("--max-failures", type=int, default=DEFAULT_MAX_FAILURES,
                        help="stop after this many of the worker's trials failed in a row "
                             f"(default {DEFAULT_MAX_FAILURES}; 0: never)")
    worker.set_defaults(func=cmd_worker)
    plugins = sub.add_parser("plugins", help="list plugins and the components they register")
    plugins.add_argument("--json", action="store_true",
                         help="print plugins and components (with their options) as JSON")
    plugins.add_argument("-v", "--verbose", action="store_true",
                         help="list each component's options with their defaults")
    _common(plugins)
    plugins.set_defaults(func=cmd_plugins)
    _call_hook(host, "frugalnas_commands", subparsers=sub, host=host)
    return parser


#: Third-party warnings that say nothing about the user's command. requests silences
#: urllib3's notice that SOCKS proxies need PySocks with a filter it adds while importing, which
#: another thread leaving ``warnings.catch_warnings`` at that moment can drop (the filters are
#: process-wide): the notice then lands on stderr beside the command's one-line answer.
QUIET_WARNINGS = ("SOCKS support in urllib3 requires",)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    for message in QUIET_WARNINGS:  # by message: no import of the warning's package
        warnings.filterwarnings("ignore", message=message)
    try:
        host = PluginHost(*_preparse_plugins(argv))
        parser = build_parser(host)
    except FrugalnasError as exc:
        return _error(exc)
    args = parser.parse_args(argv)
    args.host = host
    # Each command's function (ours and those of frugalnas_commands) returns the exit status.
    func: Callable[[argparse.Namespace], int] = args.func
    try:
        return func(args)
    except (ConfigConflictError, PluginNotAllowedError) as exc:
        return _error(exc.for_cli())
    except FrugalnasError as exc:
        return _error(exc)
    except KeyboardInterrupt as exc:
        stop = exc if isinstance(exc, Interrupted) else Interrupted(signal.SIGINT)
        print(f"frugalnas: {stop}; completed trials are saved in the storage", file=sys.stderr)
        return 128 + stop.signum
    except Exception as exc:
        failure = operational_failure(exc, getattr(args, "storage", None))
        if failure is None:
            raise
        return _error(failure)


def _error(message: object) -> int:
    """Print one line ``frugalnas: error: ...`` on stderr; exit status 2 (bad input)."""
    text = mask_text(" ".join(str(message).split("\n")))
    print(f"frugalnas: error: {text}", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
