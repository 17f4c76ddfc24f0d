"""How well weight sharing ranks candidates, on the stand-alone ground truth.

For each variant a supernet is trained (SPOS, the same epochs and data as the ground truth's
dataset) and every ground-truth cell is scored with inherited weights (batch-norm
recalibrated). Printed per variant: Kendall tau against the mean stand-alone validation
accuracy, next to the ceiling the reference's noise allows (tau between its seeds), and the
supernet's training seconds. Variants: per-operation store, sharing across inputs, few-shot
K=2 and K=4 (split on ``edge_1_0``), and a hybrid that averages the percentile ranks of the
inherited accuracy and of a zero-cost rank ensemble (``--proxies``, the ``rank-ensemble``
default members). Scores are kept in ``--cache`` so a rerun only computes what is new.

On ``--space mobilenet`` (elastic blocks, one store; ``--space-options`` default
``{"width_mult": 0.35}``, 28x28 inputs) the variants are SPOS with uniform sampling
(``per-operation``), Once-for-All's progressive shrinking (``progressive-shrinking``), and
BigNAS's sandwich rule with in-place distillation (``sandwich``: the largest, the smallest and
one drawn network per step; ``progressive-shrinking sandwich``: the largest and two drawn
from the current phase).

    python benchmarks/weight_sharing_ranking.py --ground-truth nb201-mnist5k --epochs 10
    python benchmarks/weight_sharing_ranking.py --partial benchmarks/results/ground_truth/nb201-mnist5k.jsonl
    python benchmarks/weight_sharing_ranking.py --space mobilenet \\
        --partial benchmarks/results/ground_truth/mobilenet-mnist5k.jsonl --epochs 4 --proxies ''

A reference records its space, space options, dataset (with its options) and input side, and
the supernets train on the same; ``--partial`` reads the partial results of
``benchmarks/ground_truth.py`` (cells with every seed), which do not, so ``--space``,
``--space-options``, ``--dataset``, ``--dataset-options`` and ``--resize`` say them:

    python benchmarks/weight_sharing_ranking.py --ground-truth mobilenet-cluttered --epochs 10
    python benchmarks/weight_sharing_ranking.py --space mobilenet --dataset cluttered-mnist \\
        --dataset-options '{"size": 28, "clutter": 6}' \\
        --partial benchmarks/results/ground_truth/mobilenet-cluttered.jsonl --epochs 10
"""

from __future__ import annotations

import argparse
import hashlib
import itertools
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.host.plugins import PluginHost
from frugalnas.engine.training import TrainConfig, seed_everything
from frugalnas_lab.ground_truth import GroundTruth, load_ground_truth
from frugalnas.weight_sharing.supernet import FewShotSplit, Supernet

VARIANTS = {
    "per-operation": {"sharing": "operation"},
    "across-inputs": {"sharing": "operation-across-inputs"},
    "few-shot K=2": {"sharing": "operation", "groups": 2},
    "few-shot K=4": {"sharing": "operation", "groups": 4},
    "progressive-shrinking": {"sharing": "operation", "progressive": True},
    "sandwich": {"sharing": "operation", "sandwich": 2},
    "progressive-shrinking sandwich": {"sharing": "operation", "progressive": True, "sandwich": 2},
}
#: Per space: the variants it supports (the first ones listed are the default) and its
#: default space options and input side (0: as stored).
SPACES = {
    "nb201": (("per-operation", "across-inputs", "few-shot K=2", "few-shot K=4"),
              '{"N": 1, "C": 8}', 16),
    "mobilenet": (("per-operation", "progressive-shrinking", "sandwich",
                   "progressive-shrinking sandwich"), '{"width_mult": 0.35}', 0),
}


