"""Quality of the per-layer latency predictor against fresh measurements, on this CPU.

A define-by-run space (the small CNN of examples/own_network by default, or the ResNet-like
family) at MNIST's 28x28, ONNX Runtime, batch 1, 1 thread: the predictor is calibrated on
``--calibration`` random architectures, then ``--held-out`` other architectures (a different
seed) are predicted and measured. Prints the share of predictions within +-10 % of the
measured median, Kendall's tau, the mean relative error, and the time per prediction and per
measurement.

    python benchmarks/latency_predictor.py [--space small_cnn|resnet_family] [--held-out 100]
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "examples" / "own_network"))

from frugalnas.latency.cache import LatencyCache  # noqa: E402
from frugalnas.latency.measure import LatencySetup  # noqa: E402
from frugalnas.latency.predictor import (LatencyMeter, LayerTablePredictor,  # noqa: E402
                                         prediction_quality)
from frugalnas.spaces import define  # noqa: E402


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--space", choices=["small_cnn", "resnet_family"], default="small_cnn")
    parser.add_argument("--held-out", type=int, default=100)
    parser.add_argument("--calibration", type=int, default=20)
    parser.add_argument("--runtime", choices=["onnxruntime", "torch"], default="onnxruntime")
    parser.add_argument("--repeats", type=int, default=50)
    args = parser.parse_args()
    module = __import__(args.space)
    space = define(getattr(module, args.space))()
    shape = (1, 28, 28)
    setup = LatencySetup(runtime=args.runtime, batch_size=1, threads=1, warmup=10,
                         repeats=args.repeats)
    with tempfile.TemporaryDirectory() as tmp:
        meter = LatencyMeter(setup, LatencyCache(Path(tmp) / "latency.sqlite"))
        predictor = LayerTablePredictor(space, meter, 10, shape, calibration=args.calibration)
        start = time.perf_counter()
        fit = predictor.fit()
        fit_s = time.perf_counter() - start
        calibration = {a.key for a in predictor.calibration_set()}
        rng, held = random.Random("held-out"), {}
        while len(held) < args.held_out:
            a = space.sample(rng)
            if a.key not in calibration:
                held.setdefault(a.key, a)
        archs = list(held.values())
        start = time.perf_counter()
        predicted = [predictor.predict(a) for a in archs]
        predict_s = time.perf_counter() - start
        start = time.perf_counter()
        again = [predictor.predict(a) for a in archs]  # every layer in the table now
        table_s = time.perf_counter() - start
        assert again == predicted
        start = time.perf_counter()
        measured = [meter.network(space, a, 10, shape)[0].median_ms for a in archs]
        measure_s = time.perf_counter() - start
    q = prediction_quality(predicted, measured)
    print(f"space {args.space}, {args.runtime}, batch 1, 1 thread, input {shape}; "
          f"calibration {args.calibration} networks ({fit_s:.1f} s; intercept "
          f"{fit.intercept:.4f} ms, slopes "
          f"{', '.join(f'{k} {v:.2f}' for k, v in fit.slopes.items())})")
    print(f"held-out networks: {len(archs)}; measured median latency "
          f"{min(measured):.3f}-{max(measured):.3f} ms")
    print(f"within +-10 %: {q['within'] * 100:.0f} %   Kendall tau: {q['kendall_tau']:.3f}   "
          f"mean |relative error|: {q['mean_abs_rel_error'] * 100:.1f} %")
    print(f"per prediction: {predict_s / len(archs) * 1e3:.1f} ms (first, new layers measured), "
          f"{table_s / len(archs) * 1e3:.1f} ms (table only); per measurement: "
          f"{measure_s / len(archs) * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
