"""The option check every registered component must pass: a misspelt option is a
``ConfigError`` that names the valid options (never silently ignored, never a ``TypeError``)."""

from __future__ import annotations

import inspect
from collections.abc import Mapping
from typing import Any

from frugalnas.ports.errors import ConfigError
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.testing.errors import ConformanceError
from frugalnas.testing.setups import SMALL_NB201

#: Options a kind's callers pass themselves; a factory that checks its own options may leave
#: them out of its message.
_IMPLICIT = {"space", "seed", "host"}


def misspell(valid: list[str]) -> tuple[str, str | None]:
    """A plausible typo of one of ``valid`` (its last two letters swapped) that is not itself
    valid, and the option it misspells."""
    if not valid:
        return "unknown_option", None
    user = [v for v in valid if v not in _IMPLICIT] or valid
    for name in user:
        typo = name[:-2] + name[-1:] + name[-2:-1]
        if len(name) >= 2 and typo != name and typo not in valid:
            return typo, name
    typo = user[0] + "x"
    while typo in valid:
        typo += "x"
    return typo, user[0]


def component_of(host: Any, kind: str, name: str) -> Any:
    """The registered :class:`~frugalnas.host.registry.Component` (estimators include the
    derived ones, e.g. one per proxy)."""
    registry = host.estimators() if kind == "estimators" else host.registry(kind)
    return registry.get(name)


def create(host: Any, kind: str, name: str, options: Mapping[str, Any]) -> Any:
    """Create a registered component as a study does."""
    if kind == "estimators":
        return host.create_estimator(name, dict(options))
    return host.create(kind, name, **options)


def check_unknown_option_is_rejected(host: Any, kind: str, name: str,
                                     options: Mapping[str, Any] | None = None) -> str:
    """Create component ``name`` of ``kind`` from ``host`` with a misspelt option (plus
    ``options``, e.g. the required ones; strategies also get a ``space``) and require a
    :class:`frugalnas.ConfigError` that names the misspelt key and every valid option.
    Returns the misspelt name; raises :class:`~frugalnas.testing.ConformanceError`."""
    component = component_of(host, kind, name)
    subject = f"{component.kind} {name!r} (registered by plugin {component.plugin!r})"
    check = "check_unknown_option_is_rejected"
    valid = list(component.options())
    typo, original = misspell(valid)
    given = dict(options or {})
    if kind == "strategies" and "space" not in given:
        given["space"] = NB201Space(**SMALL_NB201)
    if kind == "datasets":
        given.setdefault("seed", 0)
    default = component.options().get(original, None) if original else None
    given[typo] = 1 if default in (None, inspect.Parameter.empty) else default
    try:
        obj = create(host, kind, name, given)
    except ConfigError as exc:
        message = str(exc)
        if typo not in message:
            raise ConformanceError(subject, check, f"the ConfigError for the misspelt option "
                                   f"{typo!r} does not name it: {message}") from exc
        unnamed = [v for v in valid if v not in _IMPLICIT and v not in message]
        if unnamed:
            raise ConformanceError(subject, check, f"the ConfigError for the misspelt option "
                                   f"{typo!r} does not name the valid option(s) {unnamed}: "
                                   f"{message}") from exc
        return typo
    except Exception as exc:
        raise ConformanceError(subject, check, f"a misspelt option {typo!r} raised "
                               f"{type(exc).__name__} ({exc}); it must raise "
                               "frugalnas.ConfigError naming the valid options (declare every "
                               "option in the factory's signature, or check **options "
                               "yourself)") from exc
    close = getattr(obj, "close", None)
    if kind == "backends" and callable(close):
        close()
    raise ConformanceError(subject, check, f"the misspelt option {typo!r} was accepted silently; "
                           "it must raise frugalnas.ConfigError naming the valid options "
                           f"({', '.join(valid) or 'none'})")
