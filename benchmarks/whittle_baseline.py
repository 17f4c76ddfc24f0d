"""The whittle baseline of the compression race (``benchmarks/compress.py``): whittle (two-stage
NAS on LitGPT: a weight-sharing super-network trained with the sandwich rule, then a search of its
sub-networks) compresses the same trained parent that frugalnas compresses, and the chosen
sub-network is scored exactly as frugalnas's child is (mean cross-entropy in nats per token on the
first 256 validation blocks of the Shakespeare corpus, split by work).

whittle lives in its own virtual environment (it pins LitGPT, transformers, syne-tune, ...), set up
as a new user would::

    python3.11 -m venv /work/whittle-venv
    /work/whittle-venv/bin/pip install torch==2.13.0 \
        --index-url https://download.pytorch.org/whl/cpu
    /work/whittle-venv/bin/pip install whittle==0.6.0 torch==2.13.0
    /work/whittle-venv/bin/pip uninstall -y torchvision

(whittle 0.6.0 brings LitGPT 0.5.12, syne-tune 0.13, transformers 4.53, numpy and safetensors.
Pinning ``torch==2.13.0`` in the second command keeps the CPU wheel: without it pip replaces it by
the CUDA build of torch 2.14 that the newest torchvision asks for. The torchvision 0.28 that comes
instead is built for another torch and fails to import (``operator torchvision::nms does not
exist``); transformers imports it when it is there, whittle never uses it: hence the uninstall.)

Then, from the repository root, with frugalnas's own environment::

    python benchmarks/whittle_baseline.py [--parent benchmarks/results/compress/parent]
        [--budgets 0.5 0.25] [--seeds 0 1 2] [--tokens 300000]
        [--results benchmarks/results/compress_whittle.json]

The script runs in three processes per seed, the middle one with ``--whittle-python``
(``$WHITTLE_PYTHON``, default ``/work/whittle-venv/bin/python``), which has no frugalnas:

1. *prepare* (here): read the frugalnas checkpoint, convert it to a LitGPT ``Config`` and state
   dict (``transformer.wte``, ``transformer.h.i.norm_1/attn.qkv/attn.proj/norm_2/mlp.fc/mlp.proj``,
   ``transformer.ln_f``, ``lm_head``; q, k and v stacked in that order in ``attn.qkv``, as LitGPT
   0.5.12 holds them), and write the token arrays: the seed's training batches (16 blocks of 128,
   in the order ``TextSource.batches("train", 16, seed=seed)`` gives them, as frugalnas distils),
   the first 256 validation blocks, and the parent's logits on 4 of them.
2. *whittle* (the whittle environment): check that LitGPT's ``GPT`` and whittle's super-network
   ``whittle.models.gpt.GPT`` give the parent's logits (atol 1e-4); train the super-network on
   ``--tokens`` training tokens with whittle's ``SandwichStrategy`` (each step: the whole network,
   two sub-networks drawn by whittle's ``RandomSampler`` from the search space of whittle's
   ``pretrain_super_network``, and the smallest one; whittle's gradient scaling, clipping at 1.0
   and LitGPT's ``get_lr`` cosine schedule) with whittle's ``DistillLoss`` against the frozen parent
   (``--loss distill``, the default: the Kullback-Leibler divergence to the parent's logits at
   temperature 1, as frugalnas distils; ``--loss ce`` trains on the next tokens only, as whittle's
   pre-training does); then, per budget, whittle's ``multi_objective_search`` (random search, the
   search space of whittle's ``search_sub_networks``: width, heads, MLP ratio 1-4 and depth, alike
   in every layer; ``select_sub_network``) with the objectives validation loss (the first
   ``--search-valid`` validation blocks, as frugalnas's search scores on 64) and non-embedding
   parameters. A sub-network over the budget (blocks + final norm <= budget x the parent's) is
   answered without evaluation; the best feasible one by validation loss is chosen, taken out with
   ``extract_current_sub_network`` and saved with its config and its logits on the 4 blocks.
3. *score* (here): convert the chosen sub-network to an ``ElasticGPT`` checkpoint, check its
   logits against whittle's (atol 1e-4) and its parameters against whittle's count, and score it
   with ``split_metric(model, SingleDeviceBackend("cpu"), data, limit=256)``.

One line per (budget, seed): ``whittle params=B seed S: LOSS (shape, N non-embedding
parameters)``; the rows go to ``--results``. The super-network of a seed is trained once and
searched for every budget (whittle's two stages), so its seconds count in each budget's row.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
CORPUS = ROOT.parent / "shared" / "data" / "shakespeare"
RESULTS = ROOT / "benchmarks" / "results"
WHITTLE_PYTHON = os.environ.get("WHITTLE_PYTHON", "/work/whittle-venv/bin/python")
VALID_BLOCKS = 256          # the blocks every method of the race is scored on
CHECK_BLOCKS = 4            # the blocks the logits of each conversion are compared on
ATOL = 1e-4
BATCH = 16
EVAL_BATCH = 64             # blocks per evaluation batch (frugalnas: 8192 tokens / 128)
INFEASIBLE = 1e9            # the loss the search is told for a sub-network over the budget


# -- frugalnas's side (frugalnas's environment) ------------------------------------------------
def _checkpoints() -> Any:
    """frugalnas's checkpoint module."""
    from frugalnas.compression import checkpoint

    return checkpoint


