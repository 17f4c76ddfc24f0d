"""SI-evolution (sampled training + node inheritance) against regularized evolution that trains
every candidate, on the DAG space, measured side by side in one run.

Prints, for both searches run to the same number of candidates: search compute (wall seconds,
FLOPs summed over the trials' costs), the best architecture's validation accuracy after
retraining it from scratch; then Kendall tau between inherited-weight accuracy (the final
shared store) and stand-alone trained accuracy for random candidates; then an ablation of
channel attention (the SE decision on vs off) under the same si-evolution budget.

    python benchmarks/sievo.py --tau-cache sievo_tau_ref.json   # digits, ~30 minutes on 2 cores
    python benchmarks/sievo.py --dataset mnist5k --parts search  # 28x28 inputs

The default search size is 50 candidates (population 10, 4 generations of 10 offspring, 400
warm-up batches, 60 per generation): on mnist5k its winners retrain 1.26 points below train-each
REA's at 9.5x less compute (docs/benchmarks.md, four seeds); the 18-candidate size
(``--population 6 --offspring 6 --generations 2 --batches 30 --warmup 0``) misses by 2.5 points
at 10.2x with a 200-batch warm-up.

The stand-alone reference of the tau part (30 candidates x ``--tau-seeds`` trainings) is the
expensive part; ``--tau-cache`` keeps it between runs, and ``--parts reference`` computes only
that.
"""

from __future__ import annotations

import argparse
import itertools
import json
import multiprocessing
import os
import random
import time
from collections import deque
from concurrent.futures import ProcessPoolExecutor, as_completed

import numpy as np
import optuna
import torch
from scipy.stats import kendalltau

import frugalnas
from frugalnas.ports.cost import count_flops, count_params
from frugalnas.sievo import retrain
from frugalnas.sievo.final import final_choice
from frugalnas.spaces.dag.space import DagSpace
from frugalnas_lab.ground_truth import reference_ceiling


def space_options(args: argparse.Namespace, attention: bool = True) -> dict:
    return {"channels": args.channels, "nodes": args.nodes, "reductions": args.reductions,
            "normal_cells": 1, "attention": attention}


def run_sievo(args: argparse.Namespace, attention: bool = True,
              seed: int | None = None) -> tuple[frugalnas.Study, object, float, float]:
    seed = args.seed if seed is None else seed
    study = frugalnas.create_study(
        space="dag", strategy="si-evolution", estimator="inherited", dataset=args.dataset,
        space_options=space_options(args, attention), seed=seed, disable_plugins=["mlflow"],
        strategy_options={"population_size": args.population, "offspring": args.offspring,
                          "generations": args.generations, "batches_per_generation": args.batches,
                          "batch_size": 64, "warmup_batches": args.warmup},
        estimator_options={"valid_limit": args.valid_limit,
                           "bn_recalibration_batches": args.bn_batches})
    start = time.perf_counter()
    study.optimize(args.population + args.generations * args.offspring)
    winner, extra = study.best_architecture, 0.0
    if args.result == "last-pool":
        proxies = args.final_proxies.split(",") if args.final_proxies else None
        if proxies and len(proxies) == 1:  # one name: a proxy or a preset
            proxies = proxies[0]
        choice = final_choice(study, proxies, args.final_proxy_weight)
        winner, extra = choice.architecture, choice.cost.flops
        if proxies:
            print(f"seed {seed}: si-evolution's result chosen from its last pool of "
                  f"{len(choice.candidates)} by inherited accuracy and {args.final_proxies} "
                  f"(proxy weight {args.final_proxy_weight:g})", flush=True)
    seconds = time.perf_counter() - start
    flops = sum(t.user_attrs["cost"]["flops"] for t in study.completed_trials()) + extra
    return study, winner, seconds, flops


def run_rea(args: argparse.Namespace, seed: int) -> tuple[object, float, float]:
    """Regularized evolution (Real et al., 2019): tournament, mutate, age out the oldest; every
    candidate trained from scratch for ``rea_epochs`` with the ``train`` estimator. With
    ``--tau-cache`` the winner and the measured compute are kept there, so a later run with the
    same settings reuses them instead of searching again (the run says so)."""
    key = (f"rea|{args.dataset}|{seed}|{json.dumps(space_options(args), sort_keys=True)}|"
           f"{args.population}|{args.offspring}|{args.generations}|{args.tournament}|{args.rea_epochs:g}")
    cache = load_cache(args)
    if key in cache:
        best, seconds, flops = cache[key]
        print(f"REA seed {seed}: winner, seconds and FLOPs from {args.tau_cache} (measured earlier)")
        return DagSpace(**space_options(args)).parse(best), seconds, flops
    best, seconds, flops = _search_rea(args, seed)
    if args.tau_cache:
        cache[key] = [str(best), seconds, flops]
        save_cache(args, cache)
    return best, seconds, flops


