"""End to end on mnist5k: a `mobilenet` search under a latency budget against a hand-designed
MobileNetV2 at width 0.35, both trained with the same recipe.

Per seed:

1. the baseline (MobileNetV2's own point of the space: every stage at full depth, kernel 3,
   ratio 6, no SE) is trained with the recipe and its latency measured (ONNX Runtime, batch
   1, 1 thread, this CPU);
2. one supernet of elastic blocks is trained with progressive shrinking (its checkpoint is
   shared by the two searches);
3. one two-objective search (regularized evolution ranking by NSGA-II's order: supernet
   accuracy up, latency measured on this CPU down) spans both budgets, the baseline's
   latency and half of it;
4. the candidates the search measured near the baseline's latency are measured again
   together with the baseline (interleaved rounds), and each budget is judged on these
   ratios; for each budget, the ``--top`` candidates under it with the best supernet
   accuracy are trained with the recipe; the one best on validation is reported on the test
   split, and its ONNX export is checked against its PyTorch predictions.

``--search-resolution R`` searches networks that resize their input to R x R first (the
baseline sees the 28x28 images); ``--search-resolutions R1 R2 ...`` makes that side a searched
decision of every network instead (elastic resolution: one supernet serves every side).

Results are kept per seed in ``--out`` (resumable: a finished seed is not run again).

    python benchmarks/mobilenet_mnist.py [--seeds 0 1 2] [--epochs 15] [--trials 100]
"""

from __future__ import annotations

import argparse
import json
import math
import statistics
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import torch

import frugalnas
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.engine.training import TrainConfig, split_metric, train
from frugalnas.datasets.images import mnist5k
from frugalnas.latency.measure import LatencySetup, measure, measure_many, onnx_bytes
from frugalnas.spaces.mobilenet.space import MobileNetSpace

SHAPE = (1, 28, 28)
SETUP = LatencySetup(runtime="onnxruntime", batch_size=1, threads=1, warmup=20, repeats=100)


def trained(space: MobileNetSpace, arch: Any, data: Any, epochs: int, seed: int) -> dict[str, Any]:
    """The recipe: SGD (momentum 0.9, Nesterov, weight decay 5e-4), lr 0.05, cosine, batch 64."""
    torch.manual_seed(seed)
    backend = SingleDeviceBackend("cpu")
    model = backend.prepare(space.build(arch, 10, SHAPE))
    start = time.perf_counter()
    train(model, data, backend, TrainConfig(epochs=epochs, batch_size=64, lr=0.05), seed=seed)
    seconds = time.perf_counter() - start
    latency = measure(model, SHAPE, SETUP)
    return {"architecture": str(arch), "params": sum(p.numel() for p in model.parameters()),
            "valid": split_metric(model, backend, data, "valid"),
            "test": split_metric(model, backend, data, "test"),
            "latency_ms": latency.median_ms, "latency_iqr_ms": latency.iqr_ms,
            "train_seconds": seconds, "onnx": onnx_agreement(model, data)}


def onnx_agreement(model: torch.nn.Module, data: Any) -> dict[str, float]:
    """The exported ONNX model against PyTorch on the test split: the largest logit
    difference and the share of equal predictions."""
    import onnxruntime as ort

    x, _ = data.split("test")
    model.eval()
    with torch.no_grad():
        expected = model(x).numpy()
    session = ort.InferenceSession(onnx_bytes(model, x[:1]), providers=["CPUExecutionProvider"])
    got = np.concatenate([session.run(None, {"input": x[i:i + 1].numpy()})[0]
                          for i in range(len(x))])
    return {"max_abs_logit_diff": float(np.abs(got - expected).max()),
            "same_prediction": float((got.argmax(1) == expected.argmax(1)).mean())}


