"""The ``frugalnas`` command: run a study, join one as a worker, list plugins; plugins add
flags to ``run``/``worker`` and commands of their own (the MLflow plugin adds ``ui``)."""

from __future__ import annotations

import argparse
import inspect
import json
import os
import subprocess
import sys
import tomllib
from dataclasses import asdict
from typing import Any

from frugalnas.core.config import RUN_KEYS, StudyConfig, check_keys, load_run_file
from frugalnas.core.errors import ConfigError, FrugalnasError
from frugalnas.core.plugins import KINDS, PluginHost

OPTION_GROUPS = ("space", "strategy", "estimator", "backend", "dataset")


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
    parser.add_argument("-o", "--option", action="append", default=[], metavar="GROUP.KEY=VALUE",
                        help=f"a component option, GROUP one of {', '.join(OPTION_GROUPS)} "
                             "(e.g. -o estimator.epochs=2), or a plugin's option with the "
                             "plugin's name as GROUP")
    parser.add_argument("--virtual-nodes", type=int, help="shorthand for -o backend.virtual_nodes=N")
    parser.add_argument("--nproc", type=int, help="shorthand for -o backend.nproc=N")
    parser.add_argument("--dry-run", action="store_true", help="validate and print the plan, run nothing")
    parser.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    _common(parser)
    host.hook.frugalnas_run_arguments(parser=parser)


def resolve_run(args: argparse.Namespace, host: PluginHost) -> tuple[StudyConfig, dict[str, Any]]:
    """Merge a run file and flags into a StudyConfig and the run keys."""
    if args.config:
        config, run = load_run_file(args.config)
        data = asdict(config)
    else:
        data, run = {}, {}
    for name in ("space", "strategy", "estimator", "backend", "dataset", "seed"):
        if getattr(args, name) is not None:
            data[name] = getattr(args, name)
    if args.trial_timeout is not None:
        data["trial_timeout"] = args.trial_timeout
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
    add, block = _plugin_args(args)
    data["plugins"] = sorted(set(data.get("plugins", [])) | set(add))
    data["disable_plugins"] = sorted(set(data.get("disable_plugins", [])) | set(block))
    host.hook.frugalnas_run_settings(args=args, settings=data)
    for key in ("n_trials", "timeout", "n_jobs", "storage", "study_name"):
        if getattr(args, key) is not None:
            run[key] = getattr(args, key)
    check_keys("run settings", run, list(RUN_KEYS))
    return StudyConfig.from_mapping(data), run


def plan(config: StudyConfig, run: dict[str, Any], host: PluginHost) -> dict[str, Any]:
    """Run every check that can run before the first trial (``check_config``, plus creating
    the cheap components); return the resolved plan (names, source plugins, options with
    defaults)."""
    from frugalnas.core.study import check_config, make_strategy

    check_config(host, config)
    space = host.create("search_spaces", config.space, **config.space_options)
    make_strategy(host, space, config)
    out: dict[str, Any] = {"run": run}
    for group, kind in (("space", "search_spaces"), ("strategy", "strategies"),
                        ("backend", "backends"), ("dataset", "datasets")):
        name = getattr(config, group)
        if name is None:
            continue
        comp = host.registry(kind).get(name)
        defaults = {k: v for k, v in comp.options().items()
                    if k not in ("space", "seed") and v is not inspect.Parameter.empty}
        out[group] = {"name": name, "plugin": comp.plugin,
                      "options": {**defaults, **getattr(config, f"{group}_options")}}
    out["estimator"] = {"name": config.estimator,
                        "plugin": host.estimators().get(config.estimator).plugin,
                        "options": config.estimator_options}
    out["objectives"] = dict(zip(config.objectives, config.directions))
    out["seed"] = config.seed
    out["plugin_options"] = config.plugin_options
    out["plugins"] = sorted(host.infos)
    return out


def host_for(config: StudyConfig) -> PluginHost:
    """The plugin host a study with ``config`` runs with."""
    return PluginHost(config.plugins, config.disable_plugins)


def _check_run_settings(run: dict[str, Any]) -> None:
    from frugalnas.core.errors import check_range

    n = run.get("n_trials")
    if n is not None and (not isinstance(n, int) or isinstance(n, bool) or n < 1):
        raise ConfigError(f"invalid n_trials {n!r}; expected an integer >= 1")
    if run.get("n_jobs") is not None:
        if not isinstance(run["n_jobs"], int) or run["n_jobs"] == 0 or run["n_jobs"] < -1:
            raise ConfigError(f"invalid n_jobs {run['n_jobs']!r}; expected an integer >= 1 "
                              "(or -1: one per CPU)")
    if run.get("timeout") is not None:
        check_range("timeout (seconds)", run["timeout"], 0)


