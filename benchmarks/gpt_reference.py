"""A reference that can tell language models apart: ``gpt`` networks trained stand-alone on the
Shakespeare corpus (42 works, split by work), two seeds each, with the seed-to-seed Kendall
tau (the ceiling any cheaper ranking can reach) and the spread of validation loss it covers.

The networks are a seeded sample of the benchmark space (:data:`SPACE`), plus nanoGPT's small
CPU shape (4 layers, 4 heads, width 128). Every network is trained with one recipe
(:func:`recipe`: Adam, cosine schedule, ``--steps`` steps of ``--batch`` blocks of 64 byte
tokens) and scored by its validation loss in nats per token on the first ``--eval-tokens``
tokens of the validation works.

Results are kept one line per (network, seed, recipe) in ``--out`` (resumable: a finished
run is not trained again; ``--jobs`` processes train side by side, one thread each).

    python benchmarks/gpt_reference.py [--networks 60] [--seeds 0 1] [--steps 800] [--jobs 2]
"""

from __future__ import annotations

import argparse
import json
import random
import statistics
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from multiprocessing import get_context
from pathlib import Path
from typing import Any

from scipy.stats import kendalltau

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "shakespeare"
OUT = Path(__file__).resolve().parent / "results" / "gpt_reference.jsonl"
CONTEXT = 64
#: The benchmark space: widths to 128, 1-4 layers of 1, 2 or 4 heads of 32 features, MLP
#: ratio 2 or 4 (nanoGPT's small CPU shape is its largest uniform point).
SPACE = {"widths": [64, 96, 128], "min_depth": 1, "max_depth": 4, "heads": [1, 2, 4],
         "mlp_ratios": [2, 4], "head_dim": 32, "context": CONTEXT}
NANOGPT = "gpt:w128/h4r4,h4r4,h4r4,h4r4"


def recipe(args: argparse.Namespace) -> dict[str, Any]:
    return {"steps": args.steps, "batch": args.batch, "lr": args.lr, "context": CONTEXT,
            "eval_tokens": args.eval_tokens, "optimizer": "adam", "weight_decay": 0.0}


def corpus(seed: int = 0) -> Any:
    """The 42 works split by work (seed 0): 34 train, 4 validate, 4 test."""
    from frugalnas.datasets.text import TextSource

    return TextSource.open(CORPUS.resolve(), seed=seed, context=CONTEXT)


def networks(count: int, seed: int = 0) -> list[str]:
    """nanoGPT's shape and ``count - 1`` distinct networks drawn from the space."""
    from frugalnas.spaces.gpt.space import GPTSpace

    space, rng = GPTSpace(**SPACE), random.Random(f"gpt-reference:{seed}")
    chosen = [NANOGPT]
    while len(chosen) < count:
        arch = str(space.sample(rng))
        if arch not in chosen:
            chosen.append(arch)
    return chosen


def train_one(arch_text: str, seed: int, plan: dict[str, Any]) -> dict[str, Any]:
    """Train one network with the recipe; its validation loss and its sizes."""
    import torch

    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.engine.training import TrainConfig, seed_everything, split_metric, train
    from frugalnas.nn.transformer import count_non_embedding_params
    from frugalnas.spaces.gpt.space import GPTSpace

    torch.set_num_threads(1)
    data = corpus()
    space = GPTSpace(**SPACE)
    arch = space.parse(arch_text)
    seed_everything(seed)
    backend = SingleDeviceBackend("cpu")
    model = backend.prepare(space.build(arch, data.num_classes, data.input_shape))
    start = time.perf_counter()
    config = TrainConfig(epochs=1.0, batch_size=plan["batch"], lr=plan["lr"], optimizer="adam",
                         weight_decay=plan["weight_decay"], max_steps=plan["steps"])
    report = train(model, data, backend, config, seed=seed)
    seconds = time.perf_counter() - start
    blocks = plan["eval_tokens"] // CONTEXT
    return {"arch": arch_text, "seed": seed, "recipe": plan,
            "valid_loss": split_metric(model, backend, data, "valid", limit=blocks),
            "train_loss": report.mean_loss(last=20),
            "decoder_params": count_non_embedding_params(model),
            "params": sum(p.numel() for p in model.parameters()), "seconds": seconds}


def load(path: Path) -> list[dict[str, Any]]:
    if not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run(args: argparse.Namespace) -> list[dict[str, Any]]:
    plan = recipe(args)
    done = [r for r in load(args.out) if r["recipe"] == plan]
    have = {(r["arch"], r["seed"]) for r in done}
    todo = [(a, s) for a in networks(args.networks) for s in args.seeds if (a, s) not in have]
    print(f"gpt reference: {len(have)} runs cached, {len(todo)} to train "
          f"({args.jobs} processes)", flush=True)
    args.out.parent.mkdir(parents=True, exist_ok=True)
    with ProcessPoolExecutor(args.jobs, mp_context=get_context("spawn")) as pool:
        futures = [pool.submit(train_one, a, s, plan) for a, s in todo]
        for i, future in enumerate(as_completed(futures), start=1):
            row = future.result()
            with args.out.open("a") as fh:
                fh.write(json.dumps(row) + "\n")
            done.append(row)
            print(f"  [{i}/{len(todo)}] {row['arch']} seed {row['seed']}: valid "
                  f"{row['valid_loss']:.4f} nats/token ({row['seconds']:.0f} s)", flush=True)
    return done


def by_network(rows: list[dict[str, Any]], seeds: list[int]) -> dict[str, list[float]]:
    """Each network's validation losses, one per seed, for networks that have every seed."""
    table: dict[str, dict[int, float]] = {}
    for row in rows:
        table.setdefault(row["arch"], {})[row["seed"]] = row["valid_loss"]
    return {a: [v[s] for s in seeds] for a, v in table.items() if all(s in v for s in seeds)}


def summary(rows: list[dict[str, Any]], seeds: list[int]) -> dict[str, Any]:
    table = by_network(rows, seeds)
    means = [statistics.mean(v) for v in table.values()]
    out: dict[str, Any] = {"networks": len(table), "seeds": seeds,
                           "loss_min": min(means), "loss_max": max(means),
                           "seconds": sum(r["seconds"] for r in rows)}
    if len(seeds) >= 2:
        first = [v[0] for v in table.values()]
        second = [v[1] for v in table.values()]
        out["seed_tau"] = float(kendalltau(first, second).statistic)
        out["seed_gap_mean"] = statistics.mean(abs(a - b) for a, b in zip(first, second))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--networks", type=int, default=60)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1])
    parser.add_argument("--steps", type=int, default=800)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    parser.add_argument("--eval-tokens", type=int, default=65536)
    parser.add_argument("--jobs", type=int, default=2)
    parser.add_argument("--out", type=Path, default=OUT)
    args = parser.parse_args()
    rows = run(args)
    s = summary([r for r in rows if r["arch"] in set(networks(args.networks))], args.seeds)
    print(f"\ngpt reference: {s['networks']} networks x {len(args.seeds)} seeds, "
          f"{args.steps} steps of {args.batch} x {CONTEXT} byte tokens each "
          f"({s['seconds'] / 60:.0f} CPU-minutes of training)")
    print(f"  validation loss of the networks' means: {s['loss_min']:.3f} .. "
          f"{s['loss_max']:.3f} nats/token")
    if "seed_tau" in s:
        print(f"  seed-to-seed Kendall tau (the ceiling): {s['seed_tau']:.3f}; mean gap "
              f"between seeds {s['seed_gap_mean']:.4f} nats/token")


if __name__ == "__main__":
    main()