def search(space_options: dict[str, Any], seed: int, trials: int, supernet: dict[str, Any],
           cache: str, folder: Path) -> Any:
    """One two-objective search (supernet accuracy up, measured latency down): its Pareto
    front holds candidates for both budgets."""
    study = frugalnas.create_study(
        space="mobilenet", space_options=space_options, strategy="regularized-evolution",
        strategy_options={"population_size": 20, "sample_size": 5},
        estimator="combined",
        estimator_options={"members": {
            "supernet": supernet,
            "measured-latency": {"input_shape": list(SHAPE), "cache": cache, "threads": 1,
                                 "batch_size": 1, "warmup": SETUP.warmup,
                                 "repeats": SETUP.repeats}}},
        objectives=["value", "latency_ms"], directions=["maximize", "minimize"],
        dataset="mnist5k", seed=seed, storage=f"sqlite:///{folder / 'search.db'}",
        study_name="mobilenet-mnist", disable_plugins=("mlflow", "progress"))
    study.optimize(n_trials=trials)
    if not study.completed_trials():
        raise SystemExit("mobilenet_mnist: no trial of the search completed (see the log above)")
    return study


def search_options(args: argparse.Namespace) -> dict[str, Any]:
    """The searched space's options: the baseline's width, and ``--search-resolution``
    (the input resized inside the network) or ``--search-resolutions`` (the side searched)
    when given."""
    if args.search_resolutions:
        return {"width_mult": args.width, "resolutions": list(args.search_resolutions)}
    return {"width_mult": args.width,
            **({"resolution": args.search_resolution} if args.search_resolution else {})}


def together_ratios(space: MobileNetSpace, base_space: MobileNetSpace, trials: list[Any],
                    search_baseline_ms: float, slack: float = 1.3) -> dict[int, float]:
    """Each trial's latency as a ratio to the baseline's, the two measured together in
    interleaved rounds (the fastest round of each), for the trials the search measured
    within ``slack`` times the baseline's latency (the others cannot meet either budget)."""
    near = [t for t in trials if t.values[1] <= slack * search_baseline_ms]
    setup = LatencySetup(runtime="onnxruntime", batch_size=1, threads=1, warmup=20,
                         repeats=100, rounds=3)
    models = [(base_space.build(base_space.mobilenet_v2(), 10, SHAPE), SHAPE)] + [
        (space.build(space.parse(str(t.architecture)), 10, SHAPE), SHAPE) for t in near]
    found = measure_many(models, setup)
    return {t.number: m.median_ms / found[0].median_ms for t, m in zip(near, found[1:])}


def one_seed(seed: int, args: argparse.Namespace) -> dict[str, Any]:
    space_options = search_options(args)
    space = MobileNetSpace(**space_options)
    base_space = MobileNetSpace(width_mult=args.width)
    data = mnist5k(seed=seed)
    start = time.perf_counter()
    baseline = trained(base_space, base_space.mobilenet_v2(), data, args.epochs, seed)
    print(f"seed {seed}: baseline {baseline['test']:.2f} % test, {baseline['latency_ms']:.3f} ms",
          flush=True)
    out: dict[str, Any] = {"seed": seed, "baseline": baseline, "targets": {},
                           "space_options": space_options}
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp)
        supernet = {"epochs": args.supernet_epochs, "batch_size": 64, "bn_batches": 4,
                    "progressive_shrinking": True,
                    **({"sandwich": args.sandwich} if args.sandwich else {})}
        out["supernet"] = supernet
        t0 = time.perf_counter()
        study = search(space_options, seed, args.trials, supernet,
                       str(folder / "latency.sqlite"), folder)
        out["search"] = {"trials": len(study.trials), "seconds": time.perf_counter() - t0,
                         "completed": len(study.completed_trials())}
        done = study.completed_trials()
        # The budgets are judged on latencies measured together with the baseline: a
        # measurement taken minutes earlier, under another load, is not comparable.
        ratio = together_ratios(space, base_space, done, baseline["latency_ms"])
        out["search"]["ratios_measured"] = len(ratio)
        for name, factor in (("at most its latency", 1.0), ("half its latency", 0.5)):
            budget = factor * baseline["latency_ms"]
            t0 = time.perf_counter()
            under = sorted((t for t in done if ratio.get(t.number, math.inf) <= factor),
                           key=lambda t: -t.values[0])
            finalists = [{"architecture": str(t.architecture), "supernet_valid": t.values[0],
                          "search_latency_ms": t.values[1],
                          "ratio_to_baseline": ratio[t.number]} for t in under[:args.top]]
            results = []
            for f in finalists:
                r = trained(space, space.parse(f["architecture"]), data, args.epochs, seed)
                f["measured_ms"] = r["latency_ms"]
                results.append(r)
            # judged as chosen: on the ratio measured together with the baseline
            # (--remeasure measures the trained networks and the baseline together again)
            fits = [r for r, f in zip(results, finalists) if f["ratio_to_baseline"] <= factor]
            best = max(fits, key=lambda r: r["valid"]) if fits else None
            out["targets"][name] = {"budget_ms": budget, "under_budget": len(under),
                                    "final_seconds": time.perf_counter() - t0,
                                    "finalists": finalists, "trained": results, "best": best}
            if best:
                print(f"seed {seed}: {name}: {best['test']:.2f} % test at {best['latency_ms']:.3f} "
                      f"ms ({best['architecture']})", flush=True)
            else:
                print(f"seed {seed}: {name}: no finalist within {budget:.3f} ms", flush=True)
    out["seconds"] = time.perf_counter() - start
    return out


