"""Architecture: an immutable genotype with a stable hash, a text form and a JSON form.

A genotype is the ordered list of a search space's decisions (``name -> value``). Spaces with
a conventional text form (NAS-Bench-201's ``|op~0|+|...|``) subclass :class:`Architecture`
with ``space="..."`` in the class statement, override ``_format_body``/``_parse_body`` and
name the subclass as their ``SearchSpace.genotype``: ``space.parse(text)`` reads that form,
``NB201Cell.parse(text)`` too. ``Architecture.parse`` reads the generic ``key=value`` form.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any, ClassVar

from frugalnas.ports.errors import ArchitectureParseError

Value = str | int | float | bool

# json.dumps builds an encoder per call when given separators; the key is hashed from this text.
_COMPACT_JSON = json.JSONEncoder(separators=(",", ":"))

class Architecture:
    """An immutable genotype of search space ``space``."""

    space_name: ClassVar[str | None] = None
    __slots__ = ("space", "_decisions", "_hash", "_text")
    space: str
    _decisions: tuple[tuple[str, Value], ...]
    _hash: str | None
    _text: str | None

    def __init_subclass__(cls, space: str | None = None, **kwargs: Any):
        super().__init_subclass__(**kwargs)
        if space is not None:
            cls.space_name = space

    def __init__(self, space: str, decisions: Mapping[str, Value]):
        if not isinstance(space, str) or not space or ":" in space:
            raise ArchitectureParseError(f"invalid space name {space!r}")
        items = tuple((str(k), v) for k, v in decisions.items())
        for k, v in items:
            if not isinstance(v, (str, int, float, bool)):
                raise ArchitectureParseError(
                    f"decision {k!r} has value {v!r} of type {type(v).__name__}; "
                    "valid: str, int, float, bool")
        object.__setattr__(self, "space", space)
        object.__setattr__(self, "_decisions", items)
        object.__setattr__(self, "_hash", None)
        object.__setattr__(self, "_text", None)

    def __setattr__(self, name: str, value: Any) -> None:
        raise AttributeError("Architecture is immutable")

    @classmethod
    def create(cls, space: str, decisions: Mapping[str, Value]) -> "Architecture":
        """An instance of this class for ``space``."""
        return cls(space, decisions)

    # -- value semantics -----------------------------------------------------------------
    @property
    def decisions(self) -> dict[str, Value]:
        return dict(self._decisions)

    def __getitem__(self, key: str) -> Value:
        for name, value in self._decisions:
            if name == key:
                return value
        raise KeyError(key)

    def replace(self, **changes: Value) -> "Architecture":
        d = self.decisions
        unknown = set(changes) - set(d)
        if unknown:
            raise KeyError(f"unknown decision(s) {sorted(unknown)}; valid: {sorted(d)}")
        d.update(changes)
        return type(self)(self.space, d)

    def __eq__(self, other: object) -> bool:
        return (isinstance(other, Architecture) and self.space == other.space
                and self._decisions == other._decisions)

    def __hash__(self) -> int:
        return hash((self.space, self._decisions))

    @property
    def key(self) -> str:
        """A stable hex digest (same across processes and Python versions)."""
        digest = self._hash
        if digest is None:
            digest = hashlib.sha1(self.to_json().encode()).hexdigest()[:16]
            object.__setattr__(self, "_hash", digest)
        return digest

    # -- text form -----------------------------------------------------------------------
    def _format_body(self) -> str:
        return ",".join(f"{k}={json.dumps(v)}" for k, v in self._decisions)

    @classmethod
    def _parse_body(cls, space: str, body: str) -> "Architecture":
        decisions: dict[str, Value] = {}
        for part in filter(None, body.split(",")):
            key, sep, raw = part.partition("=")
            if not sep or not key:
                raise ArchitectureParseError(f"malformed decision {part!r} in {body!r}; expected key=value")
            try:
                decisions[key] = json.loads(raw)
            except json.JSONDecodeError:
                raise ArchitectureParseError(f"malformed value {raw!r} for decision {key!r}") from None
        return cls(space, decisions)

    def __str__(self) -> str:
        # Immutable, so formatted once: a trial records, reports and looks it up by its text.
        try:
            text = self._text
        except AttributeError:  # unpickled from before the text was kept
            text = None
        if text is None:
            text = f"{self.space}:{self._format_body()}"
            object.__setattr__(self, "_text", text)
        return text

    def __repr__(self) -> str:
        return f"Architecture({str(self)!r})"

    @classmethod
    def parse(cls, text: str) -> "Architecture":
        """Parse ``space:body`` as produced by ``str()``."""
        if not isinstance(text, str):
            raise ArchitectureParseError(f"expected an architecture string, got {text!r}")
        space, sep, body = text.strip().partition(":")
        if not sep or not space:
            raise ArchitectureParseError(
                f"malformed architecture string {text!r}; expected 'SPACE:BODY', e.g. "
                "'nb201:|nor_conv_3x3~0|+|skip_connect~0|none~1|+|none~0|none~1|avg_pool_3x3~2|'")
        if cls.space_name is not None and space != cls.space_name:
            raise ArchitectureParseError(f"{text!r} is not an architecture of space "
                                         f"{cls.space_name!r}")
        return cls._parse_body(space, body)

    # -- JSON form -----------------------------------------------------------------------
    def to_dict(self) -> dict[str, Any]:
        return {"space": self.space, "decisions": dict(self._decisions)}

    def to_json(self) -> str:
        return _COMPACT_JSON.encode(self.to_dict())

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> "Architecture":
        try:
            return cls.create(data["space"], data["decisions"])
        except (KeyError, TypeError) as exc:
            raise ArchitectureParseError(f"malformed architecture JSON {data!r}: {exc}") from None

    @classmethod
    def from_json(cls, text: str) -> "Architecture":
        try:
            return cls.from_dict(json.loads(text))
        except json.JSONDecodeError as exc:
            raise ArchitectureParseError(f"malformed architecture JSON {text!r}: {exc}") from None
