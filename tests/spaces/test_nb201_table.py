"""The NAS-Bench-201 table: validation protocol, device latencies, network size."""

import dataclasses
import random
import tomllib
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

import frugalnas
from frugalnas.ports.config import StudyConfig
from frugalnas.ports.cost import count_flops, count_params
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.estimator import TrialContext
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.spaces.nb201.table import (
    LATENCY_DEVICES,
    TABLE_DATASETS,
    NB201TableEstimator,
    nb201_data,
    nb201_table,
)

ROOT = Path(__file__).resolve().parents[2]
SHARED = ROOT.parent / "shared" / "data"
VALID_CSV = SHARED / "nb201_cifar10_valid.csv"
LATENCY_CSV = SHARED / "nb201_latency_ms.csv"
#: dataset -> (classes, input shape) of the benchmark's network for it
NETWORKS = {"cifar10": (10, (3, 32, 32)), "cifar100": (100, (3, 32, 32)),
            "imagenet16-120": (120, (3, 16, 16))}


def _evaluate(arch, **options):
    context = TrialContext(space=NB201Space(), backend=None)
    return NB201TableEstimator(**options).evaluate(arch, context)


def test_params_and_flops_are_those_of_the_benchmark_network():
    space = NB201Space(N=5, C=16)
    data = nb201_data()
    rng = random.Random(3)
    cells = [rng.randrange(len(space)) for _ in range(3)]
    cells.append(space.index(space.parse(
        "|nor_conv_3x3~0|+|nor_conv_3x3~0|nor_conv_3x3~1|+|nor_conv_3x3~0|nor_conv_3x3~1|"
        "nor_conv_3x3~2|")))
    for index in cells:
        arch = space.from_index(index)
        for d, dataset in enumerate(TABLE_DATASETS):
            if dataset != "cifar10" and index != cells[0]:
                continue  # one cell is enough for the other two networks
            classes, shape = NETWORKS[dataset]
            net = space.build(arch, classes, shape)
            assert data.params[index, d] == count_params(net)
            assert data.flops[index, d] == count_flops(net, torch.zeros(1, *shape))
        result = _evaluate(arch)
        assert result.cost.params == data.params[index, 0] > 0
        assert result.cost.flops == data.flops[index, 0] > 0
    # the benchmark's own figures for its largest cell: 1.53 M parameters, 220 M multiply-adds
    assert data.params[cells[-1], 0] == 1_531_546
    assert data.flops[cells[-1], 0] / 2 == pytest.approx(220.1e6, rel=1e-3)


def test_value_is_cifar10_validation_accuracy_by_default():
    space, data = NB201Space(), nb201_data()
    for index in random.Random(0).sample(range(len(space)), 20):
        arch = space.from_index(index)
        result = _evaluate(arch)
        assert result.value == pytest.approx(float(data.valid_accuracy_cifar10[index]))
        assert result.metrics["valid_accuracy_cifar10"] == result.value
        assert result.metrics["test_accuracy_cifar10"] == pytest.approx(
            float(nb201_table()[index, 0]))
        assert _evaluate(arch, select_on="test").value == result.metrics["test_accuracy_cifar10"]
        hundred = _evaluate(arch, dataset="cifar100", select_on="test")
        assert hundred.value == result.metrics["test_accuracy_cifar100"]
        assert hundred.cost.params == data.params[index, 1]
    # validation is not test: the best cell by validation is another cell than by test
    assert not np.array_equal(np.argsort(data.valid_accuracy_cifar10)[-5:],
                              np.argsort(data.test_accuracy[:, 0])[-5:])


@pytest.mark.parametrize("dataset", ["cifar100", "imagenet16-120"])
def test_select_on_valid_is_refused_where_the_table_has_no_validation_column(dataset):
    with pytest.raises(ConfigError, match=f"no validation accuracy for dataset '{dataset}'.*"
                                          "select_on='test'"):
        NB201TableEstimator(dataset=dataset)
    with pytest.raises(ConfigError, match="select_on"):
        frugalnas.create_study(estimator="nb201-table", estimator_options={"dataset": dataset},
                               disable_plugins=["mlflow"])
    with pytest.raises(ConfigError, match="invalid nb201-table select_on 'validation'"):
        NB201TableEstimator(select_on="validation")
    assert NB201TableEstimator(dataset=dataset, select_on="test").value_metric == \
        f"test_accuracy_{dataset}"


def test_latency_of_all_27_devices_and_every_metric_declared():
    assert len(LATENCY_DEVICES) == len(set(LATENCY_DEVICES)) == 27
    data = nb201_data()
    assert sorted(data.latency_devices) == sorted(LATENCY_DEVICES)
    assert data.latency_ms.shape == (15625, 27) and (data.latency_ms > 0).all()
    estimator = NB201TableEstimator()
    result = _evaluate(NB201Space().from_index(1234))
    assert set(result.metrics) == set(estimator.provides)
    for device in LATENCY_DEVICES:
        assert result.metrics[f"latency_ms_{device}"] > 0
    assert {"params", "flops"} <= set(estimator.objective_names())


