"""Dotted paths in a configuration: ``package.module:name`` naming a user's search space.

How far a dotted path reaches: it names one public top-level attribute (no leading ``_``, no
nested attribute) of a module importable from ``sys.path``. It is accepted only where a
search space is named. A study reopened from its storage (workers, ``report``, ``export``)
imports it only when the code-loading policy allows its module or top-level package (see
:func:`frugalnas.host.loading.refused_plugins`), since whoever can write the storage could
name any module.
"""

from __future__ import annotations

import importlib
import re

from frugalnas.host.loading import refused_plugins
from frugalnas.ports.errors import ConfigError, one_line

_PATH = re.compile(r"^[A-Za-z_]\w*(\.[A-Za-z_]\w*)*:[A-Za-z]\w*$")


def is_dotted(name: str) -> bool:
    """Whether ``name`` has the form of a dotted path (``module:attribute``)."""
    return ":" in name


def split_dotted(path: str) -> tuple[str, str]:
    """``(module, attribute)`` of ``path``; a ConfigError saying the accepted form for anything
    else (nested attributes, private names, file paths)."""
    if not _PATH.match(path):
        raise ConfigError(f"invalid dotted path {path!r}; expected 'package.module:name' "
                          "naming a public top-level function or class of an importable "
                          "module (no nested attributes, no names starting with '_')")
    module, _, attr = path.partition(":")
    return module, attr


def load_dotted(path: str) -> object:
    """The object ``path`` names, imported; a one-line ConfigError when the module cannot be
    imported or has no such attribute."""
    module_name, attr = split_dotted(path)
    try:
        module = importlib.import_module(module_name)
    except Exception as exc:
        raise ConfigError(f"cannot import module {module_name!r} of {path!r}: "
                          f"{one_line(exc)} (it must be importable: installed, on PYTHONPATH, "
                          "or beside the run file)") from exc
    try:
        return getattr(module, attr)
    except AttributeError:
        public = sorted(n for n in vars(module) if not n.startswith("_"))
        raise ConfigError(f"module {module_name!r} has no attribute {attr!r}; its public "
                          f"names: {', '.join(public[:20]) or '(none)'}") from None


def dotted_name(obj: object) -> str:
    """The dotted path of a function or class (``module:qualname``)."""
    module = getattr(obj, "__module__", None)
    qual = getattr(obj, "__qualname__", None)
    if not module or not qual:
        raise ConfigError(f"{obj!r} has no module and name to refer to it by; pass a function "
                          "or class defined at the top level of a module")
    return f"{module}:{qual}"


def dotted_module_refused(name: str, allowed: list[str]) -> list[str]:
    """``[module]`` when ``name`` is a dotted path whose module the code-loading policy does
    not allow a stored configuration to import (neither the module nor its top-level package
    is allowed); ``[]`` otherwise."""
    if not is_dotted(name):
        return []
    module = name.partition(":")[0]
    top = module.split(".")[0]
    if not refused_plugins([module], allowed) or not refused_plugins([top], allowed):
        return []
    return [module]