def si_training_epochs(study: frugalnas.Study) -> float:
    """Epochs of the training split that si-evolution's sampled training used (warm-up and
    every generation), from the trials' ``epochs`` cost."""
    return sum(t.user_attrs["cost"].get("epochs", 0.0) for t in study.completed_trials())


def run_spos(args: argparse.Namespace, seed: int, epochs: int) -> tuple[object, float, float]:
    """Single-path one-shot (Guo et al., ECCV 2020) on the same store layout: the supernet
    trained on uniformly drawn paths for ``epochs``, then regularized evolution over the same
    number of candidates as si-evolution, each scored with inherited weights. Returns the
    winner, seconds and FLOPs (0.0: the supernet estimator does not count them)."""
    study = frugalnas.create_study(
        space="dag", strategy="regularized-evolution", estimator="supernet",
        dataset=args.dataset, space_options=space_options(args), seed=seed,
        disable_plugins=["mlflow"],
        strategy_options={"population_size": args.population, "n_init": args.population,
                          "sample_size": min(args.tournament, args.population)},
        estimator_options={"epochs": epochs, "bn_batches": args.bn_batches})
    start = time.perf_counter()
    study.optimize(args.population + args.generations * args.offspring)
    return study.best_architecture, time.perf_counter() - start, 0.0


def run_darts(args: argparse.Namespace, seed: int) -> tuple[object, float, float]:
    """First-order DARTS (Liu et al., ICLR 2019) on the dag relaxation for ``darts_epochs``."""
    from frugalnas.weight_sharing.darts import darts_search

    study = frugalnas.create_study(space="dag", strategy="random", estimator="train",
                                   dataset=args.dataset, space_options=space_options(args),
                                   seed=seed, disable_plugins=["mlflow"])
    start = time.perf_counter()
    result = darts_search(study.space, study.load_dataset(), study.backend,
                          epochs=args.darts_epochs, seed=seed)
    return result.architecture, time.perf_counter() - start, 0.0


def load_cache(args: argparse.Namespace) -> dict:
    if args.tau_cache and os.path.exists(args.tau_cache):
        with open(args.tau_cache) as f:
            return json.load(f)
    return {}


def save_cache(args: argparse.Namespace, cache: dict) -> None:
    with open(args.tau_cache + ".tmp", "w") as f:
        json.dump(cache, f, indent=0)
    os.replace(args.tau_cache + ".tmp", args.tau_cache)