@pytest.mark.skipif(not (VALID_CSV.exists() and LATENCY_CSV.exists()),
                    reason="shared NAS-Bench-201 CSVs not present")
def test_table_matches_the_source_csvs_by_cell_string():
    space, data = NB201Space(), nb201_data()
    valid, latency = pd.read_csv(VALID_CSV), pd.read_csv(LATENCY_CSV)
    assert (valid["arch"] == latency["arch"]).all()
    order = np.array([space.index(space.parse(a)) for a in valid["arch"]])
    assert len(set(order)) == 15625
    assert (order != np.arange(15625)).mean() > 0.99  # the benchmark's order is not ours
    rows = valid.sample(300, random_state=0).index
    np.testing.assert_allclose(data.valid_accuracy_cifar10[order[rows]],
                               valid.loc[rows, "cifar10_valid_200ep"], atol=1e-3)
    for device in LATENCY_DEVICES:
        np.testing.assert_allclose(data.latency(device)[order[rows]],
                                   latency.loc[rows, device], rtol=1e-3)


def test_accuracy_vs_params_study_has_a_real_front():
    study = frugalnas.create_study(estimator="nb201-table", strategy="random", seed=0,
                                   objectives=["value", "params"],
                                   directions=["maximize", "minimize"],
                                   disable_plugins=["mlflow"])
    study.optimize(30)
    front = study.best_trials
    assert len(front) > 1
    assert len({t.values[1] for t in front}) > 1 and min(t.values[1] for t in front) > 0
    flops = frugalnas.create_study(estimator="nb201-table", seed=0, objectives=["flops"],
                                   directions=["minimize"], disable_plugins=["mlflow"])
    flops.optimize(5)
    assert flops.best_value >= nb201_data().flops[:, 0].min() > 0


def test_edge_search_example_is_a_valid_two_objective_run_file(tmp_path):
    text = (ROOT / "examples" / "edge_search.toml").read_text()
    data = tomllib.loads(text)
    assert data["objectives"] == ["value", "latency_ms_pixel3"]
    assert data["constraints"] == {"latency_ms_pixel3": 10.0}
    if "constraints" not in {f.name for f in dataclasses.fields(StudyConfig)}:
        # constraints are not in the study config yet: run the file without them
        text = "\n".join(line for line in text.splitlines()
                         if not line.startswith("constraints"))
    path = tmp_path / "edge.toml"
    path.write_text(text)
    from frugalnas.cli.main import main

    assert main(["run", str(path), "--no-tracking", "--n-trials", "20", "--quiet"]) == 0


def test_metrics_of_a_cell_are_its_table_entries():
    data = nb201_data()
    for index in (0, 1234, 15624):
        metrics = data.metrics(index)
        assert metrics["valid_accuracy_cifar10"] == float(data.valid_accuracy_cifar10[index])
        for i, name in enumerate(("cifar10", "cifar100", "imagenet16-120")):
            assert metrics[f"test_accuracy_{name}"] == float(data.test_accuracy[index, i])
        for i, device in enumerate(data.latency_devices):
            assert metrics[f"latency_ms_{device}"] == float(data.latency_ms[index, i])
        assert all(type(v) is float for v in metrics.values())


def test_a_space_that_is_not_the_benchmark_network_is_refused_before_anything_is_written(
        tmp_path):
    import subprocess
    import sys

    storage = tmp_path / "study.db"
    proc = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "run", "--space", "nb201", "-o", "space.N=1",
         "-o", "space.C=8", "--estimator", "nb201-table", "--no-tracking", "--storage",
         f"sqlite:///{storage}"], capture_output=True, text=True, timeout=300, cwd=tmp_path)
    assert proc.returncode == 2 and proc.stdout == ""
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith("frugalnas: error: estimator 'nb201-table' holds the values "
                                  "of the benchmark network and cannot score space 'nb201' "
                                  "with N=1, C=8; valid: N=5, C=16")
    assert "any_network=True (-o estimator.any_network=true)" in proc.stderr
    assert not storage.exists()
    with pytest.raises(ConfigError, match="with N=5, C=8; valid: N=5, C=16"):
        frugalnas.create_study(space_options={"C": 8}, disable_plugins=["mlflow", "progress"])
    # a strategy that builds the smaller networks, the table scoring each cell: said so
    study = frugalnas.create_study(space_options={"N": 1, "C": 8},
                                   estimator_options={"any_network": True},
                                   disable_plugins=["mlflow", "progress"])
    study.optimize(n_trials=2)
    assert len(study.completed_trials()) == 2
    with pytest.raises(ConfigError, match="invalid nb201-table any_network 'yes'"):
        NB201TableEstimator(any_network="yes")
