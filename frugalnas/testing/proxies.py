"""The proxy checks of the conformance suite (the rules live in
:mod:`frugalnas.proxies.checks`)."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import PluginHost
from frugalnas.proxies.checks import RULES, ProxyCheckError
from frugalnas.proxies.checks import _run_rules as _check_proxy_rules
from frugalnas.testing._suite import Suite, describe
from frugalnas.testing.errors import ConformanceError


class ProxyConformanceError(ConformanceError, ProxyCheckError):
    """A proxy broke the proxy contract (catch it as either base class)."""

    def __init__(self, subject: str, check: str, detail: str, rule: str = ""):
        ConformanceError.__init__(self, subject, check, detail)
        self.rule = rule


class ProxyChecks(Suite):
    """The proxy contract: declares ``needs_data``/``needs_labels``; every ``__init__``
    parameter has a default and is stored under its name (so ``get_params`` rebuilds it);
    ``score`` gives a finite float on a typical and on a dead NB201 network, in training and
    evaluation mode, leaves the network as it was (weights, buffers, gradients,
    ``requires_grad``, modes), gives the same value twice and for a rebuilt proxy on a rebuilt
    network; without labels when ``needs_labels`` is false, and the same value for other
    inputs of the same shape when ``needs_data`` is false."""

    kind = "proxies"
    checks = ("check_proxy_contract",)

    def __init__(self, proxy: Any, *, name: str | None = None):
        self.proxy = proxy
        self.subject = describe("proxy", proxy, name)
        self.passed: list[str] = []

    def check_proxy_contract(self) -> None:
        try:
            self.passed = _check_proxy_rules(self.proxy)
        except ProxyCheckError as exc:
            raise ProxyConformanceError(self.subject, "check_proxy_contract",
                                        f"rule {exc.rule!r}: {exc.detail}" if exc.rule
                                        else str(exc), exc.rule) from exc


def check_proxy(proxy: Any, host: Any = None) -> list[str]:
    """Run the proxy checks on ``proxy`` (a :class:`frugalnas.proxies.Proxy`, or the name of
    one registered in ``host``, default: a host with every installed plugin). Returns the
    names of the rules it checked, all passed, in this order: ``declares-needs``,
    ``init-params``, ``scores``, ``finite-float``, ``no-mutation``, ``deterministic``, then
    ``labels-optional`` (only for ``needs_labels=False``) and ``data-free`` (only for
    ``needs_data=False``); see ``RULES``. Raises :class:`ProxyConformanceError` (a
    ``ConformanceError`` and a ``ProxyCheckError``, whose ``rule`` is the rule's name) at the
    first broken one."""
    if isinstance(proxy, str):
        if host is None:
            host = PluginHost()  # a fresh host of the installed plugins, not a shared one
        proxy = host.create("proxies", proxy)
    suite = ProxyChecks(proxy)
    suite.run()
    return suite.passed