def _search_rea(args: argparse.Namespace, seed: int) -> tuple[object, float, float]:
    study = frugalnas.create_study(space="dag", strategy="random", estimator="train",
                                   dataset=args.dataset, space_options=space_options(args),
                                   estimator_options={"epochs": args.rea_epochs},
                                   seed=seed, disable_plugins=["mlflow"])
    rng = random.Random(seed)
    population: deque = deque()
    history = []
    start = time.perf_counter()
    flops = 0.0
    for i in range(args.population + args.generations * args.offspring):
        if i < args.population:
            arch = study.space.sample(rng)
        else:
            sample = rng.sample(list(population), min(args.tournament, len(population)))
            arch = study.space.mutate(max(sample, key=lambda p: p[1])[0], rng)
        result = study.evaluate(arch)
        flops += result.cost.flops
        population.append((arch, result.value))
        history.append((arch, result.value))
        if len(population) > args.population:
            population.popleft()
        if (i + 1) % 10 == 0:
            print(f"REA seed {seed}: {i + 1} candidates trained, best "
                  f"{max(v for _, v in history):.2f} %, {time.perf_counter() - start:.0f} s",
                  flush=True)
    seconds = time.perf_counter() - start
    best = max(history, key=lambda p: p[1])[0]
    return best, seconds, flops


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dataset", default="digits", choices=["digits", "mnist5k"])
    p.add_argument("--population", type=int, default=10)
    p.add_argument("--offspring", type=int, default=10)
    p.add_argument("--generations", type=int, default=4)
    p.add_argument("--batches", type=int, default=60, help="sampled-training batches per generation")
    p.add_argument("--warmup", type=int, default=400,
                   help="si-evolution warm-up batches on uniformly drawn candidates")
    p.add_argument("--result", default="best-trial", choices=["best-trial", "last-pool"],
                   help="si-evolution's result: the trial with the best inherited accuracy "
                        "of the whole search (study.best_architecture), or the best of its last "
                        "generation's pool (frugalnas.sievo.final_choice: the population "
                        "re-scored and the offspring, one store state)")
    p.add_argument("--final-proxies", default="",
                   help="with --result last-pool: comma-separated zero-cost proxies (or a "
                        "preset such as 'selected') that join the inherited accuracy in the "
                        "choice; empty: inherited accuracy alone")
    p.add_argument("--final-proxy-weight", type=float, default=0.5,
                   help="weight of the proxies' rank against the inherited accuracy's")
    p.add_argument("--bn-batches", type=int, default=2,
                   help="batch-norm recalibration batches of inherited-weight scoring (0: off)")
    p.add_argument("--rea-epochs", type=float, default=3.0, help="training epochs per REA candidate")
    p.add_argument("--tournament", type=int, default=3)
    p.add_argument("--baselines", default="rea,spos,darts",
                   help="searches the search part sets beside si-evolution: rea (train each), "
                        "spos (supernet trained uniformly for as many epochs as si-evolution's "
                        "sampled training, then regularized evolution on inherited scores), darts "
                        "(first-order DARTS on the dag relaxation for --darts-epochs)")
    p.add_argument("--darts-epochs", type=int, default=1,
                   help="DARTS epochs (one mixed epoch costs about as much as si-evolution's "
                        "whole search at the default sizes)")
    p.add_argument("--retrain-epochs", type=float, default=8.0)
    p.add_argument("--retrain-seeds", type=int, default=2,
                   help="stand-alone trainings of each search's winner, averaged")
    p.add_argument("--search-seeds", type=int, default=3,
                   help="searches per method (seeds seed..seed+k-1) of the search and ablation parts")
    p.add_argument("--tau-candidates", type=int, default=30)
    p.add_argument("--tau-source", default="random", choices=["random", "trials"],
                   help="tau candidates: random ones, or the search's own trials")
    p.add_argument("--tau-epochs", type=float, default=8.0,
                   help="stand-alone training epochs of the tau reference")
    p.add_argument("--tau-seeds", type=int, default=4,
                   help="stand-alone trainings per candidate (seeds seed..seed+k-1), averaged; "
                        "with two or more the reference's own seed-to-seed tau is printed")
    p.add_argument("--jobs", type=int, default=2,
                   help="stand-alone reference trainings run at a time (processes)")
    p.add_argument("--tau-cache", default=None,
                   help="JSON file of stand-alone accuracies (tau reference and retraining) and "
                        "of REA searches (winner, seconds, FLOPs): a run resumes from it, so the "
                        "reference can be computed over several runs and REA runs once per setting")
    p.add_argument("--channels", type=int, default=4)
    p.add_argument("--nodes", type=int, default=3)
    p.add_argument("--reductions", type=int, default=1)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=1, help="torch CPU threads")
    p.add_argument("--valid-limit", type=int, default=200,
                   help="validation examples for inherited-weight scoring (default: 200)")
    p.add_argument("--parts", default="search,tau,ablation",
                   help="comma-separated parts to run: search, tau, ablation; or alone: reference "
                        "(only the stand-alone reference of the random tau candidates), probe "
                        "(tau as a store trains on uniformly drawn candidates, no search)")
    p.add_argument("--probe-stops", default="0,500,1000,2000",
                   help="training batches at which the probe part measures tau")
    args = p.parse_args()
    if args.final_proxies and args.result != "last-pool":
        p.error(f"--final-proxies {args.final_proxies} needs --result last-pool (the proxies "
                f"rank the last pool; --result is {args.result!r})")
    parts = set(args.parts.split(","))
    torch.set_num_threads(args.threads)
    count_flops(torch.nn.Linear(2, 2), torch.zeros(1, 2))  # one-off set-up cost, not search cost
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    n = args.population + args.generations * args.offspring
    print(f"dataset={args.dataset} candidates={n} population={args.population} "
          f"generations={args.generations} batches/gen={args.batches} warmup={args.warmup} "
          f"bn_batches={args.bn_batches} rea_epochs={args.rea_epochs}")

    if parts == {"reference"}:
        print(reliability(reference(args, tau_candidates(args, None))))
        return
    if parts == {"probe"}:
        probe_part(args)
        return
    search_seeds = range(args.seed, args.seed + args.search_seeds)
    runs = {seed: run_sievo(args, seed=seed) for seed in search_seeds}
    if "search" in parts:
        search_part(args, runs)
    if "tau" in parts:
        tau_part(args, runs[args.seed])
    if "ablation" in parts:
        ablation_part(args, runs)


