"""How well a ``gpt`` supernet ranks language models, against the stand-alone reference of
``benchmarks/gpt_reference.py`` (run it first): Kendall tau of the inherited validation loss
against the reference's mean over seeds, overall and within bins of equal decoder
(non-embedding) parameter count, where the parameter-count proxy knows nothing; the
``decoder_params`` proxy's taus beside it, and the embedding width alone (ties kept).

The supernet is one elastic transformer over the benchmark space, trained with the sandwich
rule and in-place distillation (each step: the largest network on the next tokens, the
smallest and ``--sandwich - 1`` random ones on the largest's predictions, as BigNAS and
whittle train), optionally with progressive shrinking (``--progressive --epochs 5``: one
phase per epoch), for ``--steps`` steps of the reference's batch in all. Each network is then scored with inherited weights on the same
validation tokens as the reference.

Results are kept per setting in ``--out`` (a setting already run is reprinted, not trained).

    python benchmarks/gpt_supernet_ranking.py [--steps 2000] [--sandwich 3] [--bins 5]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import time
from pathlib import Path
from typing import Any

from scipy.stats import kendalltau

import gpt_reference as reference

OUT = Path(__file__).resolve().parent / "results" / "gpt_supernet_ranking.json"


def train_and_score(args: argparse.Namespace, archs: list[str]) -> dict[str, Any]:
    """Train the supernet; each network's inherited validation loss."""
    import torch

    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.engine.training import TrainConfig, seed_everything, split_metric
    from frugalnas.spaces.gpt.space import GPTSpace
    from frugalnas.weight_sharing.supernet import Supernet

    torch.set_num_threads(args.threads)
    data = reference.corpus()
    space = GPTSpace(**reference.SPACE)
    seed_everything(args.seed)
    supernet = Supernet(space, data.num_classes, data.input_shape, seed=args.seed,
                        sandwich=args.sandwich, progressive=args.progressive)
    blocks = data.num_examples("train")
    # as many epochs as --steps needs (at least --epochs), each over the same seeded subset
    epochs = max(args.epochs, math.ceil(args.steps * args.batch / blocks))
    train_data = data.subset(args.steps * args.batch / (blocks * epochs), seed=args.seed)
    backend = SingleDeviceBackend("cpu")
    start = time.perf_counter()
    supernet.train(train_data, backend, TrainConfig(batch_size=args.batch, lr=args.lr,
                                                    optimizer="adam", weight_decay=0.0),
                   epochs=epochs)
    seconds = time.perf_counter() - start
    limit = args.eval_tokens // reference.CONTEXT
    losses = {}
    with torch.no_grad():
        for arch in archs:
            losses[arch] = split_metric(supernet.subnet(space.parse(arch)), backend, data,
                                        "valid", limit=limit)
    return {"losses": losses, "train_seconds": seconds,
            "score_seconds": time.perf_counter() - start - seconds,
            "steps": epochs * math.ceil(train_data.num_examples("train") / args.batch),
            "epochs": epochs}


def taus(reference_loss: dict[str, float], score: dict[str, float],
         params: dict[str, int], bins: int) -> dict[str, float]:
    """Kendall tau of ``score`` (lower better) against the reference loss, overall and the
    mean within ``bins`` bins of equal decoder parameter count."""
    archs = sorted(reference_loss, key=lambda a: params[a])
    overall = kendalltau([reference_loss[a] for a in archs], [score[a] for a in archs])
    within = []
    size = len(archs) / bins
    for b in range(bins):
        part = archs[round(b * size):round((b + 1) * size)]
        tau = kendalltau([reference_loss[a] for a in part], [score[a] for a in part]).statistic
        if not math.isnan(tau):
            within.append(float(tau))
    return {"overall": float(overall.statistic),
            "within_bins": statistics.mean(within) if within else float("nan")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--steps", type=int, default=2000)
    parser.add_argument("--sandwich", type=int, default=3,
                        help="networks besides the largest each step: the smallest and "
                             "SANDWICH - 1 random ones (3: BigNAS's four networks a step)")
    parser.add_argument("--progressive", action="store_true")
    parser.add_argument("--epochs", type=int, default=1,
                        help="epochs over a subset of --steps batches in all (progressive "
                             "shrinking moves to its next phase with each epoch)")
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--bins", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--networks", type=int, default=60)
    parser.add_argument("--ref-steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--eval-tokens", type=int, default=65536)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()

    plan = {"steps": args.ref_steps, "batch": args.batch, "lr": 1e-3,
            "context": reference.CONTEXT, "eval_tokens": args.eval_tokens,
            "optimizer": "adam", "weight_decay": 0.0}
    archs = reference.networks(args.networks)
    key = (f"steps {args.steps} epochs {args.epochs} sandwich {args.sandwich} "
           f"progressive {args.progressive} "
           f"lr {args.lr} batch {args.batch} seed {args.seed} networks {args.networks} "
           f"eval {args.eval_tokens}")
    cache = json.loads(args.out.read_text()) if args.out.exists() else {}
    if key not in cache:
        cache[key] = train_and_score(args, archs)
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(cache, indent=1))
    result = cache[key]
    rows = [r for r in reference.load(reference.OUT) if r["recipe"] == plan and r["arch"] in archs]
    table = reference.by_network(rows, [0, 1])
    if len(table) < len(archs):
        raise SystemExit(f"gpt_supernet_ranking: the reference holds {len(table)} of "
                         f"{len(archs)} networks with both seeds; run "
                         "benchmarks/gpt_reference.py first")
    ref = {a: statistics.mean(v) for a, v in table.items()}
    params = {r["arch"]: r["decoder_params"] for r in rows}
    ceiling = taus({a: v[0] for a, v in table.items()}, {a: v[1] for a, v in table.items()},
                   params, args.bins)

    supernet = taus(ref, result["losses"], params, args.bins)
    proxy = taus(ref, {a: -params[a] for a in archs}, params, args.bins)
    width = taus(ref, {a: -int(a.split("/")[0][len("gpt:w"):]) for a in archs}, params, args.bins)
    print(f"gpt supernet ranking ({key}): trained in {result['train_seconds'] / 60:.1f} min, "
          f"{len(archs)} networks scored in {result['score_seconds']:.0f} s")
    print(f"  {'ranking':<26}{'Kendall tau':>12}{'within ' + str(args.bins) + ' size bins':>22}")
    print(f"  {'seeds (the ceiling)':<26}{ceiling['overall']:>12.3f}"
          f"{ceiling['within_bins']:>22.3f}")
    print(f"  {'supernet':<26}{supernet['overall']:>12.3f}{supernet['within_bins']:>22.3f}")
    print(f"  {'decoder_params proxy':<26}{proxy['overall']:>12.3f}{proxy['within_bins']:>22.3f}")
    print(f"  {'embedding width alone':<26}{width['overall']:>12.3f}{width['within_bins']:>22.3f}")


if __name__ == "__main__":
    main()
