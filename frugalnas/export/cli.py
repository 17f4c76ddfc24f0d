"""The ``frugalnas export`` and ``frugalnas report`` commands."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from frugalnas.ports.errors import ConfigError
from frugalnas.export.options import DEFAULT_FORMATS, FORMATS, ExportError

OVERRIDE_GROUPS = ("train", "backend", "dataset")


def _plugin_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("-p", dest="plugin", action="append", default=[], metavar="NAME",
                        help="load plugin NAME (entry point or module); 'no:NAME' blocks it")


def _study_flags(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--storage", required=True, help="the study's optuna storage URL")
    parser.add_argument("--study-name", required=True)
    _plugin_flag(parser)


def add_commands(subparsers: argparse._SubParsersAction) -> None:
    exp = subparsers.add_parser(
        "export", help="train a study's best architecture from scratch and write deployable "
        "files (state dict, TorchScript, torch.export, ONNX, report.json; a language model "
        "also as a Hugging Face GPT-2 folder)",
        description="Train the chosen trial's architecture from scratch on training + "
        "validation data with the study's backend, measure it on the test split (the "
        "dataset task's metric: accuracy, or a language model's loss per token), write it "
        "as a state dict, TorchScript, torch.export and ONNX files (with --format "
        "huggingface, a language model as a transformers GPT-2 folder; each checked against "
        "the module) with report.json, and log it to MLflow when the study is tracked.")
    _study_flags(exp)
    exp.add_argument("--out", required=True, help="folder for the files")
    exp.add_argument("--epochs", type=float, help="training epochs (default 10)")
    which = exp.add_mutually_exclusive_group()
    which.add_argument("--top", type=int, metavar="K", help="export the K best trials")
    which.add_argument("--trial", type=int, metavar="N", help="export trial N")
    which.add_argument("--pareto", type=int, metavar="I",
                       help="two objectives: export the I-th Pareto trial (0 = best by the "
                       "first objective)")
    which.add_argument("--constraint", metavar="EXPR",
                       help="export the best trial meeting EXPR, e.g. 'params<=50000'")
    exp.add_argument("--register", metavar="NAME",
                     help="register the model in the MLflow model registry as NAME")
    exp.add_argument("--format", action="append", choices=FORMATS, dest="formats",
                     help=f"files to write (repeat; default: {', '.join(DEFAULT_FORMATS)}; "
                     "huggingface: a language model as a transformers GPT-2 folder)")
    exp.add_argument("--dataset", help="train on this dataset instead of the study's")
    exp.add_argument("-o", "--option", action="append", default=[], metavar="GROUP.KEY=VALUE",
                     help="override a training option (train.lr=0.1, train.max_steps=100), a "
                     "backend option (backend.nproc=2) or a dataset option")
    exp.add_argument("--seed", type=int, help="training seed (default: the study's)")
    exp.add_argument("--tracking-uri", help="MLflow tracking URI (default: the study's)")
    exp.add_argument("--no-tracking", action="store_true", help="do not log to MLflow")
    exp.add_argument("--no-latency", action="store_true", help="skip the latency measurement")
    exp.add_argument("--json", action="store_true", help="print the report(s) as JSON")
    exp.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    exp.set_defaults(func=cmd_export)

    rep = subparsers.add_parser(
        "report", help="print a study's leaderboard (and write it as HTML)",
        description="The completed trials of a study, best first: rank, trial, architecture, "
        "objective values, parameters, FLOPs and what each evaluation cost.")
    _study_flags(rep)
    rep.add_argument("--html", metavar="FILE", help="also write the leaderboard as an HTML file")
    rep.add_argument("--limit", type=int, metavar="N", help="show the N best trials")
    rep.add_argument("--json", action="store_true", help="print the rows as JSON instead")
    rep.add_argument("--mlflow-url", metavar="URL",
                     help="link each trial in the HTML file to its run in the MLflow UI at URL")
    rep.add_argument("--no-sizes", action="store_true",
                     help="do not count parameters and FLOPs (no network is built)")
    rep.set_defaults(func=cmd_report)


def _split(values: list[str]) -> tuple[list[str], list[str]]:
    return ([p for p in values if not p.startswith("no:")],
            [p[3:] for p in values if p.startswith("no:")])


def open_study(args: argparse.Namespace, *, no_tracking: bool = False) -> Any:
    """The study, reopened from its storage (``frugalnas.load_study``); its strategy is not
    created (nothing is sampled). Only the plugins named with ``-p`` (and the installed ones
    the environment loads) are imported, never one named only in the stored configuration:
    where the study needs such a plugin, the error names it and ``-p NAME``."""
    import optuna

    from frugalnas.engine.study import load_study

    add, block = _split(args.plugin)
    if no_tracking:
        block.append("mlflow")
    return load_study(study_name=args.study_name, storage=args.storage, plugins=add,
                      disable_plugins=block, strategy=optuna.samplers.RandomSampler(seed=0),
                      stored_plugins="skip")


def _value(raw: str) -> Any:
    import tomllib

    try:
        return tomllib.loads(f"v = {raw}")["v"]
    except tomllib.TOMLDecodeError:
        return raw


def _overrides(options: list[str]) -> dict[str, dict[str, Any]]:
    out: dict[str, dict[str, Any]] = {g: {} for g in OVERRIDE_GROUPS}
    for item in options:
        key, sep, raw = item.partition("=")
        group, dot, name = key.partition(".")
        if not sep or not dot or not name or group not in OVERRIDE_GROUPS:
            raise ConfigError(f"malformed option {item!r}; expected GROUP.KEY=VALUE with GROUP one "
                              f"of {', '.join(OVERRIDE_GROUPS)} (e.g. train.max_steps=100)")
        out[group][name] = _value(raw)
    return out


def cmd_export(args: argparse.Namespace) -> int:
    from frugalnas.export.exporter import export_study
    from frugalnas.leaderboard import fmt_number

    overrides = _overrides(args.option)
    study = open_study(args, no_tracking=args.no_tracking)
    try:
        result = export_study(
            study, args.out, trial=args.trial, top=args.top, pareto=args.pareto,
            constraint=args.constraint, epochs=args.epochs, train_options=overrides["train"],
            backend_options=overrides["backend"] or None, formats=args.formats or DEFAULT_FORMATS,
            seed=args.seed, dataset=args.dataset,
            dataset_options=overrides["dataset"] or None, register=args.register,
            tracking_uri=args.tracking_uri, latency=not args.no_latency,
            progress=not args.quiet)
    except ExportError as exc:
        print(f"frugalnas: error: {' '.join(str(exc).split())}", file=sys.stderr)
        return 1
    results = result if isinstance(result, list) else [result]
    if args.json:
        print(json.dumps([r.report for r in results] if isinstance(result, list) else result.report,
                         indent=2, default=str))
        return 0
    for r in results:
        rep = r.report
        lat = (rep.get("latency") or {}).get("torch")
        print(f"trial {r.trial} (rank {r.rank}) -> {r.out}: {_test_line(rep)}"
              + f"; {fmt_number(rep['params'])} params, {fmt_number(rep['flops'])} FLOPs"
              + (f"; latency {lat['median_ms']:.3g} ms (batch 1, CPU)" if lat else "")
              + f"; trained {rep['training']['steps']} steps in {rep['seconds']['train']:.1f} s")
        print(f"  architecture: {rep['architecture']['text']}")
        print(f"  files: {', '.join(sorted(v['file'] for v in rep['files'].values()))}")
        ml = rep.get("mlflow")
        if ml:
            line = f"  MLflow model: {ml['model_uri']} in experiment {study.name!r}"
            line += f" (trial run {ml['run_id']})" if ml.get("run_id") else " (no trial run found)"
            if ml.get("registered_model"):
                line += f"; registered as {ml['registered_model']!r} version {ml['registered_version']}"
            print(line)
    return 0


def _test_line(rep: dict[str, Any]) -> str:
    """The test metric of a report: accuracy on test images, or a language model's loss."""
    metric = rep.get("test_metric", "test_accuracy")
    onnx = rep.get(f"onnx_{metric}")
    if metric == "test_accuracy":
        return (f"test accuracy {rep['test_accuracy']:.2f}% on {rep['test_examples']} test "
                "images" + (f" (ONNX: {onnx:.2f}%)" if onnx is not None else ""))
    if metric == "test_loss":
        context = rep["dataset"]["input_shape"][0]
        return (f"test loss {rep['test_loss']:.4f} nats/token (perplexity "
                f"{rep['test_perplexity']:.2f}) on {rep['test_examples']} test blocks of "
                f"{context} tokens" + (f" (ONNX: {onnx:.4f})" if onnx is not None else ""))
    return (f"{metric.replace('_', ' ')} {rep[metric]:.4g} on {rep['test_examples']} test "
            "examples" + (f" (ONNX: {onnx:.4g})" if onnx is not None else ""))


