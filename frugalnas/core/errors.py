"""Exceptions raised by frugalnas. Every message names the bad value and the valid choices."""

from __future__ import annotations

from collections.abc import Iterable


class FrugalnasError(Exception):
    """Base class of every error frugalnas raises on purpose."""


class ConfigError(FrugalnasError, ValueError):
    """A configuration value, key or option is invalid."""


class UnknownComponentError(ConfigError, KeyError):
    """A component name is not registered under its kind."""

    def __init__(self, kind: str, name: str, valid: Iterable[str]):
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        super().__init__(
            f"unknown {kind} {name!r}; registered {kind}: {', '.join(self.valid) or '(none)'}"
        )

    def __str__(self) -> str:  # KeyError would quote the message
        return self.args[0]


class ArchitectureParseError(FrugalnasError, ValueError):
    """An architecture string cannot be parsed."""


class PluginError(FrugalnasError):
    """A plugin failed to load, has a bad hook, or clashes with another plugin."""


class DuplicateComponentError(PluginError):
    """Two plugins registered a component of the same kind under the same name."""


class TrialFailure(FrugalnasError):
    """A candidate could not be evaluated (out of memory, non-finite loss, timeout...)."""


def check_choice(what: str, value: object, valid: Iterable[object]) -> None:
    """Raise ConfigError unless ``value`` is one of ``valid``."""
    valid = list(valid)
    if value not in valid:
        raise ConfigError(f"invalid {what} {value!r}; valid: {', '.join(map(repr, valid))}")


def check_range(what: str, value: float, low: float | None = None, high: float | None = None) -> None:
    """Raise ConfigError unless ``low <= value <= high`` (either bound optional)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(f"invalid {what} {value!r}; expected a number")
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ConfigError(f"invalid {what} {value!r}; valid range: [{lo}, {hi}]")