def retrained(args: argparse.Namespace, archs: list) -> list[float]:
    """Accuracy of each architecture trained from scratch for ``retrain_epochs``, averaged over
    ``retrain_seeds`` seeds (cached with the reference)."""
    seeds = range(args.seed, args.seed + args.retrain_seeds)
    per_seed = stand_alone(args, archs, seeds, args.retrain_epochs)
    return list(np.mean(per_seed, axis=0))


BASELINES = {"rea": "REA train-each", "spos": "SPOS + REA", "darts": "DARTS"}


def search_part(args, runs) -> None:
    baselines = [b for b in args.baselines.split(",") if b]
    unknown = [b for b in baselines if b not in BASELINES]
    if unknown:
        raise SystemExit(f"unknown --baselines {unknown}; valid: {', '.join(BASELINES)}")
    rows = []  # (seed, method, architecture, seconds, flops)
    for seed, (si, si_winner, si_s, si_f) in runs.items():
        rows.append((seed, "si-evolution", si_winner, si_s, si_f))
        for b in baselines:
            if b == "rea":
                rows.append((seed, b, *run_rea(args, seed)))
            elif b == "spos":
                epochs = max(1, round(si_training_epochs(si)))
                print(f"SPOS seed {seed}: supernet {epochs} epochs (si-evolution's sampled "
                      f"training: {si_training_epochs(si):.1f})", flush=True)
                rows.append((seed, b, *run_spos(args, seed, epochs)))
            else:
                rows.append((seed, b, *run_darts(args, seed)))
    accs = dict(zip(range(len(rows)), retrained(args, [r[2] for r in rows])))
    print(f"search (retrained {args.retrain_epochs:g} epochs, mean of {args.retrain_seeds} seeds)")
    print(f"{'seed':<6}{'search':<16}{'seconds':>10}{'GFLOPs':>10}{'retrained %':>13}")
    for i, (seed, method, _, secs, flops) in enumerate(rows):
        name = BASELINES.get(method, method)
        gflops = f"{flops / 1e9:>10.2f}" if flops else f"{'-':>10}"
        print(f"{seed:<6}{name:<16}{secs:>10.1f}{gflops}{accs[i]:>13.2f}")
    si_rows = [i for i, r in enumerate(rows) if r[1] == "si-evolution"]
    si_acc = np.array([accs[i] for i in si_rows])
    for b in baselines:
        b_rows = [i for i, r in enumerate(rows) if r[1] == b]
        b_acc = np.array([accs[i] for i in b_rows])
        gaps = si_acc - b_acc
        secs = sum(rows[i][3] for i in b_rows) / sum(rows[i][3] for i in si_rows)
        line = (f"over {len(si_rows)} search seeds, {BASELINES[b]}: compute ratio {b}/si "
                f"{secs:.1f}x seconds")
        if b == "rea":
            flops = sum(rows[i][4] for i in b_rows) / sum(rows[i][4] for i in si_rows)
            line += f", {flops:.1f}x FLOPs"
        print(line + f"; retrained accuracy si {si_acc.mean():.2f} %, {b} {b_acc.mean():.2f} %, "
              f"gap (si - {b}) {gaps.mean():+.2f} points (per seed: "
              + ", ".join(f"{g:+.2f}" for g in gaps) + ")")
    for seed, method, best, *_ in rows:
        if seed == rows[0][0]:
            print(f"seed {seed} {method} best: {best}")


def ablation_part(args, runs) -> None:
    """The same si-evolution budget with the attention decisions on and fixed off."""
    off = {seed: run_sievo(args, attention=False, seed=seed) for seed in runs}
    for name, group in (("on", runs), ("off", off)):
        accs = retrained(args, [r[1] for r in group.values()])
        secs = np.mean([r[2] for r in group.values()])
        flops = np.mean([r[3] for r in group.values()])
        print(f"ablation: attention {name:<4} retrained {np.mean(accs):.2f} % (per seed: "
              + ", ".join(f"{a:.2f}" for a in accs) + f"), search {secs:.1f} s, {flops / 1e9:.2f} GFLOPs")


