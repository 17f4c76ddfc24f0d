"""The compression race: one trained ``gpt`` parent on the Shakespeare corpus (42 works, split by
work), compressed to a fraction of its non-embedding parameters by ``frugalnas.compression``, and
two baselines given the same parent, the same text and the same tokens after pruning:

* ``scratch``: the shape frugalnas chose, trained from fresh weights on the next tokens;
* ``supernetS``: frugalnas with its supernet stage, the same tokens split between the supernet
  training before the search (the share ``S``, ``--supernet-share``) and the distillation
  after it;
* ``minitron``: the parent ordered by the same activation importance, pruned to a hand-chosen
  shape (every layer kept, the heads and MLP units of each cut by one factor, as Minitron's
  width pruning), then distilled exactly as frugalnas distils.

Each (budget, seed) prints one line per method; the summary gives the mean and spread of the
validation loss (nats per byte token) over the seeds, beside the parent's, and the seconds of
each frugalnas stage. Under a latency budget (``--latency-budgets``, fractions of the parent's
ONNX Runtime latency) frugalnas runs alone, and the summary says whether each child meets the
bound when measured again. The parent is trained first when ``--parent`` holds none (``--train-steps``
steps of Adam; the command and seed reproduce it). Results go to ``--out`` (resumable: a
finished compression is reused); the figures go to ``--results``, which is also the cache:
a (budget, seed) found there is not run again.

    python benchmarks/compress.py [--budgets 0.5 0.25] [--seeds 0 1 2] [--tokens 300000]
"""

from __future__ import annotations

import argparse
import json
import re
import statistics
import time
from pathlib import Path
from typing import Any

CORPUS = Path(__file__).resolve().parents[1] / ".." / "shared" / "data" / "shakespeare"
RESULTS = Path(__file__).resolve().parent / "results" / "compress"
CONTEXT = 128
#: The parent: a byte-level GPT of 4 layers, width 192, 6 heads of 32, 768 MLP units, rotary
#: positions (so that LitGPT, and with it whittle, holds it exactly).
PARENT = dict(vocab_size=256, max_width=192, max_depth=4, max_heads=6, head_dim=32,
              max_mlp_hidden=768, context=CONTEXT, positions="rotary")
VALID_BLOCKS = 256


def corpus(seed: int = 0) -> Any:
    from frugalnas.datasets.text import TextSource

    return TextSource.open(CORPUS.resolve(), seed=seed, context=CONTEXT)


def train_parent(folder: Path, steps: int, lr: float, batch: int, seed: int = 0) -> Path:
    """Train the parent with Adam and a cosine schedule on the training works; save it as a
    frugalnas checkpoint."""
    import torch

    from frugalnas.compression.checkpoint import is_checkpoint, save_checkpoint
    from frugalnas.engine.training import seed_everything
    from frugalnas.nn.transformer import ElasticGPT
    from frugalnas.spaces.gpt.network import gpt_init

    if is_checkpoint(folder):
        return folder
    seed_everything(seed)
    data = corpus()
    model = gpt_init(ElasticGPT(**PARENT)).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    start, done, epoch = time.perf_counter(), 0, 0
    while done < steps:
        for x, y in data.batches("train", batch, seed=seed, epoch=epoch):
            loss = torch.nn.functional.cross_entropy(model(x).flatten(0, 1), y.flatten())
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
            done += 1
            if done % 100 == 0:
                print(f"parent: step {done}/{steps}, loss {loss.item():.3f}, "
                      f"{time.perf_counter() - start:.0f} s", flush=True)
            if done == steps:
                break
        epoch += 1
    about = {"text": {"tokenizer": "bytes", "context": CONTEXT},
             "training": {"steps": steps, "lr": lr, "batch": batch, "seed": seed,
                          "seconds": time.perf_counter() - start}}
    return save_checkpoint(model.eval(), folder, about)


def valid_loss(model: Any, data: Any) -> float:
    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.engine.training import split_metric

    return split_metric(model.eval(), SingleDeviceBackend("cpu"), data, limit=VALID_BLOCKS)


def minitron_shape(parent: Any, bound: int) -> Any:
    """Every layer and the full width kept; heads and MLP units cut by the one factor that
    fits the bound (heads in whole key/value groups)."""
    from frugalnas.compression.space import Shape

    config = parent.config
    for step in range(100, 0, -1):
        f = step / 100
        heads = max(1, round(config.max_heads * f))
        shape = Shape(config.max_width, config.max_depth, heads,
                      max(8, round(config.max_mlp_hidden * f / 8) * 8))
        if parent.non_embedding_params(shape.subnet()) <= bound:
            return shape
    raise ValueError(f"no width-pruned shape fits {bound} parameters")


