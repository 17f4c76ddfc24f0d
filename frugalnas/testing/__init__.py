"""Testing frugalnas components: a conformance suite for every kind, and pytest fixtures.

The checks (in the spirit of scikit-learn's ``check_estimator`` / ``parametrize_with_checks``)
verify that a component keeps the contract the rest of frugalnas relies on; each raises a
:class:`ConformanceError` (an ``AssertionError``) that names the component, the check and
what went wrong. Check one object with ``check_search_space``, ``check_estimator``,
``check_strategy``, ``check_backend``, ``check_proxy``, ``check_surrogate``,
``check_dataset`` or ``check_elastic_block``; check a registered component by name with
:func:`check_component`; turn every registered component into pytest cases with
:func:`parametrize_with_checks`::

    from frugalnas import PluginHost
    from frugalnas.testing import parametrize_with_checks

    @parametrize_with_checks(PluginHost(), plugins=["my-plugin"])
    def test_conformance(check):
        check()

This module is also frugalnas's pytest plugin (entry point ``pytest11``): the fixtures
``frugalnas_host`` and ``frugalnas_study_factory`` are available in any test suite. Importing
it stays cheap: the checks (and torch) load on first use.
"""

from __future__ import annotations

import importlib
from typing import Any

from frugalnas.testing.errors import ConformanceError
from frugalnas.testing import fixtures as _fixtures
from frugalnas.testing.fixtures import fresh_mlflow_uri, frugalnas_host, frugalnas_study_factory

#: This module is frugalnas's pytest plugin: pytest calls it to register the ``slow`` mark.
pytest_configure = _fixtures.pytest_configure

#: public name -> module that defines it (imported on first access)
_LAZY = {
    "CheckSetup": "frugalnas.testing.setups",
    "BUILTIN_SETUPS": "frugalnas.testing.setups",
    "check_search_space": "frugalnas.testing.spaces",
    "check_elastic_block": "frugalnas.testing.elastic",
    "check_estimator": "frugalnas.testing.estimators",
    "check_strategy": "frugalnas.testing.strategies",
    "check_backend": "frugalnas.testing.backends",
    "check_dataset": "frugalnas.testing.datasets",
    "check_proxy": "frugalnas.testing.proxies",
    "check_surrogate": "frugalnas.testing.surrogates",
    "check_unknown_option_is_rejected": "frugalnas.testing.options",
    "check_component": "frugalnas.testing.components",
    "component_checks": "frugalnas.testing.components",
    "parametrize_with_checks": "frugalnas.testing.components",
    "ComponentCheck": "frugalnas.testing.components",
}

__all__ = ["ConformanceError", "fresh_mlflow_uri", "frugalnas_host", "frugalnas_study_factory",
           *_LAZY]


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value
