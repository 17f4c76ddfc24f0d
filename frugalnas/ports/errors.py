"""Exceptions raised by frugalnas. Every message names the bad value and the valid choices."""

from __future__ import annotations

import difflib
import signal
from collections.abc import Iterable


def nearest_hint(name: object, valid: Iterable[str]) -> str:
    """``"; did you mean 'X'?"`` for the valid name nearest a misspelt ``name``, or ``""``
    when none is close."""
    close = difflib.get_close_matches(str(name), list(valid), n=1)
    return f"; did you mean {close[0]!r}?" if close else ""


class FrugalnasError(Exception):
    """Base class of every error frugalnas raises on purpose."""


class ConfigError(FrugalnasError, ValueError):
    """A configuration value, key or option is invalid."""


class UnknownComponentError(ConfigError, KeyError):
    """A component name is not registered under its kind."""

    def __init__(self, kind: str, name: str, valid: Iterable[str],
                 blocked_registering: Iterable[str] = (), blocked_unknown: Iterable[str] = ()):
        self.kind, self.name, self.valid = kind, name, sorted(valid)
        #: Blocked plugins (``-p no:NAME``) known to register ``name``, and blocked plugins
        #: that were not inspected (a third-party plugin is not imported to ask), which may.
        self.blocked_registering = sorted(blocked_registering)
        self.blocked_unknown = sorted(blocked_unknown)
        message = f"unknown {kind} {name!r}; registered {kind}: {', '.join(self.valid) or '(none)'}"
        if self.blocked_registering:
            message += f" ({_blocked(self.blocked_registering)}, which registers it)"
        elif self.blocked_unknown:
            message += f" ({_blocked(self.blocked_unknown)} and may register it)"
        if not self.blocked_registering:
            message += nearest_hint(name, self.valid)
        super().__init__(message)

    def __str__(self) -> str:  # KeyError would quote the message
        return str(self.args[0])


def _blocked(plugins: list[str]) -> str:
    """``plugin 'a' is blocked by -p no:a`` (or ``plugins 'a', 'b' are blocked by ...``)."""
    names = ", ".join(repr(p) for p in plugins)
    flags = " ".join(f"-p no:{p}" for p in plugins)
    if len(plugins) == 1:
        return f"plugin {names} is blocked by {flags}"
    return f"plugins {names} are blocked by {flags}"


class ArchitectureParseError(FrugalnasError, ValueError):
    """An architecture string cannot be parsed."""


class PluginError(FrugalnasError):
    """A plugin failed to load, has a bad hook, or clashes with another plugin."""


class PluginNotAllowedError(PluginError):
    """A configuration (a run file, a study's stored configuration) names plugins that the
    code-loading policy does not let it import; nothing was imported. ``names`` are the
    refused plugins, ``source`` says where they were named (``run file 'run.toml'``,
    ``study 's'``) and ``needed`` what of that source no loaded plugin provides, if known."""

    def __init__(self, names: Iterable[str], source: str, needed: str | None = None):
        self.names, self.source, self.needed = sorted(names), source, needed
        super().__init__(self._message(f"pass plugins={self.names!r}"))

    def _message(self, how: str) -> str:
        them = "them" if len(self.names) > 1 else "it"
        named = (f"plugin{'s' if len(self.names) > 1 else ''} "
                 f"{', '.join(repr(n) for n in self.names)}")
        if self.needed is not None:
            return (f"{self.source} needs {self.needed}, which no loaded plugin registers; its "
                    f"stored configuration names {named}, which frugalnas does not import "
                    f"from a storage: {how} to load {them}")
        return (f"{self.source} names {named}, which a configuration may not import unless "
                f"you allow it: {how} to load {them}, or add {them} to FRUGALNAS_PLUGINS_ALLOW")

    def for_cli(self) -> str:
        """The same message for a command-line user (``-p NAME``)."""
        return self._message("give " + " ".join(f"-p {n}" for n in self.names))


