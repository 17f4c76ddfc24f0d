"""Quality of the latency predictors against fresh measurements, on this CPU.

A define-by-run space (the small CNN of examples/own_network by default, or the ResNet-like
family) at MNIST's 28x28, or the ``gpt`` space's language models (its default choices) on the
prefill of ``--sequence-length`` byte tokens; ONNX Runtime, batch 1, 1 thread. Each predictor (the fused-kernel
table and the per-layer table) is calibrated on ``--calibration`` random architectures, then
``--held-out`` other architectures (a different seed) are predicted, and measured twice, in
two separate runs of ``--rounds`` interleaved rounds each (fresh networks and runtime sessions
the second time). Prints, side by side, the share of predictions within +-10 % of the first
run's measured median, Kendall's tau and the mean relative error, and the same figures for
the second run against the first: the measurement's own repeatability, the ceiling for any
predictor. A one-round measurement repeated (``measured-latency``'s default) shows what the
rounds buy. Also the time per prediction and per measurement.

    python benchmarks/latency_predictor.py [--space small_cnn|resnet_family|gpt] [--held-out 100]
        [--rounds 5] [--calibration 20] [--sequence-length 128]

A language model has no layer table (it knows convolutional layers only): for ``gpt`` the
kernel table (attention, MLP, norm, embedding and output kernels) runs alone.
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "own_network"))

from frugalnas.latency.cache import LatencyCache  # noqa: E402
from frugalnas.latency.measure import LatencySetup  # noqa: E402
from frugalnas.latency.predictor import (KernelTablePredictor, LatencyMeter,  # noqa: E402
                                         LayerTablePredictor, prediction_quality)
from frugalnas.spaces import define  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", choices=["small_cnn", "resnet_family", "gpt"],
                        default="small_cnn")
    parser.add_argument("--sequence-length", type=int, default=128,
                        help="prefill tokens of a gpt network")
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--calibration", type=int, default=20)
    parser.add_argument("--runtime", choices=["onnxruntime", "torch"], default="onnxruntime")
    parser.add_argument("--repeats", type=int, default=50)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    tokens = args.space == "gpt"
    if tokens:
        from frugalnas.spaces.gpt.space import GPTSpace

        space: Any = GPTSpace(context=args.sequence_length)
        shape, classes = (args.sequence_length,), 256
    else:
        module = __import__(args.space)
        space = define(getattr(module, args.space))()
        shape, classes = (1, 28, 28), 10
    setup = LatencySetup(runtime=args.runtime, batch_size=1, threads=1, warmup=10,
                         repeats=args.repeats, rounds=args.rounds)
    rows: list[tuple[str, dict[str, float]]] = []
    with tempfile.TemporaryDirectory() as tmp:
        meter = LatencyMeter(setup, LatencyCache(Path(tmp) / "latency.sqlite"))
        predictors: dict[str, Any] = {"kernel table": KernelTablePredictor(
            space, meter, classes, shape, calibration=args.calibration, tokens=tokens)}
        if not tokens:
            predictors["layer table"] = LayerTablePredictor(space, meter, classes, shape,
                                                            calibration=args.calibration)
        calibration = {a.key for a in predictors["kernel table"].calibration_set()}
        rng, held = random.Random("held-out"), {}
        while len(held) < args.held_out:
            a = space.sample(rng)
            if a.key not in calibration:
                held.setdefault(a.key, a)
        archs = list(held.values())
        fits, predicted, seconds = {}, {}, {}
        for name, predictor in predictors.items():
            start = time.perf_counter()
            fits[name] = predictor.fit()
            seconds[name + " fit"] = time.perf_counter() - start
            start = time.perf_counter()
            if isinstance(predictor, KernelTablePredictor):
                predictor.prepare(archs)  # the new kernels measured together
            predicted[name] = [predictor.predict(a) for a in archs]
            seconds[name + " first"] = time.perf_counter() - start
            start = time.perf_counter()
            again = [predictor.predict(a) for a in archs]  # every layer in the table now
            seconds[name + " table"] = time.perf_counter() - start
            assert again == predicted[name]
        start = time.perf_counter()
        first = [m.median_ms for m, _ in meter.networks(space, archs, classes, shape, tokens)]
        measure_s = time.perf_counter() - start
        second = [m.median_ms for m, _ in LatencyMeter(setup).networks(space, archs, classes,
                                                                        shape, tokens)]
        one = LatencySetup(runtime=args.runtime, batch_size=1, threads=1, warmup=10,
                           repeats=args.repeats)
        single = [[m.median_ms for m, _ in LatencyMeter(one).networks(space, archs, classes,
                                                                        shape, tokens)]
                  for _ in range(2)]
    for name in predictors:
        rows.append((f"{name} vs run 1", prediction_quality(predicted[name], first)))
        rows.append((f"{name} vs run 2", prediction_quality(predicted[name], second)))
    rows.append(("run 2 vs run 1 (ceiling)", prediction_quality(second, first)))
    rows.append(("one round, twice", prediction_quality(single[1], single[0])))
    kernel_fit = fits["kernel table"]
    print(f"space {args.space}, {args.runtime}, batch 1, 1 thread, input {shape}; "
          f"{args.rounds} rounds of {args.repeats} calls; calibration {args.calibration} "
          f"networks")
    layers = ""
    if "layer table" in fits:
        layer_fit = fits["layer table"]
        layers = (f"; layer table: intercept {layer_fit.intercept:.4f} ms, slopes "
                  f"{', '.join(f'{k} {v:.2f}' for k, v in layer_fit.slopes.items())} (fit "
                  f"{seconds['layer table fit']:.1f} s)")
    print(f"kernel table: per-call overhead {kernel_fit.overhead:.4f} ms, intercept "
          f"{kernel_fit.intercept:.4f} ms, slope {kernel_fit.slope:.3f} (fit "
          f"{seconds['kernel table fit']:.1f} s){layers}")
    print(f"held-out networks: {len(archs)}; measured median latency "
          f"{min(first):.3f}-{max(first):.3f} ms")
    print(f"{'':28s} {'within +-10 %':>14s} {'Kendall tau':>12s} {'mean |rel. error|':>18s}")
    for label, q in rows:
        print(f"{label:28s} {q['within'] * 100:13.0f}% {q['kendall_tau']:12.3f} "
              f"{q['mean_abs_rel_error'] * 100:17.1f}%")
    for name in predictors:
        print(f"{name}: per prediction {seconds[name + ' first'] / len(archs) * 1e3:.1f} ms "
              f"(first, new entries measured), {seconds[name + ' table'] / len(archs) * 1e3:.1f}"
              f" ms (table only)")
    print(f"per measurement ({args.rounds} rounds, interleaved): "
          f"{measure_s / len(archs) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
