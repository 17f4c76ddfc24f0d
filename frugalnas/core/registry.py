"""Named components of one kind (timm-style): list, describe and create by name."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from frugalnas.core.errors import ConfigError, UnknownComponentError


@dataclass(frozen=True)
class Component:
    """One registered component: its factory and where it came from."""

    kind: str
    name: str
    factory: Callable[..., Any]
    plugin: str
    distribution: str | None = None
    version: str | None = None

    @property
    def summary(self) -> str:
        """The first paragraph of the factory's docstring, on one line."""
        doc = (inspect.getdoc(self.factory) or "").strip()
        return " ".join(doc.split("\n\n")[0].split())

    def create(self, host: Any = None, **options: Any) -> Any:
        """Call the factory, turning an unknown keyword option into a ConfigError. A factory
        that declares a ``host`` parameter receives ``host`` (the study's plugin host)."""
        self.check_options(options)
        if host is not None and self.accepts_host:
            options["host"] = host
        return self.factory(**options)

    @property
    def accepts_host(self) -> bool:
        try:
            return "host" in inspect.signature(self.factory).parameters
        except (TypeError, ValueError):
            return False

    def check_options(self, options: dict[str, Any]) -> None:
        """Raise ConfigError for an option the factory does not accept, listing the valid ones."""
        try:
            sig = inspect.signature(self.factory)
        except (TypeError, ValueError):
            return
        if any(p.kind is p.VAR_KEYWORD for p in sig.parameters.values()):
            return
        valid = self.options()
        for key in options:
            if key not in valid or key == "host":
                raise ConfigError(
                    f"unknown option {key!r} for {self.kind} {self.name!r}; "
                    f"valid options: {', '.join(sorted(valid)) or '(none)'}")

    def options(self) -> dict[str, Any]:
        """Keyword options the factory accepts, with their defaults (``inspect.Parameter.empty``
        for required ones)."""
        try:
            sig = inspect.signature(self.factory)
        except (TypeError, ValueError):
            return {}
        return {
            n: p.default
            for n, p in sig.parameters.items()
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and n not in ("self", "host")
        }


class Registry:
    """The components of one kind, keyed by name."""

    def __init__(self, kind: str, components: dict[str, Component]):
        self.kind = kind
        self._components = dict(sorted(components.items()))

    def __contains__(self, name: object) -> bool:
        return name in self._components

    def __iter__(self) -> Iterator[str]:
        return iter(self._components)

    def __len__(self) -> int:
        return len(self._components)

    def names(self) -> list[str]:
        return list(self._components)

    def get(self, name: str) -> Component:
        try:
            return self._components[name]
        except KeyError:
            raise UnknownComponentError(self.kind, name, self._components) from None

    def create(self, name: str, host: Any = None, **options: Any) -> Any:
        return self.get(name).create(host, **options)

    def describe(self) -> list[dict[str, str]]:
        return [
            {"name": c.name, "plugin": c.plugin, "summary": c.summary,
             "distribution": c.distribution or "", "version": c.version or ""}
            for c in self._components.values()
        ]
