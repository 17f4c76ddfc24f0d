"""The code-loading policy: which plugins a configuration may name, read from the built-in
plugins, the caller's own plugins and two environment variables; nothing is imported to
decide."""

from __future__ import annotations

import importlib.metadata
import os
from collections.abc import Iterable

from frugalnas.builtins import BUILTIN_PLUGINS

ENTRY_POINT_GROUP = "frugalnas"
AUTOLOAD_ENV = "FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD"
ALLOW_ENV = "FRUGALNAS_PLUGINS_ALLOW"


def autoload_disabled() -> bool:
    return os.environ.get(AUTOLOAD_ENV, "").strip().lower() not in ("", "0", "false", "no")


def allow_list() -> set[str] | None:
    raw = os.environ.get(ALLOW_ENV, "").strip()
    return {p.strip() for p in raw.split(",") if p.strip()} if raw else None


def refused_plugins(names: Iterable[str], allowed: Iterable[str] = ()) -> list[str]:
    """The code-loading policy: of the plugin ``names`` a configuration names (a run file's
    ``plugins``, a study's stored configuration), those it may not import. A configuration
    may name a built-in plugin, a plugin the user named (``allowed``: ``-p NAME`` on the
    command line, ``plugins=`` of the caller), a name listed in ``FRUGALNAS_PLUGINS_ALLOW``,
    and an installed entry point that autoloading loads anyway; any other module is refused.
    ``no:NAME`` (blocking) is always allowed. Nothing is imported to decide."""
    allowed, allow = set(allowed), allow_list()
    autoloaded: set[str] = set()
    if not autoload_disabled():
        autoloaded = {ep.name for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)
                      if allow is None or ep.name in allow}
    return sorted({name for name in names if not name.startswith("no:")
                   and name not in BUILTIN_PLUGINS and name not in allowed
                   and name not in (allow or ()) and name not in autoloaded})
