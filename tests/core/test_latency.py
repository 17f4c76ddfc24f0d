"""Latency measured on the machine at hand: measure_latency and the estimators' option."""

import json

import pytest
import torch
from torch import nn

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.latency import LATENCY_METRICS, LatencyStats, measure_latency

TINY = {"N": 1, "C": 4}
FAST = {"latency_min_run_time": 0.01}


def _net() -> nn.Module:
    return nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU(),
                         nn.AdaptiveAvgPool2d(1), nn.Flatten(), nn.Linear(4, 2))


def test_measure_latency_reports_median_and_spread():
    net = _net().train()
    calls = []
    net.register_forward_hook(lambda m, i, o: calls.append((i[0].shape, torch.is_grad_enabled(),
                                                            m.training)))
    before = [t.clone() for t in net.state_dict().values()]
    stats = measure_latency(net, (3, 8, 8), batch_size=3, warmup=2, min_run_time=0.01,
                            min_blocks=7)
    assert isinstance(stats, LatencyStats)
    assert stats.median_ms > 0 and stats.iqr_ms >= 0 and stats.min_ms <= stats.median_ms
    assert stats.blocks >= 7 and stats.calls_per_block >= 1
    assert (stats.batch_size, stats.device) == (3, "cpu")
    assert stats.num_threads == torch.get_num_threads()
    assert stats.metrics() == {"latency_ms": stats.median_ms, "latency_ms_iqr": stats.iqr_ms}
    # warm-up plus the timed calls; inference only: eval mode, no autograd
    assert len(calls) >= 2 + 7
    assert {c[0] for c in calls} == {torch.Size([3, 3, 8, 8])}
    assert not any(c[1] or c[2] for c in calls)
    assert net.training  # mode restored, batch-norm statistics untouched
    assert all(torch.equal(a, b) for a, b in zip(before, net.state_dict().values()))
    assert json.loads(json.dumps(stats.to_dict()))["blocks"] == stats.blocks


@pytest.mark.skipif(not torch.cuda.is_available(), reason="no CUDA device")
def test_measure_latency_on_cuda():
    net = _net().cuda()
    stats = measure_latency(net, (3, 32, 32), batch_size=8, min_run_time=0.05)
    assert stats.device.startswith("cuda") and stats.median_ms > 0


@pytest.mark.parametrize("bad, match", [
    ({"latency": "yes"}, "invalid latency 'yes'"),
    ({"latency": True, "latency_batch_size": 0}, "invalid latency_batch_size 0"),
    ({"latency": True, "latency_min_run_time": -1}, "invalid latency_min_run_time -1"),
])
def test_bad_latency_options_are_refused_before_the_study(bad, match):
    with pytest.raises(ConfigError, match=match):
        frugalnas.create_study(space_options=TINY, estimator="train", estimator_options=bad,
                               disable_plugins=["mlflow"])


def test_latency_metrics_are_declared_only_when_enabled():
    with pytest.raises(ConfigError, match="objective 'latency_ms' is not a metric"):
        frugalnas.create_study(space_options=TINY, estimator="train", objectives=["latency_ms"],
                               directions=["minimize"], disable_plugins=["mlflow"])
    host = frugalnas.create_study(disable_plugins=["mlflow"]).host
    for name, options in [("train", {}), ("synflow", {}), ("rank-ensemble", {})]:
        off = host.create_estimator(name, options)
        on = host.create_estimator(name, {**options, "latency": True})
        assert not set(LATENCY_METRICS) & set(off.provides)
        assert set(on.provides) == set(off.provides) | set(LATENCY_METRICS)


def test_train_estimator_measures_the_trained_network():
    study = frugalnas.create_study(
        space_options=TINY, estimator="train", dataset="digits", seed=0,
        estimator_options={"epochs": 0.1, "max_steps": 2, "latency": True,
                           "latency_batch_size": 2, **FAST},
        objectives=["value", "latency_ms"], directions=["maximize", "minimize"],
        disable_plugins=["mlflow"])
    study.optimize(1)
    for trial in study.trials:
        metrics = trial.user_attrs["metrics"]
        assert metrics["latency_ms"] > 0 and metrics["latency_ms_iqr"] >= 0
        assert trial.values[1] == metrics["latency_ms"]


@pytest.mark.parametrize("estimator, options", [
    ("synflow", {"data": "gaussian", "input_shape": (3, 8, 8)}),
    ("rank-ensemble", {"proxies": ["synflow", "params"], "data": "gaussian",
                       "input_shape": (3, 8, 8)}),
])
def test_proxy_estimators_add_latency(estimator, options):
    study = frugalnas.create_study(
        space_options=TINY, estimator=estimator, dataset=None, seed=0,
        estimator_options={**options, "latency": True, **FAST},
        objectives=["value", "latency_ms"], directions=["maximize", "minimize"],
        disable_plugins=["mlflow"])
    study.optimize(1)
    for trial in study.trials:
        metrics = trial.user_attrs["metrics"]
        assert metrics["latency_ms"] > 0 and "latency_ms_iqr" in metrics
        assert any(k.startswith("proxy_") for k in metrics)
