"""A compression's budget: ``params=0.5`` (half the parent's non-embedding parameters) or
``params=2e6`` (at most two million)."""

from __future__ import annotations

from dataclasses import dataclass

from frugalnas.ports.errors import ConfigError

#: What a budget may bound.
KINDS = ("params",)


@dataclass(frozen=True)
class Budget:
    """An upper bound on a sub-network's ``kind``: a fraction of the parent's (``value`` up to
    1) or an absolute amount (above 1)."""

    kind: str
    value: float

    def bound(self, parent: int) -> int:
        """The bound for a parent of ``parent`` (parameters)."""
        return int(self.value * parent) if self.value <= 1 else int(self.value)

    def __str__(self) -> str:
        return f"{self.kind}={self.value:g}"


def parse_budget(text: str) -> Budget:
    """The budget ``KIND=VALUE`` (one-line :class:`ConfigError` otherwise)."""
    kind, sep, raw = str(text).partition("=")
    kind = kind.strip()
    if not sep or kind not in KINDS:
        raise ConfigError(f"invalid budget {text!r}; expected KIND=VALUE with KIND one of "
                          f"{', '.join(KINDS)}, e.g. params=0.5 (half the parent's "
                          "non-embedding parameters) or params=2e6")
    try:
        value = float(raw)
    except ValueError:
        raise ConfigError(f"invalid budget value {raw!r} in {text!r}; expected a number, a "
                          "fraction of the parent (0 < value <= 1) or an amount") from None
    if not value > 0:
        raise ConfigError(f"invalid budget value {raw!r} in {text!r}; it must be above 0")
    return Budget(kind, value)
