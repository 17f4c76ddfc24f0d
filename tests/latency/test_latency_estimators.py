"""Latency on this machine: ONNX Runtime and torch measurements, the on-disk cache, the
per-layer predictor, and both estimators in studies over a user's own network."""

import random

import pytest
from torch import nn

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.latency.cache import LatencyCache
from frugalnas.latency.measure import LatencySetup, measure
from frugalnas.latency.predictor import (LatencyMeter, LayerTablePredictor, leaf_layers,
                                         prediction_quality)
from frugalnas.spaces import define

FAST = dict(warmup=2, repeats=5)


def tiny_cnn(trial):
    width = trial.suggest_categorical("width", [4, 16])
    layers = [nn.Conv2d(trial.in_channels, width, 3, padding=1), nn.ReLU()]
    if trial.suggest_int("depth", 1, 2) == 2:
        layers += [nn.Conv2d(width, width, trial.suggest_categorical("kernel", [3, 5]),
                             padding="same"), nn.ReLU()]
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(width, trial.num_classes))


@pytest.fixture(scope="module")
def space():
    return define(tiny_cnn)(discovery=20)


@pytest.mark.parametrize("runtime", ["onnxruntime", "torch"])
def test_measure_reports_median_spread_and_setup(space, runtime):
    arch = space.parse("tiny_cnn:width=4,depth=1")
    model = space.build(arch, 3, (1, 8, 8))
    model.train()
    got = measure(model, (1, 8, 8), LatencySetup(runtime=runtime, batch_size=2, **FAST))
    assert got.min_ms <= got.median_ms and got.median_ms > 0 and got.iqr_ms >= 0
    assert (got.runtime, got.batch_size, got.threads, got.repeats) == (runtime, 2, 1, 5)
    assert model.training  # the mode is restored


def test_bad_setup_is_refused_naming_the_value():
    with pytest.raises(ConfigError, match="runtime 'tensorrt'.*onnxruntime"):
        LatencySetup(runtime="tensorrt")
    with pytest.raises(ConfigError, match="repeats"):
        LatencySetup(repeats=1)


def test_the_cache_answers_a_second_time_and_separates_setups(space, tmp_path):
    arch = space.parse("tiny_cnn:width=16,depth=2,kernel=5")
    cache = LatencyCache(tmp_path / "latency.sqlite")
    first, hit = LatencyMeter(LatencySetup(**FAST), cache).network(space, arch, 3, (1, 8, 8))
    assert not hit and len(cache) == 1
    # a new meter (another process, a reopened study) reads the file
    again, hit = LatencyMeter(LatencySetup(**FAST), cache).network(space, arch, 3, (1, 8, 8))
    assert hit and again == first
    other, hit = LatencyMeter(LatencySetup(threads=2, **FAST), cache).network(
        space, arch, 3, (1, 8, 8))
    assert not hit and len(cache) == 2


def test_leaf_layers_follow_the_forward_pass(space):
    model = space.build(space.parse("tiny_cnn:width=4,depth=2,kernel=3"), 3, (1, 8, 8))
    names = [type(m).__name__ for _, m, _ in leaf_layers(model, (1, 8, 8))]
    assert names == ["Conv2d", "ReLU", "Conv2d", "ReLU", "AdaptiveAvgPool2d", "Flatten",
                     "Linear"]


def test_predictor_ranks_networks_like_measurements(space, tmp_path):
    meter = LatencyMeter(LatencySetup(runtime="onnxruntime", warmup=5, repeats=30),
                         LatencyCache(tmp_path / "c.sqlite"))
    predictor = LayerTablePredictor(space, meter, 3, (3, 32, 32), calibration=4)
    archs = list(space.enumerate())
    predicted = [predictor.predict(a) for a in archs]
    measured = [meter.network(space, a, 3, (3, 32, 32))[0].median_ms for a in archs]
    quality = prediction_quality(predicted, measured)
    assert set(quality) == {"within", "kendall_tau", "mean_abs_rel_error"}
    # the widest, deepest network is predicted slowest than the narrowest, shallowest
    slow = archs.index(space.parse("tiny_cnn:width=16,depth=2,kernel=5"))
    fast = archs.index(space.parse("tiny_cnn:width=4,depth=1"))
    assert predicted[slow] > predicted[fast]


def test_measured_latency_is_an_objective_for_any_space(tmp_path):
    study = frugalnas.create_study(
        space=tiny_cnn, estimator="measured-latency", direction="minimize",
        estimator_options={"input_shape": [1, 8, 8], "cache": str(tmp_path / "c.sqlite"),
                           **FAST}, disable_plugins=["mlflow"], seed=0)
    study.optimize(n_trials=4)
    done = study.trials
    assert all(t.value > 0 for t in done)
    metrics = done[0].user_attrs["metrics"]
    assert {"latency_ms", "latency_ms_iqr", "latency_ms_min"} <= set(metrics)
    assert metrics["latency_ms"] == done[0].value
    with pytest.raises(ConfigError, match="input_shape"):
        frugalnas.create_study(space=tiny_cnn, estimator="measured-latency",
                               estimator_options={"input_shape": [8, 8]},
                               disable_plugins=["mlflow"])


def test_predicted_latency_is_known_before_evaluation(space, tmp_path):
    from frugalnas.latency.estimators import PredictedLatency

    est = PredictedLatency(input_shape=[1, 8, 8], calibration=3, cache=str(tmp_path / "c"),
                           **FAST)
    arch = space.sample(random.Random(0))
    known = est.known_metrics(arch, space)["latency_ms"]
    from frugalnas.ports.estimator import TrialContext
    from frugalnas.backends.single_device import SingleDeviceBackend

    result = est.evaluate(arch, TrialContext(space=space, backend=SingleDeviceBackend()))
    assert result.metrics["latency_ms"] == known == result.value


def test_combined_estimator_trains_and_predicts_latency_as_a_constraint(tmp_path):
    options = {"input_shape": [1, 8, 8], "num_classes": 10, "calibration": 3,
               "cache": str(tmp_path / "c.sqlite"), **FAST}
    study = frugalnas.create_study(
        space=tiny_cnn, estimator="combined", dataset="digits", strategy="random",
        estimator_options={"members": {"params": {}, "latency-predictor": options}},
        constraints={"latency_ms": 1e6}, disable_plugins=["mlflow"], seed=0)
    study.optimize(n_trials=3)
    from frugalnas.latency.estimators import PredictedLatency

    again = PredictedLatency(**options)
    for t in study.trials:
        metrics = t.user_attrs["metrics"]
        # the cached measurements make the prediction the same in a new estimator
        assert metrics["latency_ms"] == again.known_metrics(t.architecture, study.space)[
            "latency_ms"]
        assert t.value > 0
    with pytest.raises(ConfigError, match="both produce the metric 'latency_ms'"):
        frugalnas.create_study(space=tiny_cnn, estimator="combined", estimator_options={
            "members": {"measured-latency": {}, "latency-predictor": {}}},
            disable_plugins=["mlflow"])
