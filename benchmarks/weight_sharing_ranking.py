"""How well weight sharing ranks candidates, on the stand-alone ground truth (issue 18).

For each variant a supernet is trained (SPOS, the same epochs and data as the ground truth's
dataset) and every ground-truth cell is scored with inherited weights (batch-norm
recalibrated). Printed per variant: Kendall tau against the mean stand-alone validation
accuracy, next to the ceiling the reference's noise allows (tau between its seeds), and the
supernet's training seconds. Variants: per-operation store, sharing across inputs, few-shot
K=2 and K=4 (split on ``edge_1_0``), and a hybrid that averages the percentile ranks of the
inherited accuracy and of a zero-cost proxy (``--proxy``, jacob_cov by default).

    python benchmarks/weight_sharing_ranking.py --ground-truth nb201-mnist5k --epochs 10
    python benchmarks/weight_sharing_ranking.py --cache benchmarks/results/ground_truth/nb201-mnist5k.jsonl

``--cache`` reads the partial results of ``benchmarks/ground_truth.py`` (cells with every seed).
"""

from __future__ import annotations

import argparse
import json
import time
from pathlib import Path

import numpy as np
import torch
from scipy.stats import kendalltau, rankdata

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.core.plugins import PluginHost
from frugalnas.core.training import TrainConfig, seed_everything
from frugalnas.weight_sharing.ground_truth import GroundTruth, load_ground_truth
from frugalnas.weight_sharing.supernet import FewShotSplit, Supernet

VARIANTS = {
    "per-operation": {"sharing": "operation"},
    "across-inputs": {"sharing": "operation-across-inputs"},
    "few-shot K=2": {"sharing": "operation", "groups": 2},
    "few-shot K=4": {"sharing": "operation", "groups": 4},
}


def from_cache(path: Path) -> GroundTruth:
    rows: dict[str, dict[int, dict]] = {}
    for line in path.read_text().splitlines():
        try:
            row = json.loads(line)
        except json.JSONDecodeError:
            continue
        rows.setdefault(row["arch"], {})[int(row["seed"])] = row
    seeds = sorted({s for r in rows.values() for s in r})
    archs = [a for a, r in rows.items() if all(s in r for s in seeds)]
    return GroundTruth(path.stem, "nb201", {"N": 1, "C": 8}, "mnist5k", 0.0, seeds, archs,
                       np.array([[rows[a][s]["valid"] for s in seeds] for a in archs]),
                       np.array([[rows[a][s].get("test", np.nan) for s in seeds] for a in archs]))


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--ground-truth", default="nb201-mnist5k")
    p.add_argument("--cache", type=Path, help="partial ground truth (jsonl of ground_truth.py)")
    p.add_argument("--space-options", default='{"N": 1, "C": 8}')
    p.add_argument("--resize", type=int, default=16)
    p.add_argument("--epochs", type=int, default=10, help="one-shot epochs")
    p.add_argument("--few-shot-epochs", type=int, default=5)
    p.add_argument("--variants", default=",".join(VARIANTS))
    p.add_argument("--proxy", default="jacob_cov")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    args = p.parse_args()
    torch.set_num_threads(args.threads)

    gt = from_cache(args.cache) if args.cache else load_ground_truth(args.ground_truth)
    host = PluginHost()
    space = host.create("search_spaces", "nb201", **json.loads(args.space_options))
    data = host.create("datasets", "mnist5k", seed=0,
                       **({"resize": args.resize} if args.resize else {}))
    archs = [space.parse(a) for a in gt.architectures]
    backend = SingleDeviceBackend()
    print(f"ground truth {gt.name}: {len(archs)} cells x {len(gt.seeds)} seeds; tau ceiling "
          f"(seed vs seed) {gt.tau_ceiling():.3f}")
    results: dict[str, np.ndarray] = {}
    for name in args.variants.split(","):
        spec = VARIANTS[name]
        split = FewShotSplit.create(space, ["edge_1_0"], spec["groups"]) if "groups" in spec else None
        seed_everything(args.seed)
        supernet = Supernet(space, data.num_classes, data.input_shape, spec["sharing"],
                            seed=args.seed, few_shot=split)
        start = time.perf_counter()
        supernet.train(data, backend, TrainConfig(batch_size=64, lr=0.05, weight_decay=3e-4),
                       epochs=args.epochs, few_shot_epochs=args.few_shot_epochs if split else 0)
        seconds = time.perf_counter() - start
        scores = np.array([supernet.accuracy(a, data, backend) for a in archs])
        results[name] = scores
        print(f"  {name:16s} tau {gt.kendall_tau(scores):+.3f}  (train {seconds:.0f} s, "
              f"mean inherited acc {scores.mean():.1f} %)", flush=True)
    if args.proxy:
        from frugalnas.core.estimator import EvaluationContext

        estimator = host.create_estimator(args.proxy, {})  # proxies are estimators by name
        ctx = EvaluationContext(space=space, backend=backend, seed=args.seed,
                                dataset_loader=lambda: data)
        proxy = np.array([estimator.evaluate(a, ctx).value for a in archs])
        print(f"  proxy {args.proxy:10s} tau {gt.kendall_tau(proxy):+.3f}")
        for name, scores in list(results.items()):
            hybrid = rankdata(scores) + rankdata(proxy)
            print(f"  hybrid {name} + {args.proxy}: tau {gt.kendall_tau(hybrid):+.3f}")
    for name, scores in results.items():
        print(f"  {name:16s} vs test: tau {kendalltau(scores, gt.mean_test).statistic:+.3f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