def litgpt_config(config: Any) -> dict[str, Any]:
    """The keyword arguments of the LitGPT ``Config`` of a frugalnas ``GPTConfig``; a clear
    ``SystemExit`` for what LitGPT cannot hold."""
    problems = []
    if config.positions != "rotary":
        problems.append(f"positions {config.positions!r} (LitGPT has rotary positions only)")
    if not config.causal:
        problems.append("a non-causal attention")
    if config.tie_weights:
        problems.append("a head tied to the embedding")
    if config.gated:
        problems.append("a gated MLP")
    if config.activation not in ("gelu", "gelu_tanh"):
        problems.append(f"activation {config.activation!r} in a plain MLP")
    if float(config.rope_base) != int(config.rope_base):
        problems.append(f"rope_base {config.rope_base} (LitGPT's is an integer)")
    if problems:
        raise SystemExit("the parent cannot be held by LitGPT/whittle: " + "; ".join(problems))
    ranges = {"layers": config.max_depth, "heads": config.max_heads,
              "MLP units / width": config.max_mlp_hidden // config.max_width}
    small = [f"{what} {n}" for what, n in ranges.items() if n < 3]
    if small:
        # whittle 0.6.0's searches start from the middle of each range, (upper - lower) // 2,
        # which is 0, outside the range 1..upper, when upper < 3 (syne-tune then refuses it)
        raise SystemExit("whittle's search needs at least 3 layers, 3 heads and 3 x the width in "
                         "MLP units (it starts from (upper - lower) // 2 of each range); the "
                         "parent has " + ", ".join(small))
    return dict(
        name="frugalnas-parent", block_size=config.context, vocab_size=config.vocab_size,
        padded_vocab_size=config.vocab_size, padding_multiple=1, n_layer=config.max_depth,
        n_embd=config.max_width, n_head=config.max_heads, head_size=config.head_dim,
        n_query_groups=config.kv_heads or config.max_heads, rotary_percentage=1.0,
        rope_base=int(config.rope_base), parallel_residual=False, shared_attention_norm=False,
        bias=config.bias, attn_bias=config.bias, lm_head_bias=False,
        norm_class_name="LayerNorm" if config.norm == "layernorm" else "RMSNorm",
        norm_eps=config.norm_eps, mlp_class_name="GptNeoxMLP",
        intermediate_size=config.max_mlp_hidden,
        gelu_approximate="tanh" if config.activation == "gelu_tanh" else "none")


def to_litgpt(model: Any) -> dict[str, Any]:
    """LitGPT's state dict of an ``ElasticGPT``'s largest network (blocks in index order)."""
    import torch

    def norm(prefix: str, module: Any) -> dict[str, Any]:
        out = {f"{prefix}.weight": module.weight}
        if getattr(module, "bias", None) is not None:
            out[f"{prefix}.bias"] = module.bias
        return out

    def linear(prefix: str, *layers: Any) -> dict[str, Any]:
        out = {f"{prefix}.weight": torch.cat([layer.weight for layer in layers])}
        if layers[0].bias is not None:
            out[f"{prefix}.bias"] = torch.cat([layer.bias for layer in layers])
        return out

    state = {"transformer.wte.weight": model.tok.weight, "lm_head.weight": model.head.weight,
             **norm("transformer.ln_f", model.norm)}
    for i, block in enumerate(model.blocks):
        p = f"transformer.h.{i}"
        state.update(norm(f"{p}.norm_1", block.norm1))
        state.update(norm(f"{p}.norm_2", block.norm2))
        state.update(linear(f"{p}.attn.qkv", block.attn.q, block.attn.k, block.attn.v))
        state.update(linear(f"{p}.attn.proj", block.attn.out))
        state.update(linear(f"{p}.mlp.fc", block.mlp.fc))
        state.update(linear(f"{p}.mlp.proj", block.mlp.proj))
    return {k: v.detach().clone().contiguous() for k, v in state.items()}


def from_litgpt(lit: dict[str, Any], state: dict[str, Any], parent: Any) -> Any:
    """The ``ElasticGPT`` of a (uniform) LitGPT sub-network config ``lit`` and its state dict,
    with the parent's positions, norm, activation and bias."""
    import dataclasses

    import torch

    from frugalnas.nn.transformer import ElasticGPT

    groups = lit["n_query_groups"]
    config = dataclasses.replace(
        parent.config, max_width=lit["n_embd"], max_depth=lit["n_layer"],
        max_heads=lit["n_head"], head_dim=lit["head_size"],
        max_mlp_hidden=lit["intermediate_size"],
        kv_heads=None if groups == lit["n_head"] else groups)
    child = ElasticGPT.from_config(config)
    q_size = lit["n_head"] * lit["head_size"]
    kv_size = groups * lit["head_size"]
    ours: dict[str, Any] = {"tok.weight": state["transformer.wte.weight"],
                            "head.weight": state["lm_head.weight"]}
    for name in ("weight", "bias"):
        if f"transformer.ln_f.{name}" in state:
            ours[f"norm.{name}"] = state[f"transformer.ln_f.{name}"]
    for i in range(lit["n_layer"]):
        p, b = f"transformer.h.{i}", f"blocks.{i}"
        for name in ("weight", "bias"):
            for theirs, mine in (("norm_1", "norm1"), ("norm_2", "norm2"),
                                 ("attn.proj", "attn.out"), ("mlp.fc", "mlp.fc"),
                                 ("mlp.proj", "mlp.proj")):
                if f"{p}.{theirs}.{name}" in state:
                    ours[f"{b}.{mine}.{name}"] = state[f"{p}.{theirs}.{name}"]
            if f"{p}.attn.qkv.{name}" in state:
                q, k, v = torch.split(state[f"{p}.attn.qkv.{name}"], [q_size, kv_size, kv_size])
                ours.update({f"{b}.attn.q.{name}": q, f"{b}.attn.k.{name}": k,
                             f"{b}.attn.v.{name}": v})
    child.load_state_dict({k: v.contiguous() for k, v in ours.items()}, strict=True)
    return child.eval()


def corpus(path: Path, context: int) -> Any:
    from frugalnas.datasets.text import TextSource

    return TextSource.open(path.resolve(), seed=0, context=context)


def valid_loss(model: Any, data: Any) -> float:
    from frugalnas.backends.single_device import SingleDeviceBackend
    from frugalnas.engine.training import split_metric

    return float(split_metric(model.eval(), SingleDeviceBackend("cpu"), data,
                              limit=VALID_BLOCKS))


def prepare(args: argparse.Namespace, work: Path) -> dict[str, Any]:
    """The parent in LitGPT's format, the data as arrays, the parent's reference logits."""
    import numpy as np
    import torch

    parent, _ = _checkpoints().read_checkpoint(args.parent)
    lit = litgpt_config(parent.config)
    data = corpus(args.corpus, parent.config.context)
    (work / "parent").mkdir(parents=True, exist_ok=True)
    (work / "parent" / "config.json").write_text(json.dumps(lit, indent=1) + "\n")
    torch.save(to_litgpt(parent), work / "parent" / "lit_model.pth")
    x, y = data.head("valid", VALID_BLOCKS)
    np.save(work / "valid.npy", torch.cat([x, y[:, -1:]], dim=1).numpy())
    with torch.no_grad():
        logits = parent(x[:CHECK_BLOCKS])
    torch.save({"tokens": x[:CHECK_BLOCKS].clone(), "logits": logits}, work / "check.pt")
    info = {"parent_params": parent.non_embedding_params(), "parent_loss": valid_loss(parent, data),
            "blocks": int(len(x))}
    (work / "parent.json").write_text(json.dumps(info, indent=1) + "\n")
    return info


def training_batches(args: argparse.Namespace, context: int, seed: int, out: Path) -> int:
    """The seed's training batches for ``--tokens`` tokens, in frugalnas's order (the seed's
    epochs of ``TextSource.batches``), as one (blocks, context + 1) array and the batch sizes."""
    import numpy as np
    import torch

    data = corpus(args.corpus, context)
    steps = max(1, math.ceil(args.tokens / (BATCH * context)))
    rows, sizes, epoch = [], [], 0
    while len(sizes) < steps:
        for x, y in data.batches("train", BATCH, seed=seed, epoch=epoch):
            rows.append(torch.cat([x, y[:, -1:]], dim=1).numpy())
            sizes.append(len(x))
            if len(sizes) == steps:
                break
        epoch += 1
    np.savez(out, blocks=np.concatenate(rows), sizes=np.array(sizes))
    return steps


def score(args: argparse.Namespace, child_dir: Path, parent: Any, data: Any) -> dict[str, Any]:
    """The chosen sub-network as an ``ElasticGPT`` checkpoint, checked against whittle's logits
    and parameter count, and its validation loss."""
    import torch

    meta = json.loads((child_dir / "child.json").read_text())
    lit = meta["config"]
    sizes = [lit["n_embd"], lit["n_head"], lit["intermediate_size"], lit["n_query_groups"]]
    if any(isinstance(s, list) for s in sizes):     # per-layer sizes: not an ElasticGPT shape
        return {"loss": meta["whittle_loss"], "scored_by": "whittle", "shape": meta["shape"]}
    state = torch.load(child_dir / "lit_model.pth", map_location="cpu", weights_only=True)
    child = from_litgpt(lit, state, parent)
    check = torch.load(child_dir / "check.pt", weights_only=True)
    with torch.no_grad():
        diff = (child(check["tokens"]) - check["logits"]).abs().max().item()
    if diff > ATOL:
        raise SystemExit(f"{child_dir}: the converted child's logits differ from whittle's by "
                         f"{diff:.2e} (> {ATOL})")
    params = child.non_embedding_params()
    if params != meta["params"]:
        raise SystemExit(f"{child_dir}: {params} non-embedding parameters here, whittle counted "
                         f"{meta['params']}")
    _checkpoints().save_checkpoint(child, child_dir / "frugalnas",
                                   {"text": {"tokenizer": "bytes"}, "whittle": meta["config"]})
    loss = valid_loss(child, data)
    if abs(loss - meta["whittle_loss"]) > 1e-3:
        raise SystemExit(f"{child_dir}: frugalnas scores {loss:.5f}, whittle "
                         f"{meta['whittle_loss']:.5f}")
    return {"loss": loss, "scored_by": "frugalnas", "logits_diff": diff}


def run(args: argparse.Namespace) -> dict[str, Any]:
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    start = time.perf_counter()
    info = prepare(args, work)
    parent, _ = _checkpoints().read_checkpoint(args.parent)
    data = corpus(args.corpus, parent.config.context)
    print(f"parent: {info['parent_params']:,} non-embedding parameters, validation loss "
          f"{info['parent_loss']:.4f} nats/token ({time.perf_counter() - start:.0f} s to prepare)",
          flush=True)
    options = {k: getattr(args, k) for k in ("tokens", "lr", "min_lr", "loss", "kd_alpha",
                                               "kd_beta", "kd_temperature", "search_strategy",
                                               "search_samples", "search_valid")}
    results: dict[str, Any] = {**info, "parent": str(args.parent), "options": options,
                               "runs": []}
    for seed in args.seeds:
        out = work / f"seed{seed}"
        out.mkdir(parents=True, exist_ok=True)
        steps = training_batches(args, parent.config.context, seed, out / "train.npz")
        command = [args.whittle_python, str(Path(__file__).resolve()), "whittle", "--work",
                   str(work), "--out", str(out), "--seed", str(seed), "--lr", str(args.lr),
                   "--min-lr", str(args.min_lr), "--loss", args.loss,
                   "--search-samples", str(args.search_samples),
                   "--search-strategy", args.search_strategy,
                   "--search-valid", str(args.search_valid),
                   "--kd-alpha", str(args.kd_alpha), "--kd-beta", str(args.kd_beta),
                   "--kd-temperature", str(args.kd_temperature),
                   "--budgets", *[str(b) for b in args.budgets]]
        print(f"seed {seed}: whittle trains the super-network for {steps} steps of {BATCH} x "
              f"{parent.config.context} tokens, then searches", flush=True)
        if subprocess.run(command, cwd=ROOT).returncode:
            raise SystemExit(f"the whittle process of seed {seed} failed (see above)")
        found = json.loads((out / "whittle.json").read_text())
        for row in found["budgets"]:
            scored = score(args, Path(row["dir"]), parent, data)
            seconds = {"supernet": found["supernet_seconds"], "search": row["search_seconds"]}
            seconds["total"] = seconds["supernet"] + seconds["search"]
            entry = {"budget": row["budget"], "seed": seed, "loss": scored["loss"],
                     "params": row["params"], "shape": row["shape"], "seconds": seconds,
                     "whittle_config": row["config"], "search_loss": row["search_loss"],
                     "feasible": row["feasible"], "evaluated": row["evaluated"],
                     "samples": row["samples"], "scored_by": scored["scored_by"],
                     "supernet_search_loss": found["supernet_loss"]}
            results["runs"].append(entry)
            print(f"whittle params={row['budget']:g} seed {seed}: {scored['loss']:.4f} "
                  f"({row['shape']}, {row['params']:,} non-embedding parameters)", flush=True)
        results["wall_seconds"] = time.perf_counter() - start
        write(args.results, results)        # after every seed: a cut run keeps its seeds
    return results


def write(path: Path, results: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(results, indent=1, default=str) + "\n")


def summary(results: dict[str, Any]) -> list[str]:
    lines = [f"parent: {results['parent_params']:,} non-embedding parameters, "
             f"{results['parent_loss']:.4f} nats/token"]
    for budget in sorted({r["budget"] for r in results["runs"]}, reverse=True):
        rows = [r for r in results["runs"] if r["budget"] == budget]
        losses = [r["loss"] for r in rows]
        spread = statistics.stdev(losses) if len(losses) > 1 else 0.0
        seconds = statistics.mean(r["seconds"]["total"] for r in rows)
        lines.append(f"whittle params={budget:g} ({len(rows)} seeds): "
                     f"{statistics.mean(losses):.4f} +- {spread:.4f}, {seconds:.0f} s each "
                     f"(super-network shared by the budgets)")
    return lines


# -- whittle's side (the whittle environment: no frugalnas) -------------------------------------
def _logits_diff(model: Any, check: dict[str, Any]) -> float:
    import torch

    model.eval()
    with torch.no_grad():
        return float((model(check["tokens"]) - check["logits"]).abs().max().item())


def _loss(model: Any, blocks: Any) -> float:
    """Mean cross-entropy in nats over all tokens of ``blocks`` (N, T + 1), as frugalnas's
    ``split_metric`` sums it batch by batch."""
    import torch
    import torch.nn.functional as F

    model.eval()
    total, count = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(blocks), EVAL_BATCH):
            x, y = blocks[i:i + EVAL_BATCH, :-1], blocks[i:i + EVAL_BATCH, 1:]
            logits = model(x)
            total += float(F.cross_entropy(logits.flatten(0, -2).float(), y.flatten(),
                                           reduction="sum").item())
            count += int(y.numel())
    return total / count