def remeasure(result: dict[str, Any], width: float, rounds: int, epochs: int) -> None:
    """Measure the baseline and every trained finalist of one seed again, together, in
    ``rounds`` interleaved rounds (the fastest round of each): latencies taken minutes apart
    on a shared machine are not comparable, these are. A finalist left untrained because
    one measurement put it over its budget is trained first. Each target's best is then
    chosen again among the finalists within its budget by these latencies."""
    base_space = MobileNetSpace(width_mult=width)
    space = MobileNetSpace(**result.get("space_options", {"width_mult": width}))
    data = None
    for target in result["targets"].values():
        done = {r["architecture"] for r in target["trained"]}
        for f in target["finalists"]:
            if f["architecture"] not in done:
                data = data or mnist5k(seed=result["seed"])
                target["trained"].append(trained(space, space.parse(f["architecture"]), data,
                                                 epochs, result["seed"]))
    entries = [result["baseline"]] + [r for t in result["targets"].values() for r in t["trained"]]
    setup = LatencySetup(runtime="onnxruntime", batch_size=1, threads=1, warmup=20,
                         repeats=100, rounds=rounds)
    spaces = [base_space] + [space] * (len(entries) - 1)
    found = measure_many([(s.build(s.parse(e["architecture"]), 10, SHAPE), SHAPE)
                          for s, e in zip(spaces, entries)], setup)
    for entry, m in zip(entries, found):
        entry["latency_interleaved_ms"] = m.median_ms
    base = result["baseline"]["latency_interleaved_ms"]
    for name, factor in (("at most its latency", 1.0), ("half its latency", 0.5)):
        target = result["targets"][name]
        fits = [r for r in target["trained"] if r["latency_interleaved_ms"] <= factor * base]
        target["best_interleaved"] = max(fits, key=lambda r: r["valid"]) if fits else None


