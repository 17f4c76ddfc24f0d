"""The fused-kernel latency table: kernels found from a network's data flow, measurements in
interleaved rounds, and the kernel predictor against real ONNX Runtime measurements."""

import pytest
import torch
from torch import nn

from frugalnas.ports.errors import ConfigError
from frugalnas.latency.cache import LatencyCache
from frugalnas.latency.estimators import PredictedLatency
from frugalnas.latency.kernels import network_kernels
from frugalnas.latency.measure import LatencySetup, measure_many
from frugalnas.latency.predictor import (KernelTablePredictor, LatencyMeter, LayerTablePredictor,
                                         prediction_quality)
from frugalnas.spaces import define


class Residual(nn.Module):
    def __init__(self, channels: int):
        super().__init__()
        self.body = nn.Sequential(nn.Conv2d(channels, channels, 3, padding=1, bias=False),
                                  nn.BatchNorm2d(channels))
        self.relu = nn.ReLU()

    def forward(self, x):
        return self.relu(x + self.body(x))


def chain(trial):
    width = trial.suggest_categorical("width", [4, 24])
    layers = [nn.Conv2d(trial.in_channels, width, 3, padding=1), nn.BatchNorm2d(width),
              nn.ReLU()]
    for _ in range(trial.suggest_int("blocks", 0, 2)):
        layers.append(Residual(width))
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, trial.num_classes))


@pytest.fixture(scope="module")
def space():
    return define(chain)(discovery=20)


def test_batch_norm_and_activation_join_the_convolution_they_follow(space):
    model = space.build(space.parse("chain:width=4,blocks=1"), 3, (1, 8, 8))
    kernels = network_kernels(model, (1, 8, 8))
    # the ReLU after the residual sum takes the sum, not the batch norm's output: its own
    # kernel
    assert [k.kind for k in kernels] == ["Conv2d+BatchNorm2d+ReLU", "Conv2d+BatchNorm2d",
                                         "ReLU", "AdaptiveAvgPool2d", "Flatten", "Linear"]
    first = kernels[0]
    assert first.input_shape == (1, 8, 8) and first.output_shape == (4, 8, 8)
    assert "Conv2d(1, 4" in first.signature and first.signature.endswith("@(1, 8, 8)")
    # another configuration, another table entry
    other = network_kernels(space.build(space.parse("chain:width=24,blocks=1"), 3, (1, 8, 8)),
                            (1, 8, 8))
    assert other[0].kind == first.kind and other[0].signature != first.signature


def test_a_kernel_alone_computes_what_its_layers_compute(space):
    model = space.build(space.parse("chain:width=24,blocks=0"), 3, (1, 8, 8)).eval()
    kernel = network_kernels(model, (1, 8, 8))[0]
    x = torch.randn(2, 1, 8, 8)
    with torch.no_grad():
        assert torch.allclose(kernel.module().eval()(x), model[2](model[1](model[0](x))))
    assert model[0] is kernel.modules[0]  # the network's own layers, copied only to measure


def test_a_fused_kernel_costs_less_than_its_layers_measured_alone(space, tmp_path):
    """ONNX Runtime runs the convolution, its batch norm and ReLU as one operator: measured as
    one kernel they cost less than the three layers measured one by one (three calls)."""
    model = space.build(space.parse("chain:width=24,blocks=0"), 3, (1, 16, 16))
    kernel = network_kernels(model, (1, 16, 16))[0]
    meter = LatencyMeter(LatencySetup(warmup=5, repeats=30, rounds=3))
    fused = meter.kernels([kernel])[0]
    alone = [meter.layer(sig, m, (1, 16, 16) if i == 0 else (24, 16, 16))
             for i, (sig, m) in enumerate(zip(kernel.signatures, kernel.modules))]
    assert fused < sum(alone)


@pytest.mark.parametrize("runtime", ["onnxruntime", "torch"])
def test_interleaved_rounds_measure_each_network_and_restore_modes(runtime):
    small, large = nn.Conv2d(1, 4, 3), nn.Sequential(nn.Conv2d(1, 64, 5), nn.BatchNorm2d(64))
    small.train()
    setup = LatencySetup(runtime=runtime, warmup=2, repeats=10, rounds=3)
    got = measure_many([(small, (1, 16, 16)), (large, (1, 16, 16))], setup)
    assert [m.rounds for m in got] == [3, 3]
    assert all(m.min_ms <= m.median_ms for m in got)
    assert got[1].median_ms > got[0].median_ms  # 64 5x5 filters cost more than 4 3x3
    assert small.training and large.training  # modes as they were


def test_rounds_are_part_of_the_cache_key_except_one_round(tmp_path):
    assert "rounds" not in LatencySetup().identity()
    assert LatencySetup(rounds=3).identity()["rounds"] == 3
    with pytest.raises(ConfigError, match="rounds"):
        LatencySetup(rounds=0)
    cache = LatencyCache(tmp_path / "c.sqlite")
    probe = LatencyMeter.probe_item()
    for rounds in (1, 2, 2):
        LatencyMeter(LatencySetup(warmup=1, repeats=3, rounds=rounds), cache).cached_many([probe])
    assert len(cache) == 2


def test_kernel_table_predicts_measured_latency(space, tmp_path):
    """Calibrated on 3 networks, the kernel table predicts the other networks of the space
    (real ONNX Runtime measurements at 32x32) within 25 % and ranks the extremes right."""
    setup = LatencySetup(warmup=5, repeats=30, rounds=3)
    cache = LatencyCache(tmp_path / "c.sqlite")
    meter = LatencyMeter(setup, cache)
    predictor = KernelTablePredictor(space, meter, 10, (3, 32, 32), calibration=3)
    fit = predictor.fit()
    assert 0 < fit.overhead < 0.2 and fit.slope > 0
    archs = list(space.enumerate())
    predictor.prepare(archs)
    entries = len(cache)
    predicted = [predictor.predict(a) for a in archs]
    assert len(cache) == entries  # prepared: no measurement while predicting
    measured = [m.median_ms for m, _ in meter.networks(space, archs, 10, (3, 32, 32))]
    quality = prediction_quality(predicted, measured)
    assert quality["mean_abs_rel_error"] < 0.25
    slow = archs.index(space.parse("chain:width=24,blocks=2"))
    fast = archs.index(space.parse("chain:width=4,blocks=0"))
    assert predicted[slow] > 2 * predicted[fast]
    # a new estimator on the same cache file reads the table and predicts the same
    again = PredictedLatency(input_shape=[3, 32, 32], calibration=3,
                             cache=str(tmp_path / "c.sqlite"), warmup=5, repeats=30, rounds=3)
    assert again.known_metrics(archs[slow], space)["latency_ms"] == pytest.approx(
        predicted[slow])


def test_the_estimator_chooses_the_table_and_refuses_unknown_ones(space, tmp_path):
    options = dict(input_shape=[1, 8, 8], cache=str(tmp_path / "c.sqlite"))
    assert isinstance(PredictedLatency(**options).predictor(space), KernelTablePredictor)
    assert isinstance(PredictedLatency(table="layers", **options).predictor(space),
                      LayerTablePredictor)
    with pytest.raises(ConfigError, match="table 'ops'.*'kernels', 'layers'"):
        PredictedLatency(table="ops", **options)
    with pytest.raises(ConfigError, match="rounds"):
        PredictedLatency(rounds=0, **options)
