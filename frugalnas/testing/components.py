"""Checking registered components by name: :func:`check_component` for one,
:func:`component_checks` for a list of ``(component, check)`` cases and
:func:`parametrize_with_checks` to make them pytest cases."""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any, NoReturn

from frugalnas.host.kinds import KINDS
from frugalnas.host.plugins import PluginHost
from frugalnas.testing._suite import SkipCheck, Suite
from frugalnas.testing.backends import BackendChecks
from frugalnas.testing.datasets import DatasetChecks
from frugalnas.testing.errors import ConformanceError
from frugalnas.testing.estimators import EstimatorChecks
from frugalnas.testing.launchers import LauncherChecks
from frugalnas.testing.options import (check_unknown_option_is_rejected, component_of,
                                       create)
from frugalnas.testing.proxies import ProxyChecks
from frugalnas.testing.pruners import PrunerChecks
from frugalnas.testing.setups import CheckSetup, setup_for
from frugalnas.testing.spaces import SearchSpaceChecks
from frugalnas.testing.strategies import StrategyChecks, make_study
from frugalnas.testing.surrogates import SurrogateChecks

OPTION_CHECK = "check_unknown_option_is_rejected"

#: The suite of checks of each kind.
_SUITES: dict[str, type[Suite]] = {
    "search_spaces": SearchSpaceChecks,
    "estimators": EstimatorChecks,
    "strategies": StrategyChecks,
    "backends": BackendChecks,
    "datasets": DatasetChecks,
    "proxies": ProxyChecks,
    "surrogates": SurrogateChecks,
    "pruners": PrunerChecks,
    "launchers": LauncherChecks,
}


def _suite_class(kind: str) -> type[Suite]:
    if kind not in _SUITES:
        raise ValueError(f"unknown component kind {kind!r}; valid: {', '.join(KINDS)}")
    return _SUITES[kind]


def checks_of(kind: str) -> tuple[str, ...]:
    """The names of the checks a component of ``kind`` must pass, in the order they run."""
    return (*_suite_class(kind).checks, OPTION_CHECK)


def build_suite(host: Any, kind: str, name: str, setup: CheckSetup | None = None) -> Suite:
    """The checks of kind ``kind`` for a freshly created component ``name`` of ``host``,
    created with ``setup`` (default: :func:`~frugalnas.testing.setups.setup_for`)."""
    setup = setup or setup_for(kind, name)
    component = component_of(host, kind, name)
    options = setup.resolved_options()
    cls = _suite_class(kind)
    if kind == "strategies":
        return cls(name, setup.space, host=host, n_trials=setup.n_trials,
                   strategy_options=options, space_options=setup.space_options,
                   estimator=setup.estimator, estimator_options=setup.estimator_options,
                   dataset=setup.dataset, dataset_options=setup.dataset_options)
    if kind == "datasets":
        return cls(lambda seed: host.create("datasets", name, seed=seed, **options), name=name)
    if kind == "estimators" and setup.strategy is not None:
        def study() -> Any:
            return make_study(host, space=setup.space, space_options=setup.space_options,
                              strategy=setup.strategy, strategy_options=setup.strategy_options,
                              estimator=name, estimator_options=options, dataset=setup.dataset,
                              dataset_options=setup.dataset_options)

        return cls(None, name=name, study=study)
    try:
        obj = create(host, kind, name, options)
    except Exception as exc:
        raise ConformanceError(f"{component.kind} {name!r}", "creation",
                               f"could not be created with options {options}: "
                               f"{type(exc).__name__}: {exc}") from exc
    if kind == "estimators":
        space = host.create("search_spaces", setup.space, **setup.resolved_space_options())
        dataset = host.create("datasets", setup.dataset, seed=0, **setup.dataset_options)
        return cls(obj, space, name=name, dataset=dataset,
                   fresh=lambda: host.create_estimator(name, options))
    return cls(obj, name=name, **setup.check_options)


def run_check(host: Any, kind: str, name: str, check: str,
              setup: CheckSetup | None = None) -> None:
    """Run one check on a fresh component ``name`` of ``kind``."""
    setup = setup or setup_for(kind, name)
    if check in setup.skip:
        raise SkipCheck(setup.skip_reason or f"{check} does not apply to {kind} {name!r}")
    if check == OPTION_CHECK:
        check_unknown_option_is_rejected(host, kind, name, setup.resolved_options())
        return
    suite = build_suite(host, kind, name, setup)
    try:
        suite.run_check(check)
    finally:
        suite.teardown()


def check_component(host: Any, kind: str, name: str, *, setup: CheckSetup | None = None,
                    setups: Mapping[tuple[str, str], CheckSetup] | None = None,
                    checks: Iterable[str] | None = None) -> list[str]:
    """Create the registered component ``name`` of ``kind`` (``"search_spaces"``,
    ``"estimators"``, ``"strategies"``, ``"backends"``, ``"proxies"``, ``"surrogates"``,
    ``"datasets"``) from ``host`` and run every check of its kind (or ``checks``), plus
    :func:`~frugalnas.testing.check_unknown_option_is_rejected`. Returns the names of the
    checks run (not skipped); raises :class:`ConformanceError` at the first failure. ``setup``
    (or ``setups[(kind, name)]``) says how to create and exercise it."""
    setup = setup or setup_for(kind, name, setups)
    ran = []
    for check in checks or checks_of(kind):
        try:
            run_check(host, kind, name, check, setup)
        except SkipCheck:
            continue
        ran.append(check)
    return ran


