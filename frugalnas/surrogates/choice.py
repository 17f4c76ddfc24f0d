"""Choosing an encoding by name for a space: the generic ones (``onehot``, ``proxy``) or one of
the space's own (an :class:`~frugalnas.ports.capabilities.OwnEncodings` capability)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from frugalnas.ports.capabilities import OwnEncodings, capability
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.space import SearchSpace
from frugalnas.surrogates.encodings import Encoding, OneHotEncoding
from frugalnas.surrogates.proxy_features import ProxyEncoding

def own_encodings(space: SearchSpace) -> Mapping[str, Callable[[SearchSpace], Any]]:
    """The space's own encodings by name (none without an :class:`OwnEncodings` capability)."""
    found = capability(space, OwnEncodings)
    return found.encodings() if found is not None else {}


#: Encodings that work on every space.
GENERIC = ("onehot", "proxy")


def make_encoding(name: str, space: SearchSpace, **options: Any) -> Encoding:
    """The encoding ``name`` for ``space``: ``onehot`` or ``proxy`` (any space) or one of the
    space's own (its :class:`~frugalnas.ports.capabilities.OwnEncodings`, e.g. NB201's
    ``adjacency`` and ``path``); ``options`` go to the ``proxy`` encoding (see
    :class:`~.proxy_features.ProxyEncoding`). ConfigError naming the space's encodings when
    it has no encoding ``name``."""
    own = own_encodings(space)
    if name not in GENERIC and name not in own:
        valid = ", ".join(available_encodings(space))
        raise ConfigError(f"unknown encoding {name!r} for search space {space.name!r}; its "
                          f"encodings: {valid}")
    if name == "proxy":
        return ProxyEncoding(space, **options)
    if options:
        raise ConfigError(f"encoding {name!r} takes no options, got {sorted(options)}")
    if name == "onehot":
        return OneHotEncoding(space)
    encoding: Encoding = own[name](space)
    return encoding


def available_encodings(space: SearchSpace) -> list[str]:
    """The names :func:`make_encoding` accepts for ``space``."""
    return ["onehot", *[n for n in own_encodings(space) if n not in GENERIC], "proxy"]


def preferred_encoding(space: SearchSpace, preferred: str) -> str:
    """``preferred`` when ``space`` has it, else ``onehot`` (a strategy's default encoding)."""
    return preferred if preferred in GENERIC or preferred in own_encodings(space) else "onehot"