def whittle_main(args: argparse.Namespace) -> None:
    import numpy as np
    import torch
    import torch.nn.functional as F
    from litgpt import Config
    from litgpt.model import GPT as LitGPT
    from litgpt.pretrain import get_lr
    from syne_tune.config_space import lograndint, randint

    from whittle.loss import DistillLoss
    from whittle.metrics.parameters import (compute_parameters, params_embedding_layer,
                                            params_linear_layer)
    from whittle.models.gpt import GPT
    from whittle.models.gpt.extract import extract_current_sub_network
    from whittle.pretrain_super_network import get_search_space
    from whittle.sampling.random_sampler import RandomSampler
    from whittle.search import multi_objective_search
    from whittle.training_strategies import SandwichStrategy

    work, out = Path(args.work), Path(args.out)
    torch.manual_seed(args.seed)
    np.random.seed(args.seed)
    config = Config(**json.loads((work / "parent" / "config.json").read_text()))
    state = torch.load(work / "parent" / "lit_model.pth", map_location="cpu", weights_only=True)
    check = torch.load(work / "check.pt", weights_only=True)
    teacher = LitGPT(config)
    teacher.load_state_dict(state, strict=True)
    supernet = GPT(config)
    supernet.load_state_dict(state, strict=True)
    for name, model in (("LitGPT's GPT", teacher), ("whittle's super-network", supernet)):
        diff = _logits_diff(model, check)
        print(f"  {name}: logits within {diff:.1e} of frugalnas's", flush=True)
        if diff > ATOL:
            raise SystemExit(f"{name} differs from the frugalnas parent by {diff:.2e} (> {ATOL})")
    for p in teacher.parameters():
        p.requires_grad_(False)

    # -- stage 1: the super-network, trained with the sandwich rule --------------------------
    train = np.load(out / "train.npz")
    blocks, sizes = torch.from_numpy(train["blocks"]).long(), train["sizes"]
    sampler = RandomSampler(search_space=get_search_space(config), seed=args.seed)
    kd = DistillLoss(alpha=args.kd_alpha, beta=args.kd_beta, temperature=args.kd_temperature,
                     loss="forward_kld")
    teacher_logits: list[Any] = [None]

    def loss_function(logits: Any, targets: Any) -> Any:
        logits, targets = logits.flatten(0, -2), targets.flatten()
        if args.loss == "ce":
            return F.cross_entropy(logits, targets)
        return kd(logits, targets, teacher_logits[0].flatten(0, -2))

    strategy = SandwichStrategy(sampler=sampler, loss_function=loss_function)
    optimizer = torch.optim.AdamW(supernet.parameters(), lr=args.lr, weight_decay=0.0)
    steps, at, start = len(sizes), 0, time.perf_counter()
    supernet.train()
    for step, size in enumerate(sizes):
        for group in optimizer.param_groups:
            group["lr"] = get_lr(args.lr, step, 0, steps, args.min_lr)
        batch = blocks[at:at + size]
        at += size
        x, y = batch[:, :-1], batch[:, 1:]
        if args.loss == "distill":
            with torch.no_grad():
                teacher_logits[0] = teacher(x)
        # as whittle's pretrain_super_network scales a strategy of several sub-networks
        loss = strategy(supernet, x, y, scale_loss=1 / strategy.random_samples)
        torch.nn.utils.clip_grad_norm_(supernet.parameters(), max_norm=1.0)
        optimizer.step()
        optimizer.zero_grad()
        if (step + 1) % 25 == 0 or step + 1 == steps:
            print(f"  step {step + 1}/{steps}: sandwich loss {loss:.3f}, "
                  f"{time.perf_counter() - start:.0f} s", flush=True)
    supernet.reset_super_network()
    supernet_seconds = time.perf_counter() - start

    # -- stage 2: the search, per budget -------------------------------------------------------
    valid = torch.from_numpy(np.load(work / "valid.npy")).long()
    search_blocks = valid[:args.search_valid]
    parent_params = non_embedding(supernet, compute_parameters, params_linear_layer,
                                  params_embedding_layer)
    search_space = {"embed_dim": lograndint(1, config.n_embd),
                    "num_heads": randint(1, config.n_head),
                    # whittle's ratios 1 to 4, for a parent of 4 x n_embd MLP units
                    "mlp_ratio": randint(1, config.intermediate_size // config.n_embd),
                    "depth": randint(1, config.n_layer)}
    full_loss = _loss(supernet, search_blocks)       # the whole network after the training
    print(f"  the whole super-network after training: {full_loss:.4f} on the "
          f"{len(search_blocks)} search blocks (the parent: {_loss(teacher, search_blocks):.4f})",
          flush=True)
    found = {"supernet_seconds": supernet_seconds, "steps": int(steps),
             "parent_params": parent_params, "supernet_loss": full_loss, "budgets": []}
    for budget in args.budgets:
        bound = int(budget * parent_params)
        evaluated = [0]

        def objective(sub: dict[str, Any], model: Any) -> tuple[float, float]:
            model.select_sub_network(sub)
            params = non_embedding(model, compute_parameters, params_linear_layer,
                                   params_embedding_layer)
            if params > bound:          # over the budget: not worth evaluating
                loss = INFEASIBLE
            else:
                loss = _loss(model, search_blocks)
                evaluated[0] += 1
            model.reset_super_network()
            return loss, float(params)

        start = time.perf_counter()
        search = multi_objective_search(objective, search_space,
                                        objective_kwargs={"model": supernet},
                                        search_strategy=args.search_strategy,
                                        num_samples=args.search_samples, seed=args.seed,
                                        verbose=False)
        costs = np.asarray(search["costs"])
        feasible = [i for i in range(len(costs)) if costs[i, 1] <= bound
                    and costs[i, 0] < INFEASIBLE]
        if not feasible:
            raise SystemExit(f"budget {budget:g}: none of {len(costs)} sampled sub-networks "
                             f"fits {bound} non-embedding parameters; raise --search-samples")
        best = min(feasible, key=lambda i: costs[i, 0])
        chosen = {k: int(v) if not isinstance(v, float) else v
                  for k, v in search["configs"][best].items()}
        supernet.select_sub_network(chosen)
        params = non_embedding(supernet, compute_parameters, params_linear_layer,
                               params_embedding_layer)
        child = extract_current_sub_network(supernet).eval()
        supernet.reset_super_network()
        search_seconds = time.perf_counter() - start
        folder = out / f"params{budget:g}"
        folder.mkdir(parents=True, exist_ok=True)
        lit = {k: v for k, v in vars(child.config).items()
               if k in Config.__dataclass_fields__}
        torch.save({k: v.detach().clone() for k, v in child.state_dict().items()},
                   folder / "lit_model.pth")
        with torch.no_grad():
            torch.save({"tokens": check["tokens"], "logits": child(check["tokens"])},
                       folder / "check.pt")
        shape = (f"width {lit['n_embd']}, {lit['n_layer']} layers, {lit['n_head']} heads, "
                 f"{lit['intermediate_size']} MLP units")
        meta = {"config": lit, "search_config": chosen, "params": params, "shape": shape,
                "search_loss": float(costs[best, 0]), "whittle_loss": _loss(child, valid)}
        (folder / "child.json").write_text(json.dumps(meta, indent=1, default=str) + "\n")
        found["budgets"].append({"budget": budget, "dir": str(folder), "config": chosen,
                                 "params": params, "shape": shape,
                                 "search_loss": meta["search_loss"],
                                 "search_seconds": search_seconds, "samples": len(costs),
                                 "feasible": len(feasible), "evaluated": evaluated[0]})
        print(f"  params={budget:g}: {len(feasible)} of {len(costs)} sampled sub-networks fit "
              f"{bound:,}; chosen {shape} ({params:,}), search loss {meta['search_loss']:.4f}, "
              f"{search_seconds:.0f} s", flush=True)
    (out / "whittle.json").write_text(json.dumps(found, indent=1) + "\n")


def non_embedding(model: Any, compute_parameters: Any, params_linear_layer: Any,
                  params_embedding_layer: Any) -> int:
    """whittle's parameter count of the active sub-network without its token embedding and
    language-model head: its blocks and final norm, as frugalnas counts."""
    return int(compute_parameters(model) - params_linear_layer(model.lm_head)
               - params_embedding_layer(model.transformer.wte))


# -- command line --------------------------------------------------------------------------------
def main() -> None:
    if len(sys.argv) > 1 and sys.argv[1] == "whittle":
        parser = argparse.ArgumentParser(description="the whittle stage (whittle environment)")
        parser.add_argument("stage")
        parser.add_argument("--work", required=True)
        parser.add_argument("--out", required=True)
        parser.add_argument("--seed", type=int, required=True)
        parser.add_argument("--budgets", type=float, nargs="+", required=True)
        add_training_options(parser)
        whittle_main(parser.parse_args())
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--parent", type=Path, default=RESULTS / "compress" / "parent")
    parser.add_argument("--corpus", type=Path, default=CORPUS)
    parser.add_argument("--work", type=Path, default=RESULTS / "compress" / "whittle",
                        help="the exchanged files and the chosen sub-networks")
    parser.add_argument("--results", type=Path, default=RESULTS / "compress_whittle.json")
    parser.add_argument("--budgets", type=float, nargs="+", default=[0.5, 0.25])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--tokens", type=int, default=300_000,
                        help="training tokens of the super-network (batches of 16 x 128)")
    parser.add_argument("--whittle-python", default=WHITTLE_PYTHON,
                        help="the python of whittle's environment ($WHITTLE_PYTHON)")
    add_training_options(parser)
    args = parser.parse_args()
    if not Path(args.whittle_python).exists():
        raise SystemExit(f"no whittle environment at {args.whittle_python}; set it up as this "
                         "script's docstring says, or give --whittle-python")
    results = run(args)
    print("\n".join(summary(results)))
    print(f"{results['wall_seconds']:.0f} s in all; results in {args.results}")


def add_training_options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--lr", type=float, default=1e-3,
                        help="AdamW's peak learning rate (the race's distillation rate)")
    parser.add_argument("--min-lr", type=float, default=0.0,
                        help="the end of LitGPT's cosine schedule")
    parser.add_argument("--loss", choices=("distill", "ce"), default="distill",
                        help="distill: whittle's DistillLoss against the parent; ce: next tokens")
    parser.add_argument("--kd-alpha", type=float, default=0.0,
                        help="DistillLoss's weight of the next-token cross-entropy")
    parser.add_argument("--kd-beta", type=float, default=1.0,
                        help="DistillLoss's weight of the KL divergence to the parent")
    parser.add_argument("--kd-temperature", type=float, default=1.0)
    parser.add_argument("--search-strategy", default="random_search",
                        choices=("random_search", "local_search", "nsga2", "morea"),
                        help="whittle's search strategy (multi_objective_search)")
    parser.add_argument("--search-samples", type=int, default=100,
                        help="sub-networks the random search draws per budget")
    parser.add_argument("--search-valid", type=int, default=64,
                        help="validation blocks the search scores a sub-network on")


if __name__ == "__main__":
    main()
