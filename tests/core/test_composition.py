"""Components compose: a plugin passed to one study is usable by every component of that study,
every strategy works with one and two objectives and behind a pre-screen, and the host knows no
feature package."""

from __future__ import annotations

import ast
import math
from pathlib import Path

import numpy as np
import optuna
import pytest
import torch

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.keys import PRESCREEN_ATTR
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies import Proxy
from frugalnas.spaces.nb201 import NB201Space
from frugalnas.surrogates import Surrogate

PACKAGE = Path(frugalnas.__file__).resolve().parent
SMALL = {"N": 1, "C": 4}
#: The table scores the cells of the SMALL space as in the benchmark network (N=5, C=16): for
#: studies where a proxy builds the small networks, which the table then scores.
ANY_NETWORK = {"any_network": True}
OFF = {"disable_plugins": ["mlflow", "progress"]}


class TreesSurrogate(Surrogate):
    """Extra-trees regressor: a surrogate only this test's plugin registers."""

    def __init__(self, seed: int = 0):
        self.seed = seed

    def _fit(self, X, y):
        from sklearn.ensemble import ExtraTreesRegressor

        self.calls_ = getattr(self, "calls_", 0) + 1
        self.model_ = ExtraTreesRegressor(n_estimators=20, random_state=self.seed).fit(X, y)

    def _predict(self, X):
        per_tree = np.stack([t.predict(X) for t in self.model_.estimators_])
        return per_tree.mean(0), per_tree.std(0)


class WeightCount(Proxy):
    """Number of weights in convolutions: a proxy only this test's plugin registers."""

    name = "weight-count"
    needs_data = False
    needs_labels = False
    passes = 0.0

    def compute(self, model, inputs, targets):
        return float(sum(m.weight.numel() for m in model.modules()
                         if isinstance(m, torch.nn.Conv2d)))


class OutsidePlugin:
    """A third-party plugin passed as an object: one surrogate and one proxy."""

    def __init__(self):
        self.surrogates_built = 0

    @frugalnas.hookimpl
    def frugalnas_surrogates(self):
        def my_trees(seed: int = 0) -> TreesSurrogate:
            """Extra trees (test plugin)."""
            self.surrogates_built += 1
            return TreesSurrogate(seed)
        return {"my-trees": my_trees}

    @frugalnas.hookimpl
    def frugalnas_proxies(self):
        return {"weight-count": WeightCount}


@pytest.mark.parametrize("strategy, options", [
    ("surrogate-evolution", {"surrogate": "my-trees", "population_size": 4, "sample_size": 2,
                             "n_init": 4, "n_candidates": 4, "quality_every": 0}),
    ("bananas", {"surrogate": "my-trees", "n_init": 4, "n_candidates": 4, "top_k": 2,
                 "quality_every": 0}),
])
def test_an_outside_surrogate_serves_surrogate_strategies(strategy, options):
    plugin = OutsidePlugin()
    study = frugalnas.create_study(plugins=[plugin], strategy=strategy, strategy_options=options,
                                   seed=0, **OFF)
    study.optimize(7)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 7
    assert plugin.surrogates_built >= 3  # one fit per proposal after the initial design


def test_an_outside_proxy_serves_the_prescreen_the_proxy_encoding_and_the_estimator():
    plugin = OutsidePlugin()
    pre = frugalnas.create_study(
        plugins=[plugin], strategy="prescreen", dataset=None, space_options=SMALL, seed=1,
        estimator_options=ANY_NETWORK,
        strategy_options={"inner": "regularized-evolution", "proxy": "weight-count", "k": 3,
                          "data": "gaussian", "input_shape": [3, 8, 8],
                          "inner_options": {"population_size": 4, "sample_size": 2}}, **OFF)
    pre.optimize(5)
    assert all("proxy_weight-count" in t.system_attrs[PRESCREEN_ATTR] for t in pre.trials)
    enc = frugalnas.create_study(
        plugins=[plugin], strategy="bananas", space_options=SMALL, seed=1,
        estimator_options=ANY_NETWORK,
        strategy_options={"surrogate": "random-forest", "encoding": "proxy",
                          "encoding_options": {"proxies": ["weight-count"],
                                               "input_shape": [3, 8, 8]},
                          "n_init": 3, "n_candidates": 4, "quality_every": 0}, **OFF)
    enc.optimize(5)
    assert [t.state.name for t in enc.trials] == ["COMPLETE"] * 5
    est = frugalnas.create_study(plugins=[plugin], estimator="weight-count", dataset=None,
                                 space_options=SMALL, estimator_options={"data": "gaussian"},
                                 **OFF)
    est.optimize(2)
    assert all(t.value > 0 for t in est.trials)


