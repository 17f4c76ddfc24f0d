"""Define-by-run model spaces: a builder function asking optuna-style decisions becomes a
search space (conditional decisions, text form, variation, optuna samplers, studies, run
files and their code-loading policy, one-line errors for broken builders)."""

import random
import subprocess
import sys
import textwrap

import optuna
import pytest
import torch
from torch import nn

import frugalnas
from frugalnas.ports.space import params_of
from frugalnas.ports.errors import ArchitectureParseError, ConfigError, PluginNotAllowedError
from frugalnas.spaces import DefineByRunSpace, define
from frugalnas.testing import check_search_space


def small_cnn(trial, max_depth: int = 3):
    """A small CNN: depth, then a width and a kernel per layer."""
    layers, c = [], trial.in_channels
    for i in range(trial.suggest_int("depth", 1, max_depth)):
        w = trial.suggest_categorical(f"width{i}", [4, 8])
        k = trial.suggest_categorical(f"kernel{i}", [3, 5])
        layers += [nn.Conv2d(c, w, k, padding=k // 2), nn.ReLU()]
        c = w
    return nn.Sequential(*layers, nn.AdaptiveAvgPool2d(1), nn.Flatten(),
                         nn.Linear(c, trial.num_classes))


@pytest.fixture(scope="module")
def space() -> DefineByRunSpace:
    return define(small_cnn)(discovery=50)


def test_discovers_every_decision_including_conditional_ones(space):
    assert list(space.distributions()) == ["depth", "width0", "kernel0", "width1", "kernel1",
                                           "width2", "kernel2"]
    assert sum(1 for _ in space.enumerate()) == 4 + 16 + 64


def test_inactive_decisions_are_neither_stored_nor_mutated(space):
    arch = space.from_params({"depth": 1, "width0": 8, "kernel0": 3, "width2": 4})
    assert arch.decisions == {"depth": 1, "width0": 8, "kernel0": 3}
    rng = random.Random(0)
    for _ in range(30):
        child = space.mutate(arch, rng)
        space.validate(child)
        assert child != arch
        assert set(child.decisions) == {"depth"} | {f"{p}{i}" for i in range(child["depth"])
                                                      for p in ("width", "kernel")}
        if child["depth"] == 1:  # only depth, width0 or kernel0 can have changed
            assert sum(child[k] != arch[k] for k in child.decisions) == 1


def test_text_form_round_trip_and_validation(space):
    rng = random.Random(1)
    for _ in range(10):
        arch = space.sample(rng)
        assert space.parse(str(arch)) == arch
        assert space.from_params(params_of(space, arch)) == arch
    with pytest.raises(ArchitectureParseError, match="kernel1"):
        space.parse("small_cnn:depth=2,width0=4,kernel0=3,width1=4")  # kernel1 missing
    with pytest.raises(ArchitectureParseError, match="width1"):
        space.parse("small_cnn:depth=1,width0=4,kernel0=3,width1=4")  # inactive stored
    with pytest.raises(ArchitectureParseError, match="valid: 4, 8"):
        space.parse("small_cnn:depth=1,width0=6,kernel0=3")


def test_neighbours_crossover_and_build(space):
    arch = space.parse("small_cnn:depth=2,width0=4,kernel0=3,width1=8,kernel1=5")
    nbrs = space.neighbours(arch)
    # width0, kernel0, width1, kernel1 flipped, depth 1 and depth 3 (new layer: first choices)
    assert len(nbrs) == 6
    assert space.parse("small_cnn:depth=3,width0=4,kernel0=3,width1=8,kernel1=5,width2=4,"
                       "kernel2=3") in nbrs
    other = space.parse("small_cnn:depth=1,width0=8,kernel0=5")
    child = space.crossover(arch, other, random.Random(0))
    space.validate(child)
    net = space.build(arch, num_classes=7, input_shape=(1, 8, 8))
    assert net(torch.zeros(2, 1, 8, 8)).shape == (2, 7)
    assert [m.kernel_size for m in net if isinstance(m, nn.Conv2d)] == [(3, 3), (5, 5)]


def test_passes_the_search_space_conformance_checks(space):
    check_search_space(space)


def test_optuna_sampler_sees_only_active_decisions(space):
    study = optuna.create_study(sampler=optuna.samplers.TPESampler(seed=0, n_startup_trials=3))
    for _ in range(8):
        trial = study.ask()
        arch = space.suggest(trial)
        assert set(trial.params) == set(arch.decisions)
        study.tell(trial, float(arch["depth"]))


@pytest.mark.parametrize("strategy", ["random", "regularized-evolution", "local-search",
                                      "surrogate-evolution", "tpe"])
def test_every_strategy_searches_a_builder_function(strategy):
    options = {"regularized-evolution": {"population_size": 4, "sample_size": 2},
               "local-search": {"n_init": 2},
               "surrogate-evolution": {"n_init": 3, "surrogate": "random-forest"}}.get(strategy, {})
    study = frugalnas.create_study(space=small_cnn, strategy=strategy, estimator="params",
                                   direction="minimize", disable_plugins=["mlflow"],
                                   strategy_options=options, seed=0)
    study.optimize(n_trials=8)
    assert study.config.space == f"{__name__}:small_cnn"
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 8
    assert len({str(t.architecture) for t in done}) == 8
    for t in done:
        assert set(t.params) == set(t.architecture.decisions)


def test_builder_options_are_checked_like_component_options():
    with pytest.raises(ConfigError, match="max_dept.*max_depth"):
        frugalnas.create_study(space=small_cnn, estimator="params", direction="minimize",
                               space_options={"max_dept": 2}, disable_plugins=["mlflow"])
    study = frugalnas.create_study(space=small_cnn, estimator="params", direction="minimize",
                                   space_options={"max_depth": 1}, disable_plugins=["mlflow"])
    assert list(study.space.distributions()) == ["depth", "width0", "kernel0"]


def _raises_at_depth_two(trial):
    layers = [nn.Flatten()]
    if trial.suggest_int("depth", 1, 2) == 2:
        raise RuntimeError("unsupported layer")
    return nn.Sequential(*layers, nn.LazyLinear(trial.num_classes))


def _returns_a_tensor(trial):
    trial.suggest_categorical("act", ["relu", "gelu"])
    return torch.zeros(1)


def test_a_broken_builder_is_one_line_naming_the_builder_and_decision():
    with pytest.raises(ConfigError) as info:
        define(_raises_at_depth_two)()
    message = str(info.value)
    assert "_raises_at_depth_two" in message and "depth=2" in message
    assert "unsupported layer" in message and "\n" not in message
    with pytest.raises(ConfigError, match=r"_returns_a_tensor returned Tensor after deciding "
                                          r"act='(relu|gelu)'; it must return a torch.nn.Module"):
        define(_returns_a_tensor)()


def _conflicting(trial):
    depth = trial.suggest_int("depth", 1, 2)
    trial.suggest_int("width", 1, 4 * depth)
    return nn.Linear(1, 1)


def test_choices_that_depend_on_other_decisions_are_refused():
    with pytest.raises(ConfigError, match="'width'.*give each variant its own decision name"):
        define(_conflicting)()


SPACE_MODULE = textwrap.dedent('''
    from torch import nn

    def tiny(trial):
        width = trial.suggest_categorical("width", [2, 4, 8])
        return nn.Sequential(nn.Flatten(), nn.LazyLinear(width), nn.ReLU(),
                             nn.LazyLinear(trial.num_classes))
''')


def _frugalnas(*args, cwd, env=None):
    return subprocess.run([sys.executable, "-m", "frugalnas.cli.main", *args], cwd=cwd,
                          capture_output=True, text=True, env=env, timeout=240)


@pytest.mark.slow
def test_run_file_names_a_builder_and_stored_paths_follow_the_code_loading_policy(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "userspaces.py").write_text(SPACE_MODULE)
    (project / "run.toml").write_text(textwrap.dedent('''
        study_name = "tiny"
        n_trials = 3
        space = "userspaces:tiny"
        estimator = "params"
        directions = ["minimize"]
    '''))
    db = f"sqlite:///{tmp_path / 'study.db'}"
    ran = _frugalnas("run", str(project / "run.toml"), "--no-tracking", "--storage", db,
                     cwd=tmp_path)
    assert ran.returncode == 0, ran.stderr
    assert "architecture=tiny:width=" in ran.stdout
    # Reopening the study from its storage imports the stored path only when allowed.
    refused = _frugalnas("report", "--storage", db, "--study-name", "tiny", cwd=tmp_path)
    assert refused.returncode == 2
    assert refused.stderr.strip().splitlines() == [
        "frugalnas: error: study 'tiny' needs search space 'userspaces:tiny', which no loaded "
        "plugin registers; its stored configuration names plugin 'userspaces', which "
        "frugalnas does not import from a storage: give -p userspaces to load it"]
    import os
    env = {**os.environ, "FRUGALNAS_PLUGINS_ALLOW": "userspaces", "PYTHONPATH": str(project)}
    allowed = _frugalnas("report", "--storage", db, "--study-name", "tiny", cwd=tmp_path,
                         env=env)
    assert allowed.returncode == 0, allowed.stderr
    assert "tiny:width=" in allowed.stdout
    # Anything but a public top-level name of an importable module is one line, exit 2.
    for bad, said in [("userspaces:_private", "invalid dotted path"),
                      ("userspaces:nosuch", "has no attribute 'nosuch'"),
                      ("os:sep", "names a str, which is no search space"),
                      ("os.path:join", "builder posixpath:join failed after deciding nothing"),
                      ("nosuchmodule:tiny", "cannot import module 'nosuchmodule'")]:
        out = _frugalnas("run", str(project / "run.toml"), "--space", bad, "--no-tracking",
                         "--storage", f"sqlite:///{tmp_path / 'bad.db'}", cwd=tmp_path)
        assert out.returncode == 2 and said in out.stderr, (bad, out.stderr)
        assert len(out.stderr.strip().splitlines()) == 1
    assert not (tmp_path / "bad.db").exists()


def test_load_study_refuses_a_stored_path_unless_allowed(tmp_path, monkeypatch):
    storage = f"sqlite:///{tmp_path / 's.db'}"
    frugalnas.create_study(space=small_cnn, estimator="params", direction="minimize",
                           storage=storage, study_name="s", disable_plugins=["mlflow"])
    with pytest.raises(PluginNotAllowedError, match="search space 'tests.spaces."
                                                    "test_define_by_run:small_cnn'|"
                                                    "search space 'test_define_by_run"):
        frugalnas.load_study(study_name="s", storage=storage, disable_plugins=["mlflow"])
    monkeypatch.setenv("FRUGALNAS_PLUGINS_ALLOW", __name__.split(".")[0])
    study = frugalnas.load_study(study_name="s", storage=storage, disable_plugins=["mlflow"])
    assert study.space.name == "small_cnn"


def test_a_builder_given_to_one_study_is_not_seen_by_the_next_one():
    """Studies created without a host each get their own: a builder registered by one does
    not reach another, nor the public convenience functions."""
    first = frugalnas.create_study(space=small_cnn, estimator="params", direction="minimize")
    second = frugalnas.create_study(space="nb201", space_options={"N": 1, "C": 4},
                                    estimator="params", direction="minimize")
    assert first.host is not second.host
    assert first.config.space in first.host.given_spaces
    assert not second.host.given_spaces and not frugalnas.get_host().given_spaces
    assert frugalnas.get_host() is not frugalnas.get_host()
