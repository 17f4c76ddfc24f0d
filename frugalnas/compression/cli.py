"""The ``frugalnas compress`` command."""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from frugalnas.compression.options import DISTILL_LOSSES, IMPORTANCE_METHODS


def add_command(subparsers: argparse._SubParsersAction[argparse.ArgumentParser]) -> None:
    cmd = subparsers.add_parser(
        "compress", help="compress a trained language model: importance ordering, a "
        "budgeted sub-network search, distillation, export in the model's own format",
        description="Rank the heads, MLP units, embedding channels and layers of a trained "
        "language model (a frugalnas checkpoint folder or a Hugging Face save_pretrained "
        "folder of a GPT-2 or Llama-family model) on calibration text, search its "
        "sub-networks under the budget, distil the best from the model and write it in the "
        "model's format (and ONNX) with report.json. Run again with the same --out to "
        "resume.")
    cmd.add_argument("model", help="the trained model's folder")
    cmd.add_argument("--data", required=True,
                     help="UTF-8 text: a file, a folder of .txt files or a glob")
    cmd.add_argument("--budget", default="params=0.5",
                     help="KIND=VALUE with KIND params, latency or memory: a fraction such as "
                     "params=0.5 (half the non-embedding parameters) or an amount such as "
                     "params=2e6, latency=3 (ms) or memory=20 (MiB) (default params=0.5)")
    cmd.add_argument("--out", required=True, help="folder for the results (resumed if it exists)")
    cmd.add_argument("--trials", type=int, default=40, help="sub-networks to score (default 40)")
    cmd.add_argument("--strategy", default="tpe", help="search strategy (default tpe)")
    cmd.add_argument("--estimator", default="inherited-loss",
                     help="how a sub-network is scored (default inherited-loss: its "
                     "validation loss with the parent's weights)")
    cmd.add_argument("--direction", choices=("minimize", "maximize"), default="minimize",
                     help="which way the estimator's value is better (default minimize: a "
                          "loss; maximize for a proxy such as decoder_params)")
    cmd.add_argument("--importance", choices=IMPORTANCE_METHODS, default="activation",
                     help="how parts are ranked (default activation)")
    cmd.add_argument("--tokens", type=int, default=2_000_000,
                     help="distillation tokens (default 2,000,000; 0: no fine-tuning)")
    cmd.add_argument("--supernet-tokens", type=int, default=0,
                     help="train the parent as a supernet on this many tokens before the "
                          "search (default 0: score the parent's own weights)")
    cmd.add_argument("--supernet-samples", type=int, default=2,
                     help="sub-networks of the budget's size trained per supernet step "
                          "(default 2)")
    cmd.add_argument("--loss", choices=DISTILL_LOSSES, default="distill",
                     help="fine-tuning loss (default distill: the parent's logits)")
    cmd.add_argument("--lr", type=float, default=3e-4, help="fine-tuning learning rate")
    cmd.add_argument("--batch-size", type=int, default=16)
    cmd.add_argument("--context", type=int, help="tokens per block (default: the model's, at "
                     "most 256)")
    cmd.add_argument("--backend", default="single-device",
                     help="training backend of the distillation (default single-device)")
    cmd.add_argument("--seed", type=int, default=0)
    cmd.add_argument("--no-onnx", action="store_true", help="do not write model.onnx")
    cmd.add_argument("--tracking-uri", help="MLflow tracking URI of the search and the result "
                     "(default: sqlite:///OUT/mlflow.db)")
    cmd.add_argument("--no-tracking", action="store_true", help="no MLflow tracking")
    cmd.add_argument("--json", action="store_true", help="print report.json's result")
    cmd.add_argument("-q", "--quiet", action="store_true", help="no progress lines")
    cmd.set_defaults(func=cmd_compress)


def cmd_compress(args: argparse.Namespace) -> int:
    from frugalnas.compression.pipeline import compress

    distill = {"tokens": args.tokens, "loss": args.loss, "lr": args.lr,
               "batch_size": args.batch_size}
    result = compress(args.model, args.data, budget=args.budget, out=args.out,
                      trials=args.trials, strategy=args.strategy, estimator=args.estimator,
                      direction=args.direction,
                      importance=args.importance, batch_size=args.batch_size,
                      context=args.context, backend=args.backend, seed=args.seed,
                      onnx=not args.no_onnx, distill=distill,
                      supernet={"tokens": args.supernet_tokens,
                                "samples": args.supernet_samples, "lr": args.lr,
                                "batch_size": args.batch_size},
                      tracking=not args.no_tracking, tracking_uri=args.tracking_uri,
                      progress=False if args.quiet else True)
    if args.json:
        report: dict[str, Any] = {**asdict(result), "out": str(result.out),
                                  "model": str(result.model),
                                  "onnx": None if result.onnx is None else str(result.onnx)}
        print(json.dumps(report, indent=2, default=str))
    else:
        print(result.summary())
    return 0