def tau_candidates(args: argparse.Namespace, si) -> list:
    """The tau candidates: random ones of the space, or the search's own trials."""
    if args.tau_source == "trials":  # the candidates the search scored, latest first
        seen = list(dict.fromkeys(str(t.architecture) for t in reversed(si.completed_trials())))
        return [si.space.parse(a) for a in seen[:args.tau_candidates]]
    space = DagSpace(**space_options(args))
    rng = random.Random(args.seed + 1)
    return [space.sample(rng) for _ in range(args.tau_candidates)]


def _stand_alone(job: tuple) -> float:
    """One stand-alone training (run in a worker process by ``stand_alone``)."""
    opts, dataset, seed, arch, epochs, threads = job
    torch.set_num_threads(threads)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    ref = frugalnas.create_study(space="dag", strategy="random", estimator="train", dataset=dataset,
                                 space_options=opts, seed=seed, disable_plugins=["mlflow"])
    return retrain(ref, arch, epochs=epochs).value


def stand_alone(args: argparse.Namespace, archs: list, seeds, epochs: float) -> list[list[float]]:
    """Validation accuracy of each architecture trained from scratch for ``epochs`` with the
    ``train`` estimator, one list per seed; ``jobs`` trainings at a time, cached in
    ``tau_cache`` as they finish."""
    cache = load_cache(args)

    def key(seed: int, arch) -> str:
        return f"{args.dataset}|{epochs:g}|{seed}|{arch}"

    todo = list(dict.fromkeys((seed, str(a)) for seed in seeds for a in archs
                              if key(seed, a) not in cache))
    if todo:
        print(f"stand-alone training: {len(todo)} runs of {epochs:g} epochs ({args.jobs} at a time)",
              flush=True)
        jobs = [(space_options(args), args.dataset, seed, arch, epochs, args.threads)
                for seed, arch in todo]
        with ProcessPoolExecutor(args.jobs, mp_context=multiprocessing.get_context("spawn")) as pool:
            futures = {pool.submit(_stand_alone, job): job for job in jobs}
            for done, future in enumerate(as_completed(futures), 1):
                _, _, seed, arch, _, _ = futures[future]
                cache[key(seed, arch)] = future.result()
                if args.tau_cache:
                    save_cache(args, cache)
                if done % 10 == 0 or done == len(jobs):
                    print(f"  {done}/{len(jobs)} trained", flush=True)
    return [[cache[key(seed, a)] for a in archs] for seed in seeds]


def reference(args: argparse.Namespace, archs: list) -> list[list[float]]:
    """The tau reference: ``tau_seeds`` stand-alone trainings of ``tau_epochs`` per candidate."""
    return stand_alone(args, archs, range(args.seed, args.seed + args.tau_seeds), args.tau_epochs)


def reliability(per_seed: list[list[float]]) -> str:
    """How far stand-alone training agrees with itself: Kendall tau between seeds, and between
    the means of two halves of the seeds. An estimator cannot be expected to agree with the
    reference better than the reference agrees with itself."""
    pairs = [kendalltau(a, b).statistic for a, b in itertools.combinations(per_seed, 2)]
    if not pairs:
        return "one seed: reference reliability not measured (use --tau-seeds >= 2)"
    text = (f"seed-to-seed tau of the reference: mean {np.mean(pairs):.3f} "
            f"(min {min(pairs):.3f}, max {max(pairs):.3f}, {len(pairs)} pairs)")
    if len(per_seed) >= 3:  # the yardstick: what one stand-alone training achieves
        rest = [kendalltau(per_seed[i], np.mean(per_seed[:i] + per_seed[i + 1:], axis=0)).statistic
                for i in range(len(per_seed))]
        text += (f"; one seed against the mean of the other {len(per_seed) - 1}: mean "
                 f"{np.mean(rest):.3f} (min {min(rest):.3f}, max {max(rest):.3f})")
    if len(per_seed) >= 4:
        half = len(per_seed) // 2
        split = kendalltau(np.mean(per_seed[:half], axis=0), np.mean(per_seed[half:], axis=0)).statistic
        text += f"; split-half tau ({half} vs {len(per_seed) - half} seeds): {split:.3f}"
    noise, spread, perfect, single = reference_ceiling(per_seed)
    text += (f"\n  reference noise: seed-to-seed sd {noise:.2f} points, true spread of the candidates "
             f"(sd) about {spread:.2f}; expected tau against this reference for a perfect estimator "
             f"{perfect:.2f}, for one more stand-alone training {single:.2f}")
    return text


