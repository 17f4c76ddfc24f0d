"""The parsers of the ``frugalnas export`` and ``frugalnas report`` commands; each names its
function (:mod:`frugalnas.export.commands`) by reference, imported when the command runs."""

from __future__ import annotations

import argparse

from frugalnas.host.registry import LazyFactory
from frugalnas.export.options import DEFAULT_FORMATS, FORMATS


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
    exp.set_defaults(func=LazyFactory("frugalnas.export.commands:cmd_export"))

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
    rep.set_defaults(func=LazyFactory("frugalnas.export.commands:cmd_report"))
