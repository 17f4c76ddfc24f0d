"""What ``frugalnas export`` and ``frugalnas report`` do (their parsers are
:mod:`frugalnas.export.cli`): the study reopened from its storage, then its chosen trials
exported or its leaderboard printed."""

from __future__ import annotations

import argparse
import json
import sys
import tomllib
from pathlib import Path
from typing import Any

import optuna
from rich.console import Console

from frugalnas.ports.errors import ConfigError
from frugalnas.engine.study import load_study
from frugalnas.export.exporter import export_study, trial_links
from frugalnas.export.options import DEFAULT_FORMATS, ExportError
from frugalnas.leaderboard import fmt_number, leaderboard_html, leaderboard_rows, leaderboard_table

OVERRIDE_GROUPS = ("train", "backend", "dataset")


def _split(values: list[str]) -> tuple[list[str], list[str]]:
    return ([p for p in values if not p.startswith("no:")],
            [p[3:] for p in values if p.startswith("no:")])


def open_study(args: argparse.Namespace, *, no_tracking: bool = False) -> Any:
    """The study, reopened from its storage (``frugalnas.load_study``); its strategy is not
    created (nothing is sampled). Only the plugins named with ``-p`` (and the installed ones
    the environment loads) are imported, never one named only in the stored configuration:
    where the study needs such a plugin, the error names it and ``-p NAME``."""
    add, block = _split(args.plugin)
    if no_tracking:
        block.append("mlflow")
    return load_study(study_name=args.study_name, storage=args.storage, plugins=add,
                      disable_plugins=block, strategy=optuna.samplers.RandomSampler(seed=0),
                      stored_plugins="skip")


def _value(raw: str) -> Any:
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
