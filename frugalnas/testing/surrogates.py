"""The surrogate checks of the conformance suite (the rules live in
:mod:`frugalnas.surrogates.checks`)."""

from __future__ import annotations

from typing import Any

from frugalnas.host.plugins import PluginHost
from frugalnas.surrogates.checks import SurrogateCheckError
from frugalnas.surrogates.checks import check_surrogate as _check_surrogate_rules
from frugalnas.testing._suite import Suite, describe
from frugalnas.testing.errors import ConformanceError


class SurrogateConformanceError(ConformanceError, SurrogateCheckError):
    """A surrogate broke the surrogate contract (catch it as either base class)."""

    def __init__(self, subject: str, check: str, detail: str, rule: str = ""):
        ConformanceError.__init__(self, subject, check, detail)
        self.rule = rule


class SurrogateChecks(Suite):
    """The surrogate contract (scikit-learn's conventions): parameters only in ``__init__``,
    stored unchanged (``get_params``/``clone`` round trip); ``predict`` before ``fit`` raises an
    error that says to fit; ``fit(X, y)`` returns ``self``; ``predict(X)`` returns finite
    ``(mean, std)`` arrays of shape ``(n,)`` with ``std >= 0``; the same parameters and data
    give the same predictions; held-out samples of an easy problem are ranked better than
    chance."""

    kind = "surrogates"
    checks = ("check_surrogate_contract",)

    def __init__(self, surrogate: Any, *, name: str | None = None):
        self.surrogate = surrogate
        self.subject = describe("surrogate", surrogate, name)

    def check_surrogate_contract(self) -> None:
        try:
            _check_surrogate_rules(self.surrogate)
        except SurrogateCheckError as exc:
            raise SurrogateConformanceError(self.subject, "check_surrogate_contract",
                                            f"rule {exc.check!r}: {exc.detail}" if exc.check
                                            else str(exc), exc.check) from exc


def check_surrogate(surrogate: Any, host: Any = None) -> list[str]:
    """Run the surrogate checks on ``surrogate`` (an instance, a class or factory called
    without arguments, or the name of one registered in ``host``); returns the names of the
    checks run, raises :class:`SurrogateConformanceError` (a ``ConformanceError`` and a
    ``SurrogateCheckError``) at the first broken rule."""
    if isinstance(surrogate, str):
        if host is None:
            host = PluginHost()  # a fresh host of the installed plugins, not a shared one
        name, surrogate = surrogate, host.create("surrogates", surrogate)
        return SurrogateChecks(surrogate, name=name).run()
    return SurrogateChecks(surrogate).run()