def baseline(kind: str, ordered: Any, shape: Any, data: Any, tokens: int, lr: float,
             seed: int) -> float:
    """Validation loss of a baseline child of ``shape`` after ``tokens`` tokens."""
    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.compression.distill import DistillConfig, distill
    from frugalnas.compression.space import shrink
    from frugalnas.engine.training import seed_everything
    from frugalnas.spaces.gpt.network import gpt_init

    seed_everything(seed)
    child = shrink(ordered, shape)
    if kind == "scratch":
        gpt_init(child)
    loss = "next-token" if kind == "scratch" else "distill"
    config = DistillConfig(tokens=tokens, batch_size=16, lr=lr, loss=loss)
    distill(child.train(), ordered, data, SingleDeviceBackend("cpu"), config, seed=seed)
    return valid_loss(child, data)


def run(args: argparse.Namespace) -> dict[str, Any]:
    """Every (budget, seed) of the arguments not yet in ``--results`` (which is kept as it
    goes: a stopped run resumes)."""
    from frugalnas.compression.checkpoint import read_checkpoint

    parent_dir = train_parent(args.parent, args.train_steps, args.train_lr, args.train_batch)
    data = corpus()
    parent, _ = read_checkpoint(parent_dir)
    results: dict[str, Any] = {"runs": [], "latency_runs": []}
    if args.results.exists():
        results.update(json.loads(args.results.read_text()))
    results.update(parent_loss=valid_loss(parent, data),
                   parent_params=parent.non_embedding_params())
    print(f"parent: {results['parent_params']:,} non-embedding parameters, validation loss "
          f"{results['parent_loss']:.4f} nats/token", flush=True)
    for kind, budgets, key in (("params", args.budgets, "runs"),
                               ("latency", args.latency_budgets, "latency_runs")):
        for budget in budgets:
            for seed in args.seeds:
                if any(r["budget"] == budget and r["seed"] == seed for r in results[key]):
                    continue
                row = race(kind, budget, seed, parent_dir, data, args, results["parent_params"])
                results[key].append(row)
                args.results.write_text(json.dumps(results, indent=1, default=str) + "\n")
    method = supernet_method(args.supernet_share)
    for row in results["runs"]:
        if row["budget"] in args.budgets and row["seed"] in args.seeds and method not in row:
            row.update(supernet_race(row["budget"], row["seed"], parent_dir, data, args))
            args.results.write_text(json.dumps(results, indent=1, default=str) + "\n")
    return results


def supernet_method(share: float) -> str:
    """The results' name of frugalnas with its supernet trained on ``share`` of the tokens."""
    return f"supernet{share:g}"


def supernet_race(budget: float, seed: int, parent_dir: Path, data: Any,
                  args: argparse.Namespace) -> dict[str, Any]:
    """frugalnas with the supernet stage, on the same tokens in all."""
    from frugalnas.compression.checkpoint import read_checkpoint
    from frugalnas.compression.pipeline import compress

    trained = int(args.tokens * args.supernet_share)
    result = compress(parent_dir, CORPUS.resolve(), budget=f"params={budget}",
                      out=args.out / f"params{budget:g}-seed{seed}-{supernet_method(args.supernet_share)}",
                      trials=args.trials, seed=seed, context=CONTEXT, valid_examples=64,
                      progress=args.progress, onnx=False, tracking=False,
                      supernet={"tokens": trained, "lr": args.lr},
                      distill={"tokens": args.tokens - trained, "lr": args.lr})
    child, _ = read_checkpoint(result.model)
    name = supernet_method(args.supernet_share)
    row = {name: valid_loss(child, data), f"{name}_shape": str(result.shape),
           f"{name}_params": result.child_params, f"{name}_seconds": result.seconds,
           f"{name}_tokens": trained}
    print(f"params={budget:g} seed {seed}: frugalnas with its supernet on {trained:,} tokens "
          f"{row[name]:.4f} ({result.shape})", flush=True)
    return row