@dataclass(frozen=True)
class ComponentCheck:
    """One check of one registered component; call it to run it. ``id`` is
    ``KIND:NAME:CHECK``, e.g. ``strategies:random:check_proposals``."""

    host: Any
    kind: str
    name: str
    check: str
    setup: CheckSetup

    @property
    def id(self) -> str:
        return f"{self.kind}:{self.name}:{self.check}"

    def __call__(self) -> None:
        """Run the check. A check that does not apply is a pytest skip whose reason names the
        case and why (``strategies:tpe:check_propose: TPESampler has no propose(...)``),
        reported at the test that called it."""
        try:
            run_check(self.host, self.kind, self.name, self.check, self.setup)
        except SkipCheck as exc:
            skip_case(self.id, str(exc))

    def __repr__(self) -> str:
        return self.id


def skip_case(case_id: str, reason: str) -> NoReturn:
    """Skip the running pytest test as ``CASE_ID: reason``, located at the test itself rather
    than inside pytest or frugalnas; outside pytest, raise :data:`SkipCheck` with that text."""
    message = f"{case_id}: {reason or 'does not apply'}"
    try:
        import pytest
    except ImportError:  # pragma: no cover - pytest is how the cases are meant to run
        raise SkipCheck(message) from None
    try:
        # The keyword pytest uses for its own skip marks: report at the test item's location.
        error = pytest.skip.Exception(message, _use_item_location=True)
    except TypeError:  # a pytest without it: the location is this line, the reason is right
        error = pytest.skip.Exception(message)
    raise error


def component_checks(host: Any = None, kinds: Iterable[str] | None = None, *,
                     plugins: Iterable[str] | None = None, names: Iterable[str] | None = None,
                     setups: Mapping[tuple[str, str], CheckSetup] | None = None
                     ) -> list[ComponentCheck]:
    """Every ``(component, check)`` case of ``host`` (default: a host with every installed
    plugin): of the given ``kinds`` (default: all), of components registered by ``plugins``
    (default: any) and named in ``names`` (default: all). Estimators include the derived
    ones (one per proxy), which belong to the plugin that registered their proxy: a plugin's
    proxy is checked as a proxy and as an estimator."""
    host = host if host is not None else PluginHost()
    plugins = set(plugins) if plugins is not None else None
    names = set(names) if names is not None else None
    out = []
    for kind in kinds or KINDS:
        if kind not in KINDS:
            raise ValueError(f"unknown component kind {kind!r}; valid: {', '.join(KINDS)}")
        registry = host.estimators() if kind == "estimators" else host.registry(kind)
        for name in registry:
            if plugins is not None and registry.get(name).plugin not in plugins:
                continue
            if names is not None and name not in names:
                continue
            setup = setup_for(kind, name, setups)
            out += [ComponentCheck(host, kind, name, check, setup) for check in checks_of(kind)]
    return out


def parametrize_with_checks(host: Any = None, kinds: Iterable[str] | None = None, *,
                            plugins: Iterable[str] | None = None,
                            names: Iterable[str] | None = None,
                            setups: Mapping[tuple[str, str], CheckSetup] | None = None,
                            expected_failures: Mapping[str, str] | None = None,
                            argname: str = "check") -> Any:
    """A ``pytest.mark.parametrize`` over :func:`component_checks`: the test receives a
    :class:`ComponentCheck` as ``argname`` and calls it. Case ids are ``KIND:NAME:CHECK``.
    ``expected_failures`` maps an id (or ``KIND:NAME`` for all its checks) to the reason; such
    cases are ``xfail(strict=True)``, so they fail once fixed. Components whose setup is
    ``slow`` get ``pytest.mark.slow``::

        @parametrize_with_checks(PluginHost(), plugins=["my-plugin"])
        def test_conformance(check):
            check()
    """
    import pytest

    cases = component_checks(host, kinds, plugins=plugins, names=names, setups=setups)
    expected = dict(expected_failures or {})
    used: set[str] = set()
    params = []
    for case in cases:
        marks = [pytest.mark.slow] if case.setup.slow else []
        for key in (case.id, f"{case.kind}:{case.name}"):
            if key in expected:
                used.add(key)
                marks.append(pytest.mark.xfail(strict=True, raises=AssertionError,
                                               reason=expected[key]))
                break
        params.append(pytest.param(case, id=case.id, marks=marks))
    unknown = sorted(set(expected) - used)
    if unknown:
        raise ValueError(f"expected_failures names no case: {unknown}; ids look like "
                         "'strategies:random:check_proposals' or 'strategies:random'")
    return pytest.mark.parametrize(argname, params)