def test_the_default_host_does_not_see_a_plugin_passed_to_another_study():
    frugalnas.create_study(plugins=[OutsidePlugin()], **OFF)
    with pytest.raises(ConfigError, match="unknown surrogate 'my-trees'"):
        frugalnas.create_study(strategy="bananas", strategy_options={"surrogate": "my-trees"},
                               **OFF)


def test_a_prescreen_over_regularized_evolution_ranks_k_distinct_proposals():
    host = PluginHost(disable_plugins=["mlflow", "progress"])
    space = NB201Space()
    study = frugalnas.create_study(
        host=host, seed=2, strategy="regularized-evolution", strategy_options={"population_size": 4,
                                                            "sample_size": 2})
    study.optimize(6)
    inner = host.create("strategies", "regularized-evolution", space=space, seed=2,
                        population_size=4, sample_size=2)
    trial = study.optuna_study.ask()
    proposals = inner.propose(study.optuna_study, trial, 5)
    keys = {a.key for a in proposals}
    seen = {t.architecture.key for t in study.completed_trials()}
    assert len(proposals) == 5 and len(keys) == 5 and not keys & seen
    # ...and they are the strategy's own choices: the first is what the trial would get.
    params = inner.sample_relative(study.optuna_study, trial, dict(space.distributions()))
    assert space.from_params(params).key == proposals[0].key
    # In a study, the pre-screen scores all k and records how many it saw.
    pre = frugalnas.create_study(
        host=host, space_options=SMALL, estimator_options=ANY_NETWORK, seed=2, dataset=None,
        strategy="prescreen",
        strategy_options={"inner": "regularized-evolution", "k": 5, "data": "gaussian",
                          "input_shape": [3, 8, 8],
                          "inner_options": {"population_size": 4, "sample_size": 2}})
    pre.optimize(8)
    assert [t.system_attrs[PRESCREEN_ATTR]["prescreen_candidates"] for t in pre.trials] == [5] * 8
    assert len({t.architecture.key for t in pre.trials}) == 8


def test_a_prescreen_refuses_a_sampler_that_cannot_propose_several_candidates():
    from frugalnas.strategies.prescreen import PrescreenSampler

    host = PluginHost()
    with pytest.raises(ConfigError, match="TPESampler cannot propose several distinct"):
        PrescreenSampler(optuna.samplers.TPESampler(seed=0), NB201Space(**SMALL), host)
    with pytest.raises(ConfigError, match="SIEvolutionSampler cannot propose"):
        frugalnas.create_study(space="dag", estimator="inherited", strategy="prescreen",
                               strategy_options={"inner": "si-evolution"}, **OFF)


def test_two_objective_train_studies_complete_and_report_vectors_per_step():
    kwargs = dict(estimator="train", dataset="synthetic", space_options=SMALL, seed=0,
                  dataset_options={"n": 96, "size": 8}, directions=["maximize", "minimize"],
                  objectives=["value", "params"],
                  estimator_options={"epochs": 2, "batch_size": 32}, **OFF)
    with pytest.raises(ConfigError, match="pruner 'MedianPruner' prunes on one objective.*"
                                          "'pareto'"):
        frugalnas.create_study(pruner=optuna.pruners.MedianPruner(), **kwargs)
    study = frugalnas.create_study(**kwargs)
    study.optimize(3)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3
    assert all(t.values[1] > 0 for t in study.trials)
    assert all(t.intermediate_values == {} for t in study.trials)  # optuna's: one objective
    assert all(sorted(t.user_attrs["intermediate_values"]) == ["1", "2"] for t in study.trials)


def test_single_objective_pruning_still_sees_every_epoch():
    study = frugalnas.create_study(
        estimator="train", dataset="synthetic", space_options=SMALL, seed=0,
        dataset_options={"n": 96, "size": 8}, estimator_options={"epochs": 2, "batch_size": 32},
        pruner=optuna.pruners.NopPruner(), **OFF)
    study.optimize(1)
    assert sorted(study.trials[0].intermediate_values) == [1, 2]


@pytest.mark.parametrize("objectives", [["valid_acc"], ["value", "latency"]])
def test_an_objective_the_estimator_does_not_produce_is_refused_before_any_trial(
        objectives, tmp_path):
    storage = f"sqlite:///{tmp_path / 'o.db'}"
    directions = ["maximize"] * len(objectives)
    with pytest.raises(ConfigError, match="is not a metric of estimator 'train'.*valid_accuracy"):
        frugalnas.create_study(estimator="train", objectives=objectives, directions=directions,
                               storage=storage, study_name="o", **OFF)
    assert optuna.get_all_study_summaries(storage) == []  # nothing was created