class DuplicateComponentError(PluginError):
    """Two plugins registered a component of the same kind under the same name."""


class PluginHookError(PluginError):
    """A plugin's lifecycle hook raised. The study records it (``Study.plugin_errors``, one
    entry per plugin and hook, with a count) and goes on; the trial keeps its state."""

    def __init__(self, plugin: str, hook: str, error: str, count: int = 1,
                 operational: bool = False):
        self.plugin, self.hook, self.error, self.count = plugin, hook, error, count
        #: The hook raised an :class:`OperationalFailure` (a full disk under its store, ...).
        self.operational = operational
        super().__init__(plugin, hook, error)

    def __str__(self) -> str:
        times = f" ({self.count} times)" if self.count > 1 else ""
        return f"plugin {self.plugin!r} failed in {self.hook}: {self.error}{times}"


class OperationalFailure(ConfigError):
    """The machine failed, not the input: a store's disk is full, its server went away or
    refuses the login. The command line prints it as one line and exits 2; what was recorded
    before it is kept."""


class ConfigConflictError(ConfigError):
    """A stored study was created with settings other than the ones given now."""

    def __init__(self, study_name: str, differences: list[str]):
        self.study_name, self.differences = study_name, list(differences)
        super().__init__(
            f"study {study_name!r} exists with a different configuration (stored -> given: "
            f"{'; '.join(self.differences)}); reopen it with load_study() to run it with its "
            "stored settings, or choose another study_name")

    def for_cli(self) -> str:
        """The same message for a command-line user."""
        return (f"study {self.study_name!r} exists with a different configuration (stored -> "
                f"given: {'; '.join(self.differences)}); repeat the settings it was created "
                "with, or choose another --study-name")


class TrialFailure(FrugalnasError):
    """A candidate could not be evaluated (out of memory, non-finite loss, timeout...)."""


class Interrupted(KeyboardInterrupt):
    """A stop asked for by a signal: SIGINT (Ctrl-C) or SIGTERM (``kill``, a job scheduler).
    ``signum`` is the signal's number; a command exits with status ``128 + signum``."""

    def __init__(self, signum: int):
        super().__init__(signum)
        self.signum = int(signum)

    @property
    def signal_name(self) -> str:
        """``"SIGINT"``, ``"SIGTERM"``, ..."""
        try:
            return signal.Signals(self.signum).name
        except ValueError:
            return f"signal {self.signum}"

    def __str__(self) -> str:
        return f"interrupted by {self.signal_name}"

    def __repr__(self) -> str:
        return f"Interrupted({self.signal_name})"


def raise_interrupted(signum: int, frame: object) -> None:
    """A signal handler: raise :class:`Interrupted` for signal ``signum``."""
    raise Interrupted(signum)


def check_choice(what: str, value: object, valid: Iterable[object]) -> None:
    """Raise ConfigError unless ``value`` is one of ``valid``."""
    valid = list(valid)
    if value not in valid:
        hint = nearest_hint(value, [str(v) for v in valid if isinstance(v, str)]) \
            if isinstance(value, str) else ""
        raise ConfigError(f"invalid {what} {value!r}; valid: {', '.join(map(repr, valid))}{hint}")


def check_range(what: str, value: float, low: float | None = None, high: float | None = None) -> None:
    """Raise ConfigError unless ``low <= value <= high`` (either bound optional)."""
    if not isinstance(value, (int, float)) or isinstance(value, bool):
        raise ConfigError(f"invalid {what} {value!r}; expected a number")
    if (low is not None and value < low) or (high is not None and value > high):
        lo = "-inf" if low is None else low
        hi = "inf" if high is None else high
        raise ConfigError(f"invalid {what} {value!r}; valid range: [{lo}, {hi}]")


def one_line(exc: BaseException) -> str:
    """``Type: message`` on one line (the first line of the message)."""
    text = f"{type(exc).__name__}: {exc}".strip()
    return text.splitlines()[0][:2000] if text else type(exc).__name__