def from_cache(path: Path, space: str, space_options: dict, dataset: str) -> GroundTruth:
    rows: dict[str, dict[int, dict]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.setdefault(row["arch"], {})[int(row["seed"])] = row
    seeds = sorted({s for r in rows.values() for s in r})
    archs = [a for a, r in rows.items() if all(s in r for s in seeds)]
    return GroundTruth(path.stem, space, space_options, dataset, 0.0, seeds, archs,
                       np.array([[rows[a][s]["valid"] for s in seeds] for a in archs]),
                       np.array([[rows[a][s].get("test", np.nan) for s in seeds] for a in archs]))


def take_reference_settings(args: argparse.Namespace, reference: GroundTruth | None) -> None:
    """Fill the space, data and input side left out on the command line: the reference's
    (a shipped one records them), or with ``--partial`` the space's defaults. The space
    options stay in the spelling of :data:`SPACES` when they equal its default, so that the
    scores cached under that spelling are found."""
    if args.space is None:
        args.space = reference.space if reference is not None else "nb201"
    _, default_options, default_resize = SPACES[args.space]
    if args.space_options is None:
        args.space_options = default_options
        if reference is not None and reference.space_options != json.loads(default_options):
            args.space_options = json.dumps(reference.space_options)
    if args.dataset is None:
        args.dataset = reference.dataset if reference is not None else "mnist5k"
    if args.dataset_options is None:
        args.dataset_options = reference.dataset_options if reference is not None else {}
    if args.resize is None:
        args.resize = reference.resize if reference is not None else default_resize


def trained_supernet(args: argparse.Namespace, space, data, backend, name: str,
                     key: str) -> tuple[Supernet, float]:
    """The supernet of variant ``name``, trained, or loaded from ``--checkpoints``."""
    spec = VARIANTS[name]
    split = FewShotSplit.create(space, ["edge_1_0"], spec["groups"]) if "groups" in spec else None
    seed_everything(args.seed)
    supernet = Supernet(space, data.num_classes, data.input_shape, spec["sharing"],
                        seed=args.seed, few_shot=split, progressive=spec.get("progressive", False),
                        sandwich=spec.get("sandwich", 0))
    path = None
    if args.checkpoints is not None:
        digest = hashlib.sha256(key.encode()).hexdigest()[:16]
        path = args.checkpoints / f"{digest}.supernet.pt"
        if path.exists() and supernet.load(path):
            return supernet.to(backend.device), supernet.history.seconds
    start = time.perf_counter()
    supernet.train(data, backend, TrainConfig(batch_size=64, lr=args.lr, weight_decay=3e-4),
                   epochs=args.epochs, few_shot_epochs=args.few_shot_epochs if split else 0)
    seconds = time.perf_counter() - start
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        supernet.save(path)
    return supernet, seconds


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ground-truth", default="nb201-mnist5k")
    p.add_argument("--partial", type=Path, help="partial ground truth (jsonl of ground_truth.py)")
    p.add_argument("--space", choices=tuple(SPACES), default=None,
                   help="default: the reference's (nb201 with --partial)")
    p.add_argument("--space-options", default=None,
                   help="JSON (default: the reference's; with --partial, per --space)")
    p.add_argument("--dataset", default=None,
                   help="the reference's dataset (default: its own; mnist5k with --partial)")
    p.add_argument("--dataset-options", type=json.loads, default=None,
                   help="its options as JSON, as given to ground_truth.py (default: the "
                        "reference's)")
    p.add_argument("--resize", type=int, default=None, help="image side (0: as stored; "
                   "default: the reference's; with --partial 16 for nb201, 0 for mobilenet)")
    p.add_argument("--epochs", type=int, default=10, help="one-shot epochs")
    p.add_argument("--few-shot-epochs", type=int, default=5)
    p.add_argument("--variants", default=None, help="comma-separated (default: every variant "
                   "the space supports)")
    p.add_argument("--proxies", default="synflow,naswot,jacob_cov,params",
                   help="rank-ensemble members for the hybrid rows ('' for none)")
    p.add_argument("--hybrid-weight", type=float, default=0.5,
                   help="weight of the inherited-accuracy rank in the hybrid (the ensemble's: 1 - it)")
    p.add_argument("--bn-batches", type=int, default=4)
    p.add_argument("--finetune-steps", default="0",
                   help="comma-separated: score each cell also after this many SGD steps of a "
                        "private copy of its inherited weights (0: inherited weights as they are)")
    p.add_argument("--finetune-lr", type=float, default=0.05)
    p.add_argument("--checkpoints", type=Path, default=None,
                   help="folder keeping each trained supernet, so new --finetune-steps on the "
                        "same supernet do not retrain it")
    p.add_argument("--lr", type=float, default=0.05)
    p.add_argument("--cache", dest="score_cache", type=Path,
                   default=Path(__file__).parent / "results" / "weight_sharing_ranking.json",
                   help="scores of every variant and proxy, reused by later runs with the same settings")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    reference = None if args.partial else load_ground_truth(args.ground_truth)
    if reference is not None and args.space not in (None, reference.space):
        p.error(f"--space {args.space} does not match the reference {reference.name!r}, whose "
                f"networks are of space {reference.space!r}")
    take_reference_settings(args, reference)
    supported = SPACES[args.space][0]
    args.variants = args.variants or ",".join(supported)
    unknown = [v for v in args.variants.split(",") if v not in supported]
    if unknown:
        p.error(f"unknown --variants {unknown} for space {args.space}; valid: {', '.join(supported)}")
    torch.set_num_threads(args.threads)

    gt = reference or from_cache(args.partial, args.space, json.loads(args.space_options),
                                 args.dataset)
    host = PluginHost()
    space = host.create("search_spaces", args.space, **json.loads(args.space_options))
    data = host.create("datasets", args.dataset, seed=0, **args.dataset_options,
                       **({"resize": args.resize} if args.resize else {}))
    archs = [space.parse(a) for a in gt.architectures]
    backend = SingleDeviceBackend()
    perfect, single = gt.expected_taus()
    print(f"ground truth {gt.name}: {len(archs)} cells x {len(gt.seeds)} seeds; seed-vs-seed tau "
          f"{gt.tau_ceiling():.3f}; expected tau against the {len(gt.seeds)}-seed mean: perfect "
          f"estimator {perfect:.3f}, one more stand-alone training {single:.3f}")
    cache: dict[str, object] = (json.loads(args.score_cache.read_text())
                                if args.score_cache.exists() else {})

    def save_cache() -> None:
        args.score_cache.parent.mkdir(parents=True, exist_ok=True)
        args.score_cache.write_text(json.dumps(cache))

    # Scores depend on the cells and the data, not on which reference they are compared with,
    # so references of other budgets over the same cells reuse them.
    # (mnist5k, the first dataset, is left out of the keys so that its scores still reprint)
    on_data = ("" if args.dataset == "mnist5k" and not args.dataset_options
               else f" data {args.dataset} {json.dumps(args.dataset_options, sort_keys=True)}")
    cells = (f"cells {hashlib.sha256(chr(10).join(gt.architectures).encode()).hexdigest()[:12]}"
             f" x{len(archs)} {args.space_options} resize {args.resize}{on_data}")
    results: dict[str, np.ndarray] = {}
    trained: dict[str, tuple[Supernet, float]] = {}  # one training per variant and run
    finetune = TrainConfig(batch_size=64, lr=args.finetune_lr, weight_decay=3e-4)
    for name, steps in itertools.product(args.variants.split(","),
                                         [int(k) for k in args.finetune_steps.split(",")]):
        base = (f"{cells} {name} epochs {args.epochs} few-shot "
                f"{args.few_shot_epochs} lr {args.lr} bn {args.bn_batches} seed {args.seed}")
        label = name if steps == 0 else f"{name} +{steps} steps"
        key = base if steps == 0 else f"{base} finetune {steps} lr {args.finetune_lr}"
        if key in cache:
            entry = cache[key]
            results[label] = np.array(entry["scores"])
            print(f"  {label:26s} tau {gt.kendall_tau(results[label]):+.3f}  (cached; train "
                  f"{entry['seconds']:.0f} s)", flush=True)
            continue
        # A supernet depends on the space, data and training, not on the cells it scores, so
        # a checkpoint serves every reference (a partial one as it grows included).
        training = (f"{args.space} {args.space_options} resize {args.resize}{on_data} {name} "
                    f"epochs {args.epochs} few-shot {args.few_shot_epochs} lr {args.lr} seed "
                    f"{args.seed}")
        if training not in trained:
            trained[training] = trained_supernet(args, space, data, backend, name, training)
        supernet, seconds = trained[training]
        start = time.perf_counter()
        scores = np.array([supernet.accuracy(a, data, backend, bn_batches=args.bn_batches,
                                             finetune_steps=steps, finetune=finetune)
                           for a in archs])
        results[label] = scores
        cache[key] = {"scores": scores.tolist(), "seconds": seconds,
                      "score_seconds": time.perf_counter() - start}
        save_cache()
        print(f"  {label:26s} tau {gt.kendall_tau(scores):+.3f}  (train {seconds:.0f} s, score "
              f"{cache[key]['score_seconds']:.0f} s, mean acc {scores.mean():.1f} %)", flush=True)
    if args.proxies:
        from frugalnas.ports.estimator import TrialContext
        from frugalnas.proxies.ensemble import rank_average

        ensemble = host.create_estimator("rank-ensemble", {"proxies": args.proxies.split(",")})
        ctx = TrialContext(space=space, backend=backend, seed=args.seed,
                           dataset_loader=lambda: data)
        key = f"{cells} proxies {args.proxies} seed {args.seed}"
        if key not in cache:
            rows = [ensemble.measure(a, ctx)[0] for a in archs]
            cache[key] = {n: [r[f"proxy_{n}"] for r in rows] for n in ensemble.proxies}
            save_cache()
        columns = np.column_stack([cache[key][n] for n in ensemble.proxies])
        for n, column in zip(ensemble.proxies, columns.T):
            print(f"  proxy {n:16s} tau {gt.kendall_tau(column):+.3f}")
        proxy_rank = rank_average(columns)
        print(f"  rank-ensemble ({args.proxies}) tau {gt.kendall_tau(proxy_rank):+.3f}")
        for name, scores in list(results.items()):
            hybrid = rank_average(np.column_stack([scores, proxy_rank]),
                                  [args.hybrid_weight, 1 - args.hybrid_weight])
            print(f"  hybrid {name} + rank-ensemble (weight {args.hybrid_weight:g}): tau "
                  f"{gt.kendall_tau(hybrid):+.3f}")
    for name, scores in results.items():
        print(f"  {name:16s} vs test: tau {kendalltau(scores, gt.mean_test).statistic:+.3f}")
    sides = input_sides(space, archs)
    if sides is not None:
        print(f"  the input side alone: tau {gt.kendall_tau(sides):+.3f}; within one input "
              f"side, two trainings agree at {gt.tau_ceiling_within(sides):.3f}")
        for name, scores in results.items():
            print(f"  {name:16s} within one input side: tau "
                  f"{gt.kendall_tau_within(scores, sides):+.3f}")
    return 0


def input_sides(space, archs: list) -> np.ndarray | None:
    """Each network's input side when the space searches it (else None): a decision that can
    order the networks on its own, so the ranking is also read within each side."""
    from frugalnas.spaces.mobilenet.space import MobileNetSpace

    if not isinstance(space, MobileNetSpace) or space.resolutions is None:
        return None
    return np.array([space.resolution_of(a) for a in archs])


if __name__ == "__main__":
    raise SystemExit(main())