def test_every_misspelt_option_of_every_registered_component_names_the_valid_ones():
    host = PluginHost()
    for kind in ("search_spaces", "strategies", "backends", "datasets", "proxies",
                 "surrogates"):
        for name in host.registry(kind).names():
            with pytest.raises(ConfigError, match=r"unknown option 'colour'.*valid options"):
                extra = {"space": NB201Space(**SMALL)} if kind == "strategies" else {}
                host.create(kind, name, colour=1, **extra)
    for name in host.estimators().names():
        with pytest.raises(ConfigError, match=r"unknown option 'colour'.*valid options"):
            host.create_estimator(name, {"colour": 1})


def _imports(path: Path) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module:
            found.append(node.module)
    return found


CORE_LAYERS = ("ports", "host", "engine", "distribution", "cli")


def test_core_layers_import_no_feature_package():
    allowed = tuple(f"frugalnas.{layer}" for layer in CORE_LAYERS) + ("frugalnas.builtins",)
    bad = {f"{p.relative_to(PACKAGE)}: {m}" for layer in CORE_LAYERS
           for p in (PACKAGE / layer).glob("*.py") for m in _imports(p)
           if m.startswith("frugalnas") and not m.startswith(allowed)}
    assert not bad, bad
    assert "import" not in (PACKAGE / "builtins.py").read_text().split('"""')[-1].replace(
        "from __future__ import annotations", "")


def test_tracking_and_export_do_not_import_each_other():
    """export hands networks to frugalnas_model_exported; the MLflow plugin implements it and
    renders the leaderboard from frugalnas.leaderboard: neither package imports the other."""
    pairs = (("tracking", "frugalnas.export"), ("export", "frugalnas.tracking"))
    bad = {f"{p.relative_to(PACKAGE)}: {m}" for unit, other in pairs
           for p in (PACKAGE / unit).rglob("*.py") for m in _imports(p) if m.startswith(other)}
    assert not bad, bad


def test_no_component_makes_a_host_of_its_own():
    """A component receives its study's host; only the public convenience functions and the
    study (when no host is given) make one from the installed plugins."""
    users = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if "get_host(" in p.read_text()} - {"host/plugins.py", "engine/study.py",
                                                  "__init__.py"}
    assert not users, users


def test_private_optuna_calls_live_in_the_compatibility_module():
    private = ("._storage", "._trial_id", "._get_trials(", "optuna.storages._", "_backend.url")
    users = {str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py")
             if any(s in p.read_text() for s in private)}
    assert users <= {"ports/optuna_compat.py"}, users


def test_the_optuna_compatibility_calls_work_with_the_installed_optuna(tmp_path):
    from frugalnas.ports import optuna_compat as compat
    from frugalnas.distribution.quota_storage import make_storage

    url = f"sqlite:///{tmp_path / 's.db'}"
    study = optuna.create_study(storage=make_storage(url, heartbeat=5))
    trial = study.ask()
    compat.set_trial_system_attr(study, trial, "k", 1)
    assert compat.trial_id(trial) == trial._trial_id
    assert compat.fresh_trials(study)[0].system_attrs["k"] == 1
    assert compat.storage_url(study) == url
    assert compat.heartbeat_interval(compat.storage_of(study)) == 5
    low, high = compat.SUPPORTED_OPTUNA
    version = tuple(int(x) for x in optuna.__version__.split(".")[:2])
    assert tuple(map(int, low.split("."))) <= version < tuple(map(int, high.split(".")))


OPTUNA_SAMPLERS = ("tpe", "nsga2", "nsga3", "gp")


def _table_cells() -> list[tuple[str, bool]]:
    strategies = PluginHost().registry("strategies").names()
    cells = []
    for name in strategies:
        if name in ("prescreen", "si-evolution", "darts"):
            continue  # wrappers, and strategies that train on a dataset (tested on their own)
        cells.append((name, False))
        if name not in OPTUNA_SAMPLERS:  # optuna's samplers cannot propose k candidates:
            cells.append((name, True))   # the pre-screen refuses them (tested below)
    return cells


FAST = {"regularized-evolution": {"population_size": 4, "sample_size": 2},
        "local-search": {"n_init": 3},
        "surrogate-evolution": {"population_size": 4, "sample_size": 2, "n_init": 4,
                                "n_candidates": 4, "quality_every": 0},
        "bananas": {"n_init": 3, "n_candidates": 4, "top_k": 2, "quality_every": 0},
        "random": {}}


@pytest.mark.parametrize("objectives", [["value"], ["value", "test_accuracy_cifar100"]],
                         ids=["one-objective", "two-objectives"])
@pytest.mark.parametrize("strategy, prescreen", _table_cells(),
                         ids=[f"{s}{'+prescreen' if p else ''}" for s, p in _table_cells()])
