import sys
import textwrap

import pytest

import frugalnas
from frugalnas import DuplicateComponentError, PluginError, UnknownComponentError
from frugalnas.host.plugins import BUILTIN_PLUGINS, PluginHost


@pytest.fixture
def plugin_dir(tmp_path, monkeypatch):
    """A folder on sys.path where tests write plugin modules."""
    monkeypatch.syspath_prepend(str(tmp_path))
    yield tmp_path
    for name in [m for m in sys.modules if m.startswith("tp_")]:
        del sys.modules[name]


def write(plugin_dir, name, body):
    (plugin_dir / f"{name}.py").write_text(textwrap.dedent(body))
    return name


def test_builtins_are_plugins_like_any_other():
    host = PluginHost()
    for name in BUILTIN_PLUGINS:
        assert host.has_plugin(name)
        assert host.infos[name].source == "builtin"
    assert host.registry("strategies").get("random").plugin == "random"
    assert host.registry("search_spaces").get("nb201").plugin == "nb201"


def test_block_a_builtin():
    host = PluginHost(["no:random"])
    assert "random" not in host.registry("strategies")
    assert not host.has_plugin("random")
    host2 = PluginHost(disable_plugins=["mlflow"])
    assert not host2.has_plugin("mlflow")


def test_add_a_plugin_by_module_name(plugin_dir):
    write(plugin_dir, "tp_extra", """
        import frugalnas
        import optuna
        @frugalnas.hookimpl
        def frugalnas_strategies():
            return {"also-random": lambda space=None, seed=0: optuna.samplers.RandomSampler(seed=seed)}
    """)
    host = PluginHost(["tp_extra"])
    comp = host.registry("strategies").get("also-random")
    assert comp.plugin == "tp_extra"
    assert host.infos["tp_extra"].source == "explicit"


def test_duplicate_component_names_both_plugins(plugin_dir):
    write(plugin_dir, "tp_dup", """
        import frugalnas
        @frugalnas.hookimpl
        def frugalnas_strategies():
            return {"random": lambda space=None, seed=0: None}
    """)
    host = PluginHost(["tp_dup"])
    with pytest.raises(DuplicateComponentError) as info:
        host.registry("strategies")
    assert "'random'" in str(info.value) and "'tp_dup'" in str(info.value)


def test_bad_hook_signature_is_rejected_at_registration(plugin_dir):
    write(plugin_dir, "tp_badsig", """
        import frugalnas
        @frugalnas.hookimpl
        def frugalnas_trial_started(study, trial, architecture, surprise):
            pass
    """)
    with pytest.raises(PluginError) as info:
        PluginHost(["tp_badsig"])
    assert "'tp_badsig'" in str(info.value) and "surprise" in str(info.value)


def test_unknown_hook_name_is_rejected(plugin_dir):
    write(plugin_dir, "tp_typo", """
        import frugalnas
        @frugalnas.hookimpl
        def frugalnas_strategys():
            return {}
    """)
    with pytest.raises(PluginError, match="tp_typo.*frugalnas_strategys"):
        PluginHost(["tp_typo"])


def test_an_unmarked_hook_is_a_hook_and_an_unmarked_typo_is_refused(plugin_dir):
    # as pytest takes an unmarked pytest_* function, the marker is not needed
    write(plugin_dir, "tp_unmarked", """
        from frugalnas.strategies.base import strategy_factory
        from frugalnas.strategies.random import RandomArchSampler

        def frugalnas_strategies():
            return {"unmarked-random": strategy_factory(RandomArchSampler)}

        class Events:
            seen = []

            def frugalnas_study_started(self, study):
                self.seen.append(study.name)

        def helper_not_a_hook():
            return 1
    """)
    host = PluginHost(["tp_unmarked"])
    assert host.registry("strategies").get("unmarked-random").plugin == "tp_unmarked"
    events = sys.modules["tp_unmarked"].Events()
    study = frugalnas.create_study(plugins=[events], strategy="random",
                                   disable_plugins=["mlflow", "progress"], study_name="um")
    study.optimize(n_trials=1)
    assert events.seen == ["um"]
    # a misspelt, unmarked name is refused, naming it (and the hook it may mean)
    write(plugin_dir, "tp_unmarked_typo", """
        def frugalnas_strategys():
            return {}
    """)
    with pytest.raises(PluginError) as info:
        PluginHost(["tp_unmarked_typo"])
    assert "'tp_unmarked_typo'" in str(info.value)
    assert "frugalnas_strategys (did you mean frugalnas_strategies?)" in str(info.value)