def tau_with_interval(x: list[float], y: list[float], rng: np.random.Generator,
                      resamples: int = 2000) -> tuple[float, float, float]:
    """Kendall tau and a 95 % bootstrap interval over the candidates."""
    x, y = np.asarray(x), np.asarray(y)
    taus = []
    for _ in range(resamples):
        i = rng.integers(0, len(x), len(x))
        t = kendalltau(x[i], y[i]).statistic
        if np.isfinite(t):
            taus.append(t)
    return float(kendalltau(x, y).statistic), float(np.percentile(taus, 2.5)), float(np.percentile(taus, 97.5))


def untrained_store_study(args: argparse.Namespace) -> frugalnas.Study:
    """A study scoring with inherited weights from a fresh store (no search trains it)."""
    return frugalnas.create_study(
        space="dag", strategy="random", estimator="inherited", dataset=args.dataset,
        space_options=space_options(args), seed=args.seed, disable_plugins=["mlflow"],
        estimator_options={"valid_limit": args.valid_limit, "bn_recalibration_batches": args.bn_batches})


def probe_part(args) -> None:
    """How inherited ranking evolves as a store trains on uniformly drawn candidates (the
    warm-up's sampling), without any search: tau of the tau candidates at each of
    ``probe_stops`` training batches, against the same reference."""
    archs = tau_candidates(args, None)
    trained = np.mean(reference(args, archs), axis=0)
    study = untrained_store_study(args)
    context = study.context()
    session = study.estimator.session(context)
    rng = np.random.default_rng(args.seed)
    done = 0
    print(f"store trained on uniformly drawn candidates; tau against the {args.tau_epochs:g}-epoch "
          f"reference (mean of {args.tau_seeds} seeds), {len(archs)} random candidates")
    for i, stop in enumerate(int(b) for b in args.probe_stops.split(",")):
        loss = float("nan")
        if stop > done:
            loss = session.train(lambda r: study.space.sample(r), context.dataset, context.backend,
                                 generation=-(i + 1), batches=stop - done, batch_size=64, lr=0.05,
                                 momentum=0.9, weight_decay=3e-4).mean_loss(last=20)
            done = stop
        inherited = [study.evaluate(a).value for a in archs]
        tau, lo, hi = tau_with_interval(inherited, trained, rng)
        print(f"  {stop:>6} batches  train loss {loss:.3f}  inherited "
              f"{min(inherited):.1f}-{max(inherited):.1f} %  tau {tau:+.3f}  [{lo:+.3f}, {hi:+.3f}]",
              flush=True)


def tau_part(args, run) -> None:
    """Inherited accuracy (final shared store of the si-evolution ``run``) vs stand-alone
    training of the tau candidates, next to two baselines: the same scoring with the untrained
    store, and parameter count."""
    si, _, _, flops = run
    archs = tau_candidates(args, si)
    per_seed = reference(args, archs)
    trained = np.mean(per_seed, axis=0)
    inherited = [si.evaluate(arch).value for arch in archs]
    untrained_study = untrained_store_study(args)
    untrained = [untrained_study.evaluate(arch).value for arch in archs]
    data = si.load_dataset()
    params = [count_params(si.space.build(a, data.num_classes, data.input_shape)) for a in archs]
    rng = np.random.default_rng(args.seed)
    seeds = f"mean of {args.tau_seeds} seeds" if args.tau_seeds > 1 else "one seed"
    print(f"Kendall tau against {args.tau_epochs:g}-epoch stand-alone accuracy ({seeds}), "
          f"{len(archs)} {args.tau_source} candidates, 95 % bootstrap interval:")
    for name, score in (("inherited (search store)", inherited), ("inherited (untrained store)", untrained),
                        ("parameter count", params)):
        tau, lo, hi = tau_with_interval(score, trained, rng)
        print(f"  {name:<28} tau {tau:+.3f}  [{lo:+.3f}, {hi:+.3f}]")
    print("  " + reliability(per_seed))
    print(f"search store: {len(si.completed_trials())} candidates, warm-up {args.warmup} batches, "
          f"{flops / 1e9:.2f} GFLOPs in all")
    print(f"inherited range {min(inherited):.1f}-{max(inherited):.1f} %, stand-alone range "
          f"{min(trained):.1f}-{max(trained):.1f} %")


if __name__ == "__main__":
    main()
