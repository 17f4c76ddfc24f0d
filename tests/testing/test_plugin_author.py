"""What a new plugin author meets when following docs/plugins.md: the strategy example, the
conformance suite on a plugin's proxy and strategy, the errors and listings of the command
line, and the documentation of hooks and datasets kept in step with the code."""

import importlib.util
import inspect
import json
import re
import types
from pathlib import Path

import pytest
import torch

import frugalnas
import frugalnas.proxies
import frugalnas.proxies.checks
from frugalnas import UnknownComponentError
from frugalnas.host import hookspecs
from frugalnas.cli.main import main
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies import Proxy
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.strategies.random import RandomArchSampler
from frugalnas.testing import check_component, check_proxy, check_strategy, component_checks

#: pytest's own fixture for running a test file in-process, as a plugin author's suite runs.
pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[2]
PLUGINS_MD = ROOT / "docs" / "plugins.md"
DATASETS_MD = ROOT / "docs" / "datasets.md"
EXAMPLE = ROOT / "examples" / "plugin_hello" / "frugalnas_hello" / "__init__.py"


def section(text: str, heading: str) -> str:
    """The lines of ``text`` from the markdown heading ``heading`` to the next heading of the
    same or a higher level."""
    level = heading.split(" ")[0]
    lines = text.splitlines()
    start = lines.index(heading)
    out = []
    for line in lines[start + 1:]:
        mark = line.split(" ")[0]
        if mark and set(mark) == {"#"} and len(mark) <= len(level):
            break
        out.append(line)
    return "\n".join(out)


def python_blocks(text: str) -> list[str]:
    return re.findall(r"```python\n(.*?)```", text, flags=re.S)