def race(kind: str, budget: float, seed: int, parent_dir: Path, data: Any,
         args: argparse.Namespace, parent_params: int) -> dict[str, Any]:
    """frugalnas under one budget, and (for a parameter budget) the two baselines."""
    from frugalnas.compression.checkpoint import read_checkpoint
    from frugalnas.compression.pipeline import compress

    out = args.out / f"{kind}{budget:g}-seed{seed}"
    start = time.perf_counter()
    result = compress(parent_dir, CORPUS.resolve(), budget=f"{kind}={budget}", out=out,
                      trials=args.trials, seed=seed, context=CONTEXT, valid_examples=64,
                      progress=args.progress, onnx=False, tracking=False,
                      distill={"tokens": args.tokens, "lr": args.lr})
    child, _ = read_checkpoint(result.model)
    row = {"budget": budget, "seed": seed, "shape": str(result.shape),
           "frugalnas": valid_loss(child, data), "frugalnas_params": result.child_params,
           "latency_ms": result.latency_ms, "seconds": result.seconds,
           "wall_seconds": time.perf_counter() - start}
    if kind == "latency":
        report = json.loads((out / "report.json").read_text())
        row.update(bound_ms=report["bound"], meets_budget=report["meets_budget"])
        print(f"latency={budget:g} seed {seed}: frugalnas {row['frugalnas']:.4f} "
              f"({result.shape}), {result.latency_ms['child']:.3g} ms for a bound of "
              f"{report['bound']:.3g} ms (parent {result.latency_ms['parent']:.3g} ms)",
              flush=True)
        return row
    ordered, _ = read_checkpoint(out / "ordered")
    hand = minitron_shape(ordered, int(budget * parent_params))
    row.update(minitron_shape=str(hand), minitron_params=ordered.non_embedding_params(
        hand.subnet()))
    row["minitron"] = baseline("minitron", ordered, hand, data, args.tokens, args.lr, seed)
    row["scratch"] = baseline("scratch", ordered, result.shape, data, args.tokens,
                              args.scratch_lr, seed)
    print(f"params={budget:g} seed {seed}: frugalnas {row['frugalnas']:.4f} "
          f"({result.shape}), minitron {row['minitron']:.4f} ({hand}), scratch "
          f"{row['scratch']:.4f}", flush=True)
    return row


def summary(results: dict[str, Any]) -> list[str]:
    lines = [f"parent: {results['parent_params']:,} non-embedding parameters, "
             f"{results['parent_loss']:.4f} nats/token"]
    for budget in sorted({r["budget"] for r in results["runs"]}, reverse=True):
        rows = [r for r in results["runs"] if r["budget"] == budget]
        parts = []
        shares = sorted({k for r in rows for k in r if re.fullmatch(r"supernet[0-9.]+", k)})
        for method in ("frugalnas", *shares, "minitron", "scratch"):
            values = [r[method] for r in rows if method in r]
            if not values:
                continue
            spread = statistics.stdev(values) if len(values) > 1 else 0.0
            parts.append(f"{method} {statistics.mean(values):.4f} +- {spread:.4f}")
        stages = {k: statistics.mean(r["seconds"][k] for r in rows) for k in rows[0]["seconds"]}
        lines.append(f"params={budget:g} ({len(rows)} seeds): " + ", ".join(parts))
        lines.append("  frugalnas stages (mean s): " +
                     ", ".join(f"{k} {v:.0f}" for k, v in stages.items()))
        for share in shares:
            timed = [r[f"{share}_seconds"] for r in rows if f"{share}_seconds" in r]
            lines.append(f"  {share} stages (mean s): " + ", ".join(
                f"{k} {statistics.mean(s.get(k, 0.0) for s in timed):.0f}" for k in timed[0]))
    for budget in sorted({r["budget"] for r in results.get("latency_runs", [])}, reverse=True):
        rows = [r for r in results["latency_runs"] if r["budget"] == budget]
        values = [r["frugalnas"] for r in rows]
        spread = statistics.stdev(values) if len(values) > 1 else 0.0
        met = sum(bool(r["meets_budget"]) for r in rows)
        lines.append(f"latency={budget:g} ({len(rows)} seeds): frugalnas "
                     f"{statistics.mean(values):.4f} +- {spread:.4f}; the child meets the "
                     f"bound when measured again in {met} of {len(rows)}")
    return lines


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", type=Path, default=RESULTS / "parent")
    parser.add_argument("--out", type=Path, default=RESULTS / "runs")
    parser.add_argument("--results", type=Path, default=RESULTS.parent / "compress.json",
                        help="where the figures are written")
    parser.add_argument("--budgets", type=float, nargs="*", default=[0.5, 0.25])
    parser.add_argument("--latency-budgets", type=float, nargs="*", default=[0.5],
                        help="latency budgets, as fractions of the parent's")
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tokens", type=int, default=300_000,
                        help="tokens after pruning, for every method")
    parser.add_argument("--trials", type=int, default=30)
    parser.add_argument("--supernet-share", type=float, default=0.5,
                        help="the share of --tokens that trains the supernet before the "
                             "search, in the supernet method")
    parser.add_argument("--lr", type=float, default=1e-3, help="distillation learning rate")
    parser.add_argument("--scratch-lr", type=float, default=3e-3)
    parser.add_argument("--train-steps", type=int, default=2000)
    parser.add_argument("--train-lr", type=float, default=2e-3)
    parser.add_argument("--train-batch", type=int, default=16)
    parser.add_argument("--progress", action="store_true", help="the stages' progress lines")
    args = parser.parse_args()
    results = run(args)
    print("\n".join(summary(results)))


if __name__ == "__main__":
    main()
