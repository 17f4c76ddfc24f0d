"""Do the zero-cost proxies rank vision transformers? The ``vit`` space's networks on the
``digits`` images, each trained from scratch with two seeds (the reference, and its
seed-to-seed Kendall tau: the ceiling any ranking can reach), and every registered proxy
meant for image classes scored on the same networks; prints each proxy's Kendall tau
against the mean of the two seeds' validation accuracy, best first.

Only the public API is used (``frugalnas.create_study`` and ``Study.evaluate``). The figures
go to ``--results`` (the cache: a run with them reprints them; delete the file to measure
again).

    python benchmarks/vit_proxies.py [--networks 30] [--epochs 10]
"""

from __future__ import annotations

import argparse
import json
import random
import time
from pathlib import Path
from typing import Any

RESULTS = Path(__file__).resolve().parent / "results" / "vit_proxies.json"
SPACE = {"patch_sizes": [2, 4], "widths": [16, 32, 48], "max_depth": 3, "heads": [1, 2, 4],
         "mlp_ratios": [2, 4], "head_dim": 8}
OFF = {"disable_plugins": ("mlflow", "progress")}
#: Proxies meant for language models only, and the training reference itself.
NOT_PROXIES = ("decoder_params",)


def _study(estimator: str, options: dict[str, Any], seed: int = 0) -> Any:
    import frugalnas

    return frugalnas.create_study(space="vit", space_options=SPACE, estimator=estimator,
                                  estimator_options=options, dataset="digits", seed=seed,
                                  **OFF)


def measure(args: argparse.Namespace) -> dict[str, Any]:
    from frugalnas import list_components

    reference = _study("train", {}, 0)
    rng = random.Random(0)
    archs: dict[str, Any] = {}
    while len(archs) < args.networks:
        arch = reference.space.sample(rng)
        archs.setdefault(str(arch), arch)
    train = {"epochs": args.epochs, "batch_size": 32, "optimizer": "adam", "lr": 0.003,
             "weight_decay": 0.0}
    accuracy: dict[str, list[float]] = {text: [] for text in archs}
    start = time.perf_counter()
    for seed in (0, 1):
        study = _study("train", train, seed)
        for text, arch in archs.items():
            accuracy[text].append(study.evaluate(arch).value)
    train_seconds = time.perf_counter() - start
    scores: dict[str, list[float]] = {}
    seconds: dict[str, float] = {}
    failed: dict[str, str] = {}
    for proxy in list_components("proxies"):
        if proxy in NOT_PROXIES:
            continue
        begin = time.perf_counter()
        try:
            study = _study(proxy, {"batch_size": 32})
            scores[proxy] = [study.evaluate(arch).value for arch in archs.values()]
        except Exception as exc:  # refused, or cannot score these networks: say why
            failed[proxy] = f"{type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
            print(f"{proxy}: {failed[proxy]}", flush=True)
            continue
        seconds[proxy] = (time.perf_counter() - begin) / len(archs)
        print(f"{proxy}: {seconds[proxy] * 1e3:.0f} ms per network", flush=True)
    return {"space": SPACE, "networks": list(archs), "epochs": args.epochs,
            "accuracy": accuracy, "scores": scores, "seconds_per_network": seconds,
            "failed": failed, "train_seconds": train_seconds}


def summary(results: dict[str, Any]) -> list[str]:
    import numpy as np
    from scipy.stats import kendalltau

    nets = results["networks"]
    first = [results["accuracy"][n][0] for n in nets]
    second = [results["accuracy"][n][1] for n in nets]
    mean = list(np.mean([first, second], axis=0))
    ceiling = kendalltau(first, second)[0]
    lines = [f"{len(nets)} vit networks on digits, {results['epochs']} epochs of Adam, 2 seeds: "
             f"validation accuracy {min(mean):.1f}-{max(mean):.1f} %, seed-to-seed Kendall "
             f"tau {ceiling:.3f} (the ceiling)"]
    taus = {p: kendalltau(s, mean)[0] for p, s in results["scores"].items()}
    for proxy, tau in sorted(taus.items(), key=lambda kv: -np.nan_to_num(kv[1], nan=-2)):
        ms = results["seconds_per_network"][proxy] * 1e3
        constant = " (the same score for every network)" if len(set(results["scores"][proxy])) == 1 \
            else ""
        lines.append(f"  {proxy:18s} tau {tau:+.3f}   {ms:6.0f} ms per network{constant}")
    for proxy, why in results.get("failed", {}).items():
        lines.append(f"  {proxy:18s} {why}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", type=int, default=30)
    parser.add_argument("--epochs", type=int, default=10)
    parser.add_argument("--results", type=Path, default=RESULTS)
    args = parser.parse_args()
    if args.results.exists():
        results = json.loads(args.results.read_text())
    else:
        results = measure(args)
        args.results.write_text(json.dumps(results, indent=1) + "\n")
    print("\n".join(summary(results)))


if __name__ == "__main__":
    main()