def test_plugin_that_fails_to_import(plugin_dir):
    write(plugin_dir, "tp_broken", "import not_a_real_module_xyz\n")
    with pytest.raises(PluginError, match="'tp_broken' failed to import.*not_a_real_module_xyz"):
        PluginHost(["tp_broken"])
    with pytest.raises(PluginError, match="'tp_missing_mod'"):
        PluginHost(["tp_missing_mod"])


def test_registry_must_return_a_dict(plugin_dir):
    write(plugin_dir, "tp_list", """
        import frugalnas
        @frugalnas.hookimpl
        def frugalnas_backends():
            return ["oops"]
    """)
    host = PluginHost(["tp_list"])
    with pytest.raises(PluginError, match="tp_list.*must return a dict"):
        host.registry("backends")


def test_unknown_component_lists_valid_names():
    host = PluginHost()
    with pytest.raises(UnknownComponentError) as info:
        host.create("strategies", "no-such-strategy")
    msg = str(info.value)
    assert "'no-such-strategy'" in msg and "random" in msg
    with pytest.raises(PluginError, match="valid kinds"):
        host.registry("widgets")


def test_unknown_option_lists_valid_options():
    with pytest.raises(frugalnas.ConfigError, match="'widht'.*valid options: C, N"):
        PluginHost().create("search_spaces", "nb201", widht=3)


def test_lifecycle_hooks_are_called_in_order(plugin_dir):
    write(plugin_dir, "tp_events", """
        import frugalnas
        EVENTS = []
        @frugalnas.hookimpl
        def frugalnas_study_started(study):
            EVENTS.append("study_started")
        @frugalnas.hookimpl
        def frugalnas_trial_started(study, trial, architecture):
            EVENTS.append(f"trial_started {trial.number}")
        @frugalnas.hookimpl
        def frugalnas_trial_finished(study, report):
            EVENTS.append(f"trial_finished {report.number} {report.state.name} "
                          f"{report.cost.epochs}")
        @frugalnas.hookimpl
        def frugalnas_study_finished(study):
            EVENTS.append("study_finished")
    """)
    study = frugalnas.create_study(plugins=["tp_events"], disable_plugins=["mlflow"])
    study.optimize(n_trials=2)
    events = sys.modules["tp_events"].EVENTS
    assert events == ["study_started", "trial_started 0", "trial_finished 0 COMPLETE 200.0",
                      "trial_started 1", "trial_finished 1 COMPLETE 200.0", "study_finished"]


def test_autoload_switch_and_allow_list(monkeypatch):
    # with autoload off only built-ins (and -p names) load; the example plugin, when installed,
    # is covered in test_example_plugin.py
    monkeypatch.setenv("FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD", "1")
    host = PluginHost()
    assert all(info.source == "builtin" for info in host.infos.values())
    monkeypatch.delenv("FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD")
    monkeypatch.setenv("FRUGALNAS_PLUGINS_ALLOW", "nothing-allowed")
    host = PluginHost()
    assert all(info.source == "builtin" for info in host.infos.values())


def test_a_kind_creates_its_port_type_and_refuses_a_factory_that_makes_another():
    from frugalnas.host.kinds import SEARCH_SPACES, STRATEGIES
    from frugalnas.ports.space import SearchSpace

    class NotASpace:
        pass

    class Plugin:
        @frugalnas.hookimpl
        def frugalnas_search_spaces(self):
            return {"not-a-space": NotASpace}

    host = PluginHost([Plugin()], disable_plugins=["mlflow", "progress"])
    assert isinstance(host.create(SEARCH_SPACES, "nb201", N=1, C=4), SearchSpace)
    assert isinstance(host.create("search_spaces", "nb201"), SearchSpace)
    with pytest.raises(PluginError, match=r"plugin .*: search space 'not-a-space' made a "
                                          r"NotASpace, not a frugalnas\.ports\.space\.SearchSpace"):
        host.create(SEARCH_SPACES, "not-a-space")
    with pytest.raises(PluginError, match="made a NotASpace"):
        host.create("search_spaces", "not-a-space")
    assert STRATEGIES.port_type().__name__ == "BaseSampler"