def report(results: list[dict[str, Any]]) -> None:
    def stat(values: list[float]) -> str:
        if not values:
            return "-"
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        return f"{statistics.mean(values):.2f} +- {spread:.2f}"

    base = [r["baseline"]["test"] for r in results]
    print(f"\nseeds {[r['seed'] for r in results]}; minutes per seed "
          f"{[round(r['seconds'] / 60, 1) for r in results]}")
    print("| network | test accuracy (%) | latency (ms) | params |")
    print("|---|---|---|---|")
    print(f"| MobileNetV2 0.35 (hand-designed) | {stat(base)} | "
          f"{stat([r['baseline']['latency_ms'] for r in results])} | "
          f"{results[0]['baseline']['params']:,} |")
    for name in ("at most its latency", "half its latency"):
        bests = [r["targets"][name]["best"] for r in results if r["targets"][name]["best"]]
        print(f"| searched, {name} ({len(bests)} of {len(results)} seeds) | "
              f"{stat([b['test'] for b in bests])} | {stat([b['latency_ms'] for b in bests])} | "
              f"{stat([float(b['params']) for b in bests])} |")
    for name in ("at most its latency", "half its latency"):
        gaps = [r["targets"][name]["best"]["test"] - r["baseline"]["test"]
                for r in results if r["targets"][name]["best"]]
        print(f"searched minus baseline, {name}, per seed (points): "
              f"{[round(g, 2) for g in gaps]}; mean {stat(gaps)}")
    if all("latency_interleaved_ms" in r["baseline"] for r in results):
        print("\nLatencies measured again together (interleaved rounds, the fastest of each):")
        print("| network | test accuracy (%) | latency (ms) | vs the baseline's latency |")
        print("|---|---|---|---|")
        print(f"| MobileNetV2 0.35 | {stat(base)} | "
              f"{stat([r['baseline']['latency_interleaved_ms'] for r in results])} | 1 |")
        for name in ("at most its latency", "half its latency"):
            chosen = [r for r in results if r["targets"][name].get("best_interleaved")]
            pairs = [(r["targets"][name]["best_interleaved"], r["baseline"]) for r in chosen]
            print(f"| searched, {name} ({len(pairs)} of {len(results)} seeds) | "
                  f"{stat([b['test'] for b, _ in pairs])} | "
                  f"{stat([b['latency_interleaved_ms'] for b, _ in pairs])} | "
                  f"{stat([b['latency_interleaved_ms'] / a['latency_interleaved_ms'] for b, a in pairs])} |")
            for (b, a), r in zip(pairs, chosen):
                print(f"  seed {r['seed']}: {b['architecture']} {b['test']:.2f} % against "
                      f"{a['test']:.2f} %")
    onnx = [b["onnx"] for r in results for b in [r["baseline"]] + [
        t["best"] for t in r["targets"].values() if t["best"]]]
    print(f"ONNX against PyTorch: largest logit difference "
          f"{max(o['max_abs_logit_diff'] for o in onnx):.2e}, same prediction on "
          f"{min(o['same_prediction'] for o in onnx) * 100:.1f} % or more of the test images")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--width", type=float, default=0.35)
    parser.add_argument("--search-resolution", type=int, default=None,
                        help="the searched networks resize their input to this side first "
                             "(the baseline sees the 28x28 images)")
    parser.add_argument("--search-resolutions", type=int, nargs="+", default=None,
                        help="the searched networks' input side is a decision among these "
                             "(instead of --search-resolution)")
    parser.add_argument("--epochs", type=int, default=15, help="the training recipe's epochs")
    parser.add_argument("--supernet-epochs", type=int, default=16)
    parser.add_argument("--sandwich", type=int, default=0,
                        help="train the supernet with the sandwich rule: the largest network "
                             "and this many drawn from each progressive-shrinking phase")
    parser.add_argument("--trials", type=int, default=100)
    parser.add_argument("--top", type=int, default=3)
    parser.add_argument("--out", default="benchmarks/results/mobilenet_mnist.json")
    parser.add_argument("--remeasure", type=int, default=0, metavar="ROUNDS",
                        help="measure each finished seed's networks again together in ROUNDS "
                             "interleaved rounds (kept in --out)")
    args = parser.parse_args()
    if args.search_resolution and args.search_resolutions:
        parser.error("give --search-resolution (fixed) or --search-resolutions (searched), "
                     "not both")
    torch.set_num_threads(1)
    path = Path(args.out)
    done = json.loads(path.read_text()) if path.exists() else {}
    for seed in args.seeds:
        if str(seed) not in done:
            done[str(seed)] = one_seed(seed, args)
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(json.dumps(done, indent=1))
    if args.remeasure:
        for seed in args.seeds:
            remeasure(done[str(seed)], args.width, args.remeasure, args.epochs)
        path.write_text(json.dumps(done, indent=1))
    report([done[str(s)] for s in args.seeds])


if __name__ == "__main__":
    main()