def cmd_run(args: argparse.Namespace) -> int:
    from frugalnas.core.study import create_study

    config, run = resolve_run(args, args.host)
    _check_run_settings(run)
    host = host_for(config)
    resolved = plan(config, run, host)
    if args.dry_run:
        print(json.dumps(resolved, indent=2, default=str))
        return 0
    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    if not args.quiet:
        os.environ.setdefault("FRUGALNAS_PROGRESS", "1")
    else:
        os.environ["FRUGALNAS_PROGRESS"] = "0"
    cfg = asdict(config)
    study = create_study(storage=run.get("storage"), study_name=run.get("study_name"),
                         load_if_exists=run.get("load_if_exists", bool(run.get("storage"))),
                         host=host, **{k: v for k, v in cfg.items() if k != "directions"},
                         directions=config.directions)
    n_trials = run.get("n_trials", 10)
    done = len(study.completed_trials())
    study.optimize(n_trials=n_trials, timeout=run.get("timeout"), n_jobs=run.get("n_jobs", 1))
    completed = len(study.completed_trials()) - done
    print(f"study {study.name!r}: {completed} trial(s) completed this run, "
          f"{len(study.trials)} in total")
    try:
        best = study.best_trials if len(config.directions) > 1 else [study.best_trial]
        for t in best:
            print(f"best trial {t.number}: values={t.values} architecture={t.architecture}")
    except ValueError:
        print("no completed trial")
    if completed == 0 and n_trials > 0:
        print(f"frugalnas: error: no trial completed{_failure_summary(study)}", file=sys.stderr)
        return 1
    return 0


def _failure_summary(study: Any) -> str:
    from frugalnas.core.keys import FAIL_REASON_ATTR

    reasons: dict[str, int] = {}
    for t in study.trials:
        reason = t.user_attrs.get(FAIL_REASON_ATTR)
        if t.state.name == "FAIL" and reason:
            reasons[reason] = reasons.get(reason, 0) + 1
    if not reasons:
        return ""
    return "; failures: " + "; ".join(f"{n} x {r}" for r, n in
                                      sorted(reasons.items(), key=lambda kv: -kv[1])[:3])


def cmd_worker(args: argparse.Namespace) -> int:
    from frugalnas.core.worker import run_worker

    import optuna

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    os.environ["FRUGALNAS_PROGRESS"] = "0" if args.quiet else os.environ.get("FRUGALNAS_PROGRESS", "1")
    config, run = resolve_run(args, args.host)
    _check_run_settings(run)
    storage = run.get("storage")
    if not storage or not isinstance(storage, str):
        raise ConfigError("a worker needs a shared storage URL: --storage sqlite:///study.db "
                          "(or journal:PATH, postgresql://..., mysql://...)")
    n_trials = run.get("n_trials")
    if n_trials is None:
        raise ConfigError("a worker needs the study's total number of trials: --n-trials N")
    host = host_for(config)
    plan(config, run, host)
    if args.dry_run:
        return 0
    study = run_worker(config, storage, run.get("study_name") or "frugalnas", n_trials,
                       heartbeat=args.heartbeat, grace=args.grace, retries=args.retries,
                       timeout=run.get("timeout"), host=host)
    states = [t.state.name for t in study.trials]
    print(f"worker {os.getpid()} done: study {study.name!r} has {states.count('COMPLETE')} complete, "
          f"{states.count('FAIL')} failed, {states.count('RUNNING')} running trial(s)")
    if states.count("COMPLETE") == 0:
        print(f"frugalnas: error: no trial completed{_failure_summary(study)}", file=sys.stderr)
        return 1
    return 0


def cmd_plugins(args: argparse.Namespace) -> int:
    add, block = _plugin_args(args)
    host = PluginHost(add, block)
    if args.json:
        data = {"plugins": [asdict(i) for i in host.infos.values()],
                "components": {k: host.registry(k).describe() for k in KINDS}}
        print(json.dumps(data, indent=2))
        return 0
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
    return 0


def build_parser(host: PluginHost) -> argparse.ArgumentParser:
    """The full parser: the built-in commands plus those and the flags ``host``'s plugins add."""
    parser = argparse.ArgumentParser(prog="frugalnas", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run (or continue) a study")
    _study_args(run, host)
    run.set_defaults(func=cmd_run)
    worker = sub.add_parser("worker", help="join a shared study as one of many worker processes")
    _study_args(worker, host)
    worker.add_argument("--heartbeat", type=int, help="seconds between heartbeats (enables stale-trial detection)")
    worker.add_argument("--grace", type=int, help="seconds without heartbeat before a trial is stale (default 2x heartbeat)")
    worker.add_argument("--retries", type=int, default=0, help="re-run a stale trial's architecture up to N times")
    worker.set_defaults(func=cmd_worker)
    plugins = sub.add_parser("plugins", help="list plugins and the components they register")
    plugins.add_argument("--json", action="store_true")
    _common(plugins)
    plugins.set_defaults(func=cmd_plugins)
    host.hook.frugalnas_commands(subparsers=sub, host=host)
    return parser


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    try:
        host = PluginHost(*_preparse_plugins(argv))
    except FrugalnasError as exc:
        print(f"frugalnas: error: {exc}", file=sys.stderr)
        return 2
    args = build_parser(host).parse_args(argv)
    args.host = host
    try:
        return args.func(args)
    except FrugalnasError as exc:
        print(f"frugalnas: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("frugalnas: interrupted; completed trials are saved in the storage", file=sys.stderr)
        return 130


if __name__ == "__main__":
    sys.exit(main())
