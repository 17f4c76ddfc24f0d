import math

import mlflow
import pytest
import torch

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies.ensemble import MEMBER_PRESETS
from frugalnas.strategies.prescreen import PRESCREEN_ATTR, PrescreenSampler
from frugalnas.spaces.nb201.space import NB201Space

SMALL = {"N": 1, "C": 8}
#: The pre-screen's proxies build the SMALL networks; the table scores the chosen cells as in
#: the benchmark network.
TABLE = {"estimator": "nb201-table", "estimator_options": {"any_network": True}}
SHAPE = {"input_shape": [3, 16, 16]}


@pytest.mark.slow
def test_study_with_synflow_estimator_logs_trials_to_mlflow(stores):
    storage, uri = stores
    study = frugalnas.create_study(space="nb201", space_options=SMALL, estimator="synflow",
                                   dataset=None, estimator_options=SHAPE, storage=storage,
                                   study_name="synflow-study", plugin_options={"mlflow": {"tracking_uri": uri}}, seed=4)
    study.optimize(3)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    client = mlflow.MlflowClient(tracking_uri=uri)
    exp = client.get_experiment_by_name("synflow-study")
    trial_runs = [r for r in client.search_runs([exp.experiment_id])
                  if r.data.tags.get("frugalnas.role") == "trial"]
    assert len(trial_runs) == 3
    values = sorted(t.value for t in study.trials)
    assert sorted(r.data.metrics["proxy_synflow"] for r in trial_runs) == pytest.approx(values)
    assert all(r.data.metrics["cost_flops"] > 0 for r in trial_runs)