def example_module() -> types.ModuleType:
    """The example plugin's module, loaded from its file (not installed, and not on sys.path,
    where its build metadata would make it an entry point)."""
    spec = importlib.util.spec_from_file_location("hello_example_source", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


# -- a worked strategy example -------------------------------------------------------------
def test_the_documented_strategy_runs_as_written():
    text = section(PLUGINS_MD.read_text(), "#### Writing a strategy")
    for needed in ("What the strategy is created with", "What `choose` receives",
                   "What `choose` returns", "arch.decisions", "from_params"):
        assert needed in text
    code = next(b for b in python_blocks(text) if "frugalnas_strategies" in b)
    module = types.ModuleType("author_strategy")
    exec(compile(code, "docs/plugins.md", "exec"), module.__dict__)
    host = PluginHost([module], autoload=False)
    strategies = host.registry("strategies")
    (name,) = [n for n in strategies if strategies.get(n).plugin == "author_strategy"]
    ran = check_component(host, "strategies", name)
    assert ran[-2:] == ["check_propose", "check_unknown_option_is_rejected"]
    with pytest.raises(frugalnas.ConfigError, match=r"invalid explore 2.*\[0, 1\]"):
        host.create("strategies", name, space=NB201Space(N=1, C=4), explore=2)


def test_the_example_plugin_registers_a_strategy_that_passes_every_check():
    module = example_module()
    host = PluginHost([module], autoload=False)
    assert host.registry("strategies").get("hello-climb").plugin == "hello_example_source"
    cases = {c.id: c for c in component_checks(host, ["strategies"],
                                               plugins=["hello_example_source"])}
    assert set(cases) == {f"strategies:hello-climb:{check}" for check in (
        "check_is_sampler", "check_proposals", "check_reproducible", "check_propose",
        "check_unknown_option_is_rejected")}
    for case in cases.values():
        case()


# -- the propose check runs wherever it can, and a skip says which check and why -----------
def test_the_propose_check_runs_for_a_sampler_object():
    space = NB201Space(N=1, C=4)
    ran = check_strategy(RandomArchSampler(space), space, n_trials=3)
    assert ran == ["check_is_sampler", "check_proposals", "check_propose"]


def test_a_skipped_check_is_reported_with_its_case_and_reason(pytester):
    pytester.makepyfile(test_author="""
        from frugalnas import PluginHost
        from frugalnas.testing import parametrize_with_checks

        @parametrize_with_checks(PluginHost(autoload=False), ["strategies"], names=["tpe"])
        def test_conforms(check):
            check()
    """)
    result = pytester.runpytest_inprocess("-q", "-rs", "-k", "check_propose")
    result.assert_outcomes(skipped=1)
    (line,) = [ln for ln in result.outlines if ln.startswith("SKIPPED")]
    assert line.startswith("SKIPPED [1] test_author.py:")  # the author's test, not pytest's
    assert "strategies:tpe:check_propose: TPESampler has no propose(study, trial, k)" in line


# -- a plugin's proxy is its estimator too, with nothing more to do ------------------------
class Spread(Proxy):
    """Spread of the untrained network's logits."""

    name = "author-spread"
    needs_data = False
    needs_labels = False

    def __init__(self, seed: int = 0):
        self.seed = seed

    def compute(self, model, inputs, targets):
        with torch.no_grad():
            return float(model(torch.ones_like(inputs)).std())


class ProxyPlugin:
    @frugalnas.hookimpl
    def frugalnas_proxies(self):
        return {"author-spread": Spread}


def test_a_plugin_proxy_is_checked_and_listed_as_its_estimator():
    host = PluginHost([ProxyPlugin()], autoload=False)
    assert host.estimators().get("author-spread").plugin == "ProxyPlugin"
    assert host.estimators().get("synflow").plugin == "proxies"
    ids = {c.id for c in component_checks(host, plugins=["ProxyPlugin"])}
    assert "proxies:author-spread:check_proxy_contract" in ids
    assert "estimators:author-spread:check_evaluate" in ids
    case = next(c for c in component_checks(host, ["estimators"], plugins=["ProxyPlugin"])
                if c.check == "check_declarations")
    case()


# -- one public check_proxy, whose result is documented ------------------------------------
def test_check_proxy_is_one_public_function_returning_documented_rule_names():
    assert not hasattr(frugalnas.proxies, "check_proxy")
    assert not hasattr(frugalnas.proxies.checks, "check_proxy")
    ran = check_proxy(Spread())
    assert ran == ["declares-needs", "init-params", "scores", "finite-float", "no-mutation",
                   "deterministic", "labels-optional", "data-free"]
    text = section(PLUGINS_MD.read_text(), "## Testing a plugin")
    assert all(f"`{rule}`" in text for rule in ran)


# -- an unknown name says which blocked plugin registers it --------------------------------
def test_an_unknown_name_names_the_blocked_plugin():
    with pytest.raises(UnknownComponentError) as info:
        PluginHost(["no:random"], autoload=False).create("strategies", "random")
    assert "(plugin 'random' is blocked by -p no:random, which registers it)" in str(info.value)
    with pytest.raises(UnknownComponentError,
                       match=r"plugin 'proxies' is blocked by -p no:proxies, which registers"):
        PluginHost(disable_plugins=["proxies"], autoload=False).create_estimator("synflow", {})
    with pytest.raises(UnknownComponentError) as info:
        PluginHost(["no:myplug", "no:mlflow"], autoload=False).create_estimator("hello-score",
                                                                               {})
    message = str(info.value)
    assert message.startswith("unknown estimator 'hello-score'; registered estimator: ")
    # a third-party plugin is not imported to ask; mlflow, asked, registers no estimators
    assert message.endswith("(plugin 'myplug' is blocked by -p no:myplug and may register it)")
    with pytest.raises(UnknownComponentError) as info:
        PluginHost(autoload=False).create("strategies", "rando")
    assert "blocked" not in str(info.value)


def test_the_command_line_says_the_plugin_is_blocked(capsys):
    assert main(["run", "--dry-run", "-p", "no:proxies", "--estimator", "synflow",
                 "--no-tracking"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("frugalnas: error: unknown estimator 'synflow'")
    assert err.endswith("(plugin 'proxies' is blocked by -p no:proxies, which registers it)")


# -- frugalnas plugins -v / --json show options --------------------------------------------
def test_plugins_verbose_lists_options_with_defaults(capsys):
    assert main(["plugins", "-v"]) == 0
    out = capsys.readouterr().out.splitlines()
    at = next(i for i, line in enumerate(out) if line.startswith("  image-folder "))
    block = [line.strip() for line in out[at + 1:at + 6]]
    assert block == ["path (required)", "valid_fraction = 0.2", "size = 32",
                     "grayscale = False", "test_fraction = None"]
    listed = out.index(next(line for line in out if line.startswith("strategies (")))
    at = next(i for i, line in enumerate(out) if i > listed and line.startswith("  random "))
    assert out[at + 1].strip() == "warm_start_proxy = None"  # space and seed are the study's
    assert main(["plugins", "--verbose"]) == 0
    assert capsys.readouterr().out.splitlines() == out
    assert main(["plugins"]) == 0
    assert "path (required)" not in capsys.readouterr().out


def test_plugins_json_includes_options(capsys):
    assert main(["plugins", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    folder = next(c for c in data["components"]["datasets"] if c["name"] == "image-folder")
    options = {o["name"]: o for o in folder["options"]}
    assert options["path"] == {"name": "path", "required": True, "default": None}
    assert options["size"] == {"name": "size", "required": False, "default": 32}
    assert "seed" not in options and folder["accepts_any_option"] is False


def test_plugins_verbose_is_documented():
    assert "frugalnas plugins -v" in PLUGINS_MD.read_text()
    cli = (ROOT / "docs" / "cli.md").read_text()
    assert "`-v` (`--verbose`)" in cli and "`--json`" in cli


# -- the hook table lists every hook -------------------------------------------------------
def test_the_hook_tables_list_every_hookspec():
    documented = set(re.findall(r"^\| `(frugalnas_\w+)\(", PLUGINS_MD.read_text(), flags=re.M))
    specs = {name for name, f in inspect.getmembers(hookspecs, inspect.isfunction)
             if name.startswith("frugalnas_") and hasattr(f, "frugalnas_spec")}
    assert "frugalnas_pruners" in specs
    assert sorted(specs - documented) == []


# -- every built-in dataset's options are documented ---------------------------------------
def test_every_builtin_dataset_option_is_documented_with_its_default():
    text = DATASETS_MD.read_text()
    registry = PluginHost(autoload=False).registry("datasets")
    assert registry.names()
    for name in registry:
        rows = {}
        for line in section(text, f"## `{name}`").splitlines():
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if line.startswith("| `") and len(cells) >= 3:
                rows[cells[0].strip("`")] = cells[1]
        for option, default in registry.get(name).user_options().items():
            assert option in rows, f"dataset {name!r}: option {option!r} is not documented"
            expected = "required" if default is inspect.Parameter.empty else f"`{default!r}`"
            assert rows[option] == expected, (name, option, rows[option])
    assert "datasets.md" in PLUGINS_MD.read_text() and \
        "datasets.md" in (ROOT / "docs" / "cli.md").read_text()


def test_the_plugin_guide_and_the_example_plugin_use_only_the_top_package():
    """A plugin author needs nothing from a module whose path names an internal layer: the
    guide and the example plugin name only ``frugalnas.NAME`` (every one exported) and the
    conformance kit ``frugalnas.testing``."""
    import re

    import frugalnas

    repo = Path(__file__).resolve().parents[2]
    texts = {"docs/plugins.md": (repo / "docs" / "plugins.md").read_text()}
    for path in (repo / "examples" / "plugin_hello").rglob("*.py"):
        if "build" not in path.parts:
            texts[str(path.relative_to(repo))] = path.read_text()
    deep, unknown = [], []
    for where, text in texts.items():
        deep += [f"{where}: {m}" for m in re.findall(r"\bfrugalnas\.([a-z_]+)\.\w+", text)
                 if m != "testing"]
        deep += [f"{where}: from frugalnas.{m}" for m in
                 re.findall(r"from frugalnas\.(\w+)", text) if m != "testing"]
        unknown += [f"{where}: frugalnas.{n}" for n in re.findall(r"\bfrugalnas\.([A-Za-z_]\w*)\b",
                                                                  text)
                    if n not in frugalnas.__all__ and n not in ("testing", "hookimpl")
                    and not (repo / "frugalnas" / n).exists()]
    assert not deep, deep
    assert not unknown, unknown
