"""What every kind's checks share: a suite of named checks run one by one, each failure a
:class:`ConformanceError` that names the component, the check and the broken rule."""

from __future__ import annotations

import contextlib
import math
import unittest
import weakref
from collections.abc import Iterator
from typing import Any, ClassVar, NoReturn

from frugalnas.host.plugins import PluginHost
from frugalnas.testing.errors import ConformanceError

#: Raised by a check that does not apply to a component (pytest reports it as skipped).
SkipCheck = unittest.SkipTest


@contextlib.contextmanager
def check_environment() -> Iterator[None]:
    """Run torch on one thread (the checks' networks are tiny, and on a busy machine several
    threads per tiny operation cost more than they bring) and keep optuna's per-study info
    messages quiet; both are restored afterwards."""
    import optuna
    import torch

    threads, verbosity = torch.get_num_threads(), optuna.logging.get_verbosity()
    torch.set_num_threads(1)
    optuna.logging.set_verbosity(max(verbosity, optuna.logging.WARNING))
    try:
        yield
    finally:
        torch.set_num_threads(threads)
        optuna.logging.set_verbosity(verbosity)


def describe(kind: str, obj: Any, name: str | None = None) -> str:
    """``strategy 'random' (RandomArchSampler)``: how messages name a component."""
    name = name or getattr(obj, "name", None)
    cls = type(obj).__name__
    return f"{kind} {name!r} ({cls})" if isinstance(name, str) and name else f"{kind} {cls}"


def is_number(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool)


def close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-6, abs_tol=1e-9)


class Suite:
    """The checks of one kind for one component. Subclasses list their check methods in
    ``checks``; :meth:`run_check` runs one, turning any unexpected exception into a
    :class:`ConformanceError`."""

    kind: ClassVar[str] = "component"
    checks: ClassVar[tuple[str, ...]] = ()
    subject: str = "component"

    def fail(self, detail: str) -> NoReturn:
        raise ConformanceError(self.subject, self._current, detail)

    _current: str = "check"

    def run_check(self, name: str) -> None:
        if name not in self.checks:
            raise ValueError(f"unknown check {name!r} for {self.kind}; valid: "
                             f"{', '.join(self.checks)}")
        self._current = name
        with check_environment():
            try:
                getattr(self, name)()
            except (ConformanceError, SkipCheck):
                raise
            except AssertionError as exc:  # a check of another module (proxy, surrogate)
                raise ConformanceError(self.subject, name, str(exc)) from exc
            except Exception as exc:
                raise ConformanceError(self.subject, name,
                                       f"raised {type(exc).__name__}: {exc}") from exc

    def run(self, checks: tuple[str, ...] | list[str] | None = None) -> list[str]:
        """Run ``checks`` (default: all) in order; return the names of those that ran (not
        skipped). Raises at the first failure."""
        ran = []
        try:
            for name in checks or self.checks:
                try:
                    self.run_check(name)
                except SkipCheck:
                    continue
                ran.append(name)
        finally:
            self.teardown()
        return ran

    def teardown(self) -> None:
        """Release what the component holds (a backend's processes)."""


#: Plugins the checks' throwaway studies run without: nothing to track, nothing to show.
QUIET_PLUGINS = ("mlflow", "progress")
#: The quiet host made for each host, kept while that host lives.
_QUIET_HOSTS: weakref.WeakKeyDictionary[Any, Any] = weakref.WeakKeyDictionary()


def quiet_host(host: Any = None) -> Any:
    """``host`` (default: a new host of every installed plugin) without the tracking and
    progress plugins, for the studies the checks create; plugins given to ``host`` as objects
    are kept."""
    if host is None:
        host = PluginHost()  # a fresh host of the installed plugins, not a shared one
    if not any(host.has_plugin(p) for p in QUIET_PLUGINS):
        return host
    if host not in _QUIET_HOSTS:
        objects = [host.pm.get_plugin(name) for name, info in host.infos.items()
                   if info.source == "explicit" and name not in host.named_plugins]
        _QUIET_HOSTS[host] = PluginHost([*host.named_plugins, *objects],
                                        disable_plugins={*host.blocked, *QUIET_PLUGINS},
                                        autoload=host.autoload)
    return _QUIET_HOSTS[host]