class RecordingPrescreen(PrescreenSampler):
    """The real sampler, also keeping every candidate's score for the test to inspect."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.scored: list[list[tuple[str, float]]] = []

    def sample_relative(self, study, trial, search_space):
        self.scored.append([])
        return super().sample_relative(study, trial, search_space)

    def _scores(self, archs):
        values = super()._scores(archs)
        self.scored[-1].extend((str(a), v[0]) for a, v in zip(archs, values))
        return values


def test_prescreen_hands_the_best_of_k_candidates_to_the_trial():
    host = PluginHost()
    space = NB201Space(**SMALL)
    inner = host.create("strategies", "random", space=space, seed=0)
    sampler = RecordingPrescreen(inner, space=space, host=host, seed=0, proxy="synflow", k=6,
                                 data="gaussian", **SHAPE)
    study = frugalnas.create_study(space="nb201", space_options=SMALL, strategy=sampler,
                                   **TABLE, disable_plugins=["mlflow"])
    study.optimize(4)
    for trial, scored in zip(study.trials, sampler.scored):
        assert len({a for a, _ in scored}) == 6
        best_arch, best = max(scored, key=lambda s: s[1])
        assert str(trial.architecture) == best_arch
        assert trial.system_attrs[PRESCREEN_ATTR]["proxy_synflow"] == pytest.approx(best)


def test_prescreen_from_study_config_with_an_ensemble_and_data_from_the_study():
    study = frugalnas.create_study(space="nb201", space_options=SMALL, **TABLE,
                                   dataset="digits", dataset_options={"resize": 16},
                                   strategy="prescreen",
                                   strategy_options={"proxy": ["synflow", "naswot"], "k": 3,
                                                     "batch_size": 8},
                                   disable_plugins=["mlflow"], seed=1)
    study.optimize(2)
    for t in study.trials:
        record = t.system_attrs[PRESCREEN_ATTR]
        assert record["prescreen_candidates"] == 3
        assert math.isfinite(record["proxy_naswot"]) and t.state.name == "COMPLETE"


def test_prescreen_takes_a_member_preset_and_records_every_member():
    study = frugalnas.create_study(space="nb201", space_options=SMALL, **TABLE,
                                   dataset="digits", dataset_options={"resize": 16},
                                   strategy="prescreen",
                                   strategy_options={"proxy": "selected", "k": 3,
                                                     "batch_size": 8},
                                   disable_plugins=["mlflow"], seed=1)
    assert [p.name for p in study.strategy.members] == list(MEMBER_PRESETS["selected"])
    study.optimize(2)
    for t in study.trials:
        record = t.system_attrs[PRESCREEN_ATTR]
        assert all(math.isfinite(record[f"proxy_{n}"]) for n in MEMBER_PRESETS["selected"])


def test_prescreen_refuses_an_empty_proxy_list_naming_the_presets():
    host = PluginHost()
    space = NB201Space(**SMALL)
    inner = host.create("strategies", "random", space=space, seed=0)
    with pytest.raises(ConfigError, match="preset: default, selected"):
        PrescreenSampler(inner, space=space, host=host, proxy=[], data="gaussian", **SHAPE)


def test_prescreen_scores_a_candidate_with_shared_passes_as_each_proxy_alone():
    """jacob_cov and epe_nas share their input-Jacobian pass in the prescreen; the values kept
    for the chosen candidate equal those each proxy computes alone on the same network."""
    host = PluginHost()
    space = NB201Space(**SMALL)
    inner = host.create("strategies", "random", space=space, seed=0)
    sampler = PrescreenSampler(inner, space=space, host=host, seed=0,
                               proxy=["jacob_cov", "epe_nas"], k=3, data="gaussian", **SHAPE)
    study = frugalnas.create_study(space="nb201", space_options=SMALL, strategy=sampler,
                                   **TABLE, disable_plugins=["mlflow"])
    study.optimize(2)
    x, y, num_classes = sampler._fixed_batch()
    for t in study.trials:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(0)
            model = space.build(t.architecture, num_classes, tuple(x.shape[1:]))
        record = t.system_attrs[PRESCREEN_ATTR]
        for p in sampler.members:
            assert record[f"proxy_{p.name}"] == p.score(model, x, y)


def test_rank_ensemble_ranks_within_the_trials_seen_so_far():
    study = frugalnas.create_study(space="nb201", space_options=SMALL, estimator="rank-ensemble",
                                   dataset=None, disable_plugins=["mlflow"], seed=3,
                                   estimator_options={"proxies": ["synflow", "params"],
                                                      "data": "gaussian", **SHAPE})
    study.optimize(5)
    trials = study.trials
    assert [t.user_attrs["metrics"]["population"] for t in trials] == [1, 2, 3, 4, 5]
    assert trials[0].value == 0.5  # alone in its population
    for t in trials:
        assert 0.0 <= t.value <= 1.0
    # the last trial's score is its mean percentile rank among all five
    import numpy as np

    from frugalnas.proxies.ensemble import rank_average

    rows = np.array([[t.user_attrs["metrics"][f"proxy_{n}"] for n in ("synflow", "params")]
                     for t in trials])
    assert trials[-1].value == pytest.approx(rank_average(rows)[-1])


def test_a_learned_ensemble_refuses_a_space_its_teacher_cannot_score():
    with pytest.raises(ConfigError, match="estimator 'nb201-table' holds the values of the "
                                          "benchmark network and cannot score space 'nb201'"):
        frugalnas.create_study(space="nb201", space_options=SMALL,
                               estimator="learned-ensemble", dataset=None,
                               disable_plugins=["mlflow"], estimator_options={
                                   "proxies": ["params"], "teacher": "nb201-table",
                                   "data": "gaussian", **SHAPE})


def test_learned_ensemble_fits_weights_from_teacher_scores():
    study = frugalnas.create_study(space="nb201", space_options=SMALL,
                                   estimator="learned-ensemble", dataset=None, disable_plugins=["mlflow"],
                                   seed=5, estimator_options={
                                       "proxies": ["synflow", "params", "l2_norm"],
                                       "teacher": "nb201-table", "teacher_every": 2,
                                       "teacher_options": {"any_network": True},
                                       "min_labelled": 3, "data": "gaussian", **SHAPE})
    study.optimize(6)
    metrics = [t.user_attrs["metrics"] for t in study.trials]
    assert all("teacher_value" in m for m in metrics[:3])
    late = metrics[-1]
    weights = [late[f"weight_{n}"] for n in ("synflow", "params", "l2_norm")]
    assert sum(weights) == pytest.approx(1.0) and min(weights) >= 0


@pytest.mark.slow
def test_low_fidelity_is_cheaper_than_full_training():
    common = dict(space="nb201", space_options=SMALL, dataset="digits", disable_plugins=["mlflow"], seed=0)
    arch = NB201Space(**SMALL).parse(
        "|nor_conv_3x3~0|+|nor_conv_3x3~0|avg_pool_3x3~1|+|skip_connect~0|nor_conv_3x3~1|skip_connect~2|")
    full = frugalnas.create_study(estimator="train", estimator_options={"max_steps": 8}, **common)
    low = frugalnas.create_study(estimator="low-fidelity", **common, estimator_options={
        "epochs": 1, "subset": 0.1, "width": 4, "resize": 6})
    full_res, low_res = full.evaluate(arch), low.evaluate(arch)
    assert low_res.cost.epochs == pytest.approx(1.0) and low_res.cost.flops < full_res.cost.flops / 2
    assert low_res.cost.params < full_res.cost.params
    assert 0.0 <= low_res.value <= 100.0 and low_res.metrics["fidelity_subset"] == 0.1
    again = low.evaluate(arch)
    assert again.value == low_res.value


def test_low_fidelity_rejects_bad_options():
    with pytest.raises(frugalnas.ConfigError, match="subset"):
        PluginHost().create("estimators", "low-fidelity", subset=1.5)
    with pytest.raises(frugalnas.ConfigError, match="resize"):
        PluginHost().create("estimators", "low-fidelity", resize=0)


def test_proxy_estimator_on_the_backend_device():
    study = frugalnas.create_study(space="nb201", space_options=SMALL, estimator="naswot",
                                   dataset="digits", dataset_options={"resize": 16},
                                   estimator_options={"batch_size": 8}, disable_plugins=["mlflow"],
                                   backend_options={"device": "cpu"})
    res = study.evaluate(study.space.from_index(1234))
    assert math.isfinite(res.value) and res.cost.params == sum(
        p.numel() for p in study.space.build(study.space.from_index(1234), 10, (1, 16, 16)).parameters())
    assert torch.get_default_dtype() == torch.float32


def test_prescreen_survives_load_study(tmp_path):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    config = dict(space="nb201", space_options=SMALL, **TABLE, dataset=None,
                  strategy="prescreen",
                  strategy_options={"proxy": "synflow", "k": 3, "data": "gaussian", **SHAPE},
                  disable_plugins=["mlflow"])
    frugalnas.create_study(storage=storage, study_name="pre", **config).optimize(1)
    study = frugalnas.load_study(study_name="pre", storage=storage)
    assert isinstance(study.optuna_study.sampler, PrescreenSampler)
    study.optimize(1)
    assert [t.system_attrs[PRESCREEN_ATTR]["prescreen_candidates"] for t in study.trials] == [3, 3]