def test_composition_matrix_on_the_table_estimator(strategy, prescreen, objectives):
    options = dict(FAST.get(strategy, {}))
    small = {}
    if prescreen:
        options = {"inner": strategy, "inner_options": options, "k": 3, "data": "gaussian",
                   "input_shape": [3, 8, 8], "proxy": ["synflow", "params"]}
        strategy = "prescreen"
        # the proxies build the small networks; the table scores the cells they choose
        small = {"space_options": SMALL, "estimator_options": ANY_NETWORK}
    study = frugalnas.create_study(strategy=strategy, strategy_options=options, seed=3,
                                   dataset=None, objectives=objectives,
                                   directions=["maximize"] * len(objectives), **small, **OFF)
    study.optimize(8)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 8
    assert len({t.architecture.key for t in study.trials}) == 8  # nothing evaluated twice
    assert all(math.isfinite(v) for t in study.trials for v in t.values)


@pytest.mark.parametrize("objectives", [["value"], ["value", "generation"]])
def test_si_evolution_with_one_and_two_objectives(objectives, tmp_path):
    study = frugalnas.create_study(
        space="dag", strategy="si-evolution", estimator="inherited", dataset="synthetic",
        dataset_options={"n": 64, "size": 8, "channels": 1},
        space_options={"nodes": 2, "channels": 4, "reductions": 1},
        strategy_options={"population_size": 2, "offspring": 2, "generations": 1,
                          "batches_per_generation": 1, "batch_size": 16,
                          "checkpoint_dir": str(tmp_path)},
        objectives=objectives, directions=["maximize"] * len(objectives), seed=0, **OFF)
    study.optimize(10)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 4  # the strategy's end


@pytest.mark.slow
@pytest.mark.parametrize("backend, options", [
    ("single-device", {}),
    ("virtual-node", {"virtual_nodes": 2}),
    ("out-of-core", {"budget_fraction": 0.5}),
])
@pytest.mark.parametrize("objectives", [["value"], ["value", "params"]])
def test_composition_matrix_with_training_on_each_backend(backend, options, objectives):
    study = frugalnas.create_study(
        estimator="train", dataset="synthetic", dataset_options={"n": 64, "size": 8},
        space_options=SMALL, backend=backend, backend_options=options, seed=0,
        estimator_options={"epochs": 1, "batch_size": 16, "max_steps": 2},
        strategy="regularized-evolution", strategy_options=FAST["regularized-evolution"],
        objectives=objectives, directions=["maximize", "minimize"][:len(objectives)], **OFF)
    study.optimize(3)
    assert [t.state.name for t in study.trials] == ["COMPLETE"] * 3


def test_the_strategy_and_the_estimator_see_the_study_s_one_space_object():
    study = frugalnas.create_study(strategy="regularized-evolution", **OFF)
    assert study.strategy.space is study.space
    assert study.context().space is study.space
    pre = frugalnas.create_study(strategy="prescreen", dataset=None,
                                 strategy_options={"data": "gaussian"}, **OFF)
    assert pre.strategy.space is pre.space and pre.strategy.inner.space is pre.space


def test_a_study_stored_by_frugalnas_0_1_loads_with_its_tracking_and_prescreen(tmp_path):
    import json

    storage = f"sqlite:///{tmp_path / 'old.db'}"
    old = {"space": "nb201", "strategy": "random", "estimator": "nb201-table",
           "backend": "single-device", "dataset": None, "space_options": {},
           "strategy_options": {}, "estimator_options": {}, "backend_options": {},
           "dataset_options": {}, "directions": ["maximize"], "objectives": ["value"],
           "seed": 0, "trial_timeout": None, "plugins": [], "disable_plugins": ["progress"],
           "tracking": False, "tracking_uri": None,
           "prescreen": {"proxy": "synflow", "k": 2, "data": "gaussian"}}
    optuna.create_study(storage=storage, study_name="old").set_user_attr(
        "frugalnas_config", json.dumps(old))
    study = frugalnas.load_study(study_name="old", storage=storage)
    assert "mlflow" in study.config.disable_plugins and not study.host.has_plugin("mlflow")
    assert study.config.strategy == "prescreen" and study.strategy.k == 2
    study.optimize(2)
    assert [t.system_attrs[PRESCREEN_ATTR]["prescreen_candidates"] for t in study.trials] == [2, 2]


def test_reopening_with_other_settings_names_the_fields_that_differ(tmp_path):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    frugalnas.create_study(storage=storage, study_name="s", seed=1, **OFF)
    with pytest.raises(ConfigError, match=r"seed: 1 -> 2"):
        frugalnas.create_study(storage=storage, study_name="s", seed=2, load_if_exists=True,
                               **OFF)