def cmd_report(args: argparse.Namespace) -> int:
    from rich.console import Console

    from frugalnas.export.exporter import trial_links
    from frugalnas.leaderboard import leaderboard_html, leaderboard_rows, leaderboard_table

    study = open_study(args)
    if args.limit is not None and args.limit < 1:
        raise ConfigError(f"invalid limit {args.limit!r}; expected an integer >= 1")
    rows = leaderboard_rows(study, limit=args.limit, sizes=not args.no_sizes)
    objectives = dict(zip(study.config.objectives, study.directions))
    if args.json:
        print(json.dumps(rows, indent=2))
    else:
        console = Console(width=None if sys.stdout.isatty() else 220, soft_wrap=False)
        total = len(study.completed_trials())
        console.print(leaderboard_table(rows, objectives, title=(
            f"study {study.name}: {len(rows)} of {total} completed trial(s), best first")))
    if args.html:
        links = None
        if args.mlflow_url:
            links = trial_links(study, args.mlflow_url)
            if links is None:
                raise ConfigError("--mlflow-url needs the study's MLflow tracking (the mlflow "
                                  "plugin is blocked)")
        path = Path(args.html)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(leaderboard_html(rows, objectives, links,
                                         title=f"study {study.name}: leaderboard"))
        if not args.json:
            print(f"leaderboard written to {path}")
    return 0
