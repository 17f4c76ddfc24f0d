"""Surrogate quality on NAS-Bench-201 CIFAR-10: Kendall tau vs training-set size.

For each seed, draws a random training pool and a disjoint random test set of NB201 cells,
fits every surrogate on each encoding with the first n training cells, and prints the mean
Kendall tau (and Spearman rho) of its predicted means against the table's test accuracy.
The ``proxy`` encoding scores cells built with ``N=1, C=8`` at 16x16 input (the registered
data-free proxies, or params/FLOPs when none are registered) to keep it fast.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

SURROGATES = ("lightgbm", "random-forest", "gp", "mlp-ensemble")
ENCODINGS = ("adjacency", "path")


def main() -> None:
    import torch

    import frugalnas
    from frugalnas.spaces.nb201.table import nb201_table
    from frugalnas.spaces.nb201.space import NB201Space
    from frugalnas.surrogates import make_encoding, rank_quality

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", default="20,50,100,200,500")
    parser.add_argument("--seeds", type=int, default=3)
    parser.add_argument("--test", type=int, default=500, help="held-out cells per seed")
    parser.add_argument("--surrogates", default=",".join(SURROGATES))
    parser.add_argument("--encodings", default=",".join(ENCODINGS),
                        help="comma-separated from onehot, adjacency, path, proxy")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = [int(s) for s in args.sizes.split(",")]
    names, encs = args.surrogates.split(","), args.encodings.split(",")
    space, table = NB201Space(), nb201_table()[:, 0]
    encoders = {e: make_encoding(e, space) if e != "proxy" else make_encoding(
        e, NB201Space(N=1, C=8), input_shape=(3, 16, 16)) for e in encs}
    taus: dict[tuple[str, str, int], list[float]] = {}
    rhos: dict[tuple[str, str, int], list[float]] = {}
    secs: dict[str, float] = {n: 0.0 for n in names}
    for seed in range(args.seeds):
        order = np.random.default_rng(seed).permutation(len(space))
        train_idx, test_idx = order[:max(sizes)], order[max(sizes):max(sizes) + args.test]
        archs = [space.from_index(int(i)) for i in np.concatenate([train_idx, test_idx])]
        y_train, y_test = table[train_idx], table[test_idx]
        for enc, encoder in encoders.items():
            X = encoder.encode(archs)
            X_train, X_test = X[:len(train_idx)], X[len(train_idx):]
            for name in names:
                for n in sizes:
                    start = time.perf_counter()
                    model = frugalnas.create_component("surrogates", name, seed=seed)
                    mean, _ = model.fit(X_train[:n], y_train[:n]).predict(X_test)
                    secs[name] += time.perf_counter() - start
                    q = rank_quality(y_test, mean)
                    taus.setdefault((name, enc, n), []).append(q["kendall_tau"])
                    rhos.setdefault((name, enc, n), []).append(q["spearman"])
    print(f"Kendall tau (Spearman) on {args.test} held-out NB201 cells, CIFAR-10 test "
          f"accuracy, mean of {args.seeds} seeds")
    print(f"{'surrogate':14s}{'encoding':11s}" + "".join(f"{'n=' + str(n):>14s}" for n in sizes)
          + f"{'fit s':>8s}")
    for name in names:
        for enc in encs:
            cells = "".join(f"{np.mean(taus[name, enc, n]):7.3f} ({np.mean(rhos[name, enc, n]):.2f})"
                            for n in sizes)
            fit_s = secs[name] / (args.seeds * len(sizes) * len(encs))
            print(f"{name:14s}{enc:11s}{cells}{fit_s:8.2f}")


if __name__ == "__main__":
    main()
