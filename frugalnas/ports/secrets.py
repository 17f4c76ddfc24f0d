"""Secrets and per-machine settings in a study's configuration.

A password in a URI (``postgresql://USER:PASSWORD@HOST/DB``, ``http://USER:PASSWORD@HOST``),
a token in a URI's query (``?token=...``) and every plugin option its plugin declares secret
are masked (``***``) wherever frugalnas stores or shows a configuration: the config stored
with the study, MLflow params and artifacts, ``--dry-run``'s plan, messages. The real value is
used by the running process only, as the user gave it (command line, run file, environment).

A plugin declares the roles of its options with the hook ``frugalnas_option_roles``, which
returns an :class:`OptionRoles`: ``secret`` options are masked, ``run`` options are settings of
one process (a tracking server's address as this machine reaches it, ...) that workers of one
study may set differently: they are stored for reference but never compared when a study is
reopened.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any



MASK = "***"

#: ``SCHEME://USER:PASSWORD@``: the password group is replaced.
_URI_PASSWORD = re.compile(r"(?P<head>[A-Za-z][A-Za-z0-9+.\-]*://[^\s/@:'\"]*):"
                           r"(?P<password>[^\s/'\"]*)@")
#: A secret in a URI's query string (``?password=...``, ``&token=...``).
_QUERY_SECRET = re.compile(r"(?P<head>[?&](?:password|passwd|pwd|token|access_token|"
                           r"api_key|apikey|secret|client_secret)=)(?P<value>[^&\s'\"]*)",
                           re.IGNORECASE)


@dataclass(frozen=True)
class OptionRoles:
    """What a plugin declares about its own options (``plugin_options[its name]``):
    ``secret`` options are masked wherever a configuration is stored or shown; ``run``
    options belong to one process (one machine) and may differ between the workers of a
    study."""

    secret: frozenset[str] = field(default_factory=frozenset)
    run: frozenset[str] = field(default_factory=frozenset)

    def __init__(self, secret: Iterable[str] = (), run: Iterable[str] = ()) -> None:
        object.__setattr__(self, "secret", frozenset(secret))
        object.__setattr__(self, "run", frozenset(run))


def mask_text(text: str) -> str:
    """``text`` with every URI password and every query-string token replaced by ``***``."""
    text = _URI_PASSWORD.sub(lambda m: f"{m['head']}:{MASK}@", text)
    return _QUERY_SECRET.sub(lambda m: f"{m['head']}{MASK}" if m["value"] else m[0], text)


def mask_value(value: Any) -> Any:
    """``value`` (JSON-like data) with :func:`mask_text` applied to every string in it."""
    if isinstance(value, str):
        return mask_text(value)
    if isinstance(value, Mapping):
        return {k: mask_value(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):
        return [mask_value(v) for v in value]
    return value


def mask_options(plugin_options: Mapping[str, Mapping[str, Any]],
                 roles: Mapping[str, OptionRoles]) -> dict[str, dict[str, Any]]:
    """``plugin_options`` as it may be stored or shown: declared secrets replaced by ``***``
    (an empty or unset secret stays as it is), every other value masked by
    :func:`mask_value`."""
    out: dict[str, dict[str, Any]] = {}
    for plugin, options in plugin_options.items():
        secret = roles.get(plugin, OptionRoles()).secret
        out[plugin] = {k: MASK if k in secret and v not in (None, "") else mask_value(v)
                       for k, v in options.items()}
    return out


def without_masked_password(uri: str) -> str:
    """``uri`` without a password that was masked (``USER:***@`` -> ``USER@``): a stored URI
    used again, whose password the driver then reads from its own environment variable or
    file (``PGPASSWORD``, ``~/.pgpass``, ``MLFLOW_TRACKING_PASSWORD``, ...)."""
    return _URI_PASSWORD.sub(lambda m: f"{m['head']}@" if m["password"] == MASK else m[0], uri)
