"""Named components of one kind (timm-style): list, describe and create by name."""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from frugalnas.ports.errors import ConfigError, PluginError, UnknownComponentError, nearest_hint
from frugalnas.ports.lazy import load_reference


@dataclass(frozen=True)
class LazyFactory:
    """A factory named by reference, imported when first used: registration hooks may return
    one in place of the factory, so that listing, describing and checking the names of
    components imports none of their modules (nor torch, scikit-learn, MLflow...).

    ``target`` is ``"package.module:attribute"``; ``summary`` is the component's one-line
    description, shown without importing it (empty: the target's docstring is read);
    ``args`` are positional arguments bound to the target (``functools.partial``);
    ``derived_from`` is a derived estimator's ``(kind, name)`` (see
    ``frugalnas_derived_estimators``). Calling it calls the target, so code that calls a
    registered factory directly works with either."""

    target: str
    summary: str = ""
    args: tuple[Any, ...] = ()
    derived_from: tuple[str, str] | None = None

    def __post_init__(self) -> None:
        module, sep, attribute = self.target.partition(":")
        if not sep or not module or not attribute:
            raise ValueError(f"lazy factory {self.target!r}: expected 'package.module:attribute'")

    def load(self) -> Callable[..., Any]:
        """The factory itself (its module is imported on the first call; Python keeps it)."""
        found = load_reference(self.target)
        return functools.partial(found, *self.args) if self.args else found

    def __call__(self, *args: Any, **options: Any) -> Any:
        return self.load()(*args, **options)


@dataclass(frozen=True)
class Component:
    """One registered component: what its plugin registered (a factory or a
    :class:`LazyFactory`) and where it came from."""

    kind: str
    name: str
    registered: Callable[..., Any]
    plugin: str
    distribution: str | None = None
    version: str | None = None

    @property
    def factory(self) -> Callable[..., Any]:
        """The factory; a lazy reference is imported here (a :class:`PluginError` naming the
        plugin, the component and the reference when that fails)."""
        if isinstance(self.registered, LazyFactory):
            try:
                return self.registered.load()
            except Exception as exc:
                raise PluginError(
                    f"plugin {self.plugin!r}: {self.kind} {self.name!r} names "
                    f"{self.registered.target!r}, which failed to import: "
                    f"{type(exc).__name__}: {exc}") from exc
        return self.registered

    @property
    def summary(self) -> str:
        """The first paragraph of the factory's docstring, on one line (a lazy reference's
        own summary, without importing it)."""
        if isinstance(self.registered, LazyFactory) and self.registered.summary:
            return self.registered.summary
        doc = (inspect.getdoc(self.factory) or "").strip()
        return " ".join(doc.split("\n\n")[0].split())

    def create(self, host: Any = None, **options: Any) -> Any:
        """Call the factory, turning an unknown keyword option into a ConfigError. A factory
        that declares a ``host`` parameter receives ``host`` (the study's plugin host)."""
        self.check_options(options)
        factory = self.factory
        if host is not None and self.accepts_host:
            options["host"] = host
        return factory(**options)

    @property
    def accepts_host(self) -> bool:
        return "host" in self._declared[0]

    @functools.cached_property
    def _declared(self) -> tuple[dict[str, Any], bool]:
        """:func:`declared_parameters` of the factory, read once."""
        return declared_parameters(self.factory)

    def check_options(self, options: dict[str, Any]) -> None:
        """Raise ConfigError for an option the factory does not accept, listing the valid ones
        (one the factory lists in a ``fixed_options`` attribute, as an ArchSampler subclass
        does, is said to be set by the component itself)."""
        if self.accepts_any_option:
            return
        valid = self.options()
        fixed = getattr(self.factory, "fixed_options", ())
        for key in options:
            if key in fixed:
                raise ConfigError(
                    f"option {key!r} is set by {self.kind} {self.name!r} itself, not by users; "
                    f"valid options: {', '.join(sorted(valid)) or '(none)'}")
            if key not in valid:
                raise ConfigError(
                    f"unknown option {key!r} for {self.kind} {self.name!r}; "
                    f"valid options: {', '.join(sorted(valid)) or '(none)'}"
                    f"{nearest_hint(key, valid)}")

    def options(self) -> dict[str, Any]:
        """Keyword options the factory accepts, with their defaults (``inspect.Parameter.empty``
        for required ones): those its signature names and, where it passes ``**options`` on to
        a base class, the base's (:func:`declared_parameters`), less ``host`` and the ones the
        component sets itself (``fixed_options``)."""
        fixed = set(getattr(self.factory, "fixed_options", ()))
        return {n: d for n, d in self._declared[0].items() if n != "host" and n not in fixed}

    def user_options(self) -> dict[str, Any]:
        """:meth:`options` less the arguments the study supplies itself (a strategy's
        ``space``, ``seed`` and ``constraints``, a dataset's ``seed``, a pruner's
        ``directions``): what a user may set. Required ones have ``inspect.Parameter.empty``."""
        supplied = SUPPLIED_ARGUMENTS.get(self.kind, ())
        return {n: d for n, d in self.options().items() if n not in supplied}

    @property
    def accepts_any_option(self) -> bool:
        """Whether the factory takes ``**options`` that reach no declared parameter (it then
        checks option names itself)."""
        return self._declared[1]

    def describe_options(self) -> list[dict[str, Any]]:
        """Each user option as ``{"name", "required", "default"}`` (``default`` is ``None`` for
        a required option; a value JSON cannot hold is given as its ``repr``)."""
        return [{"name": n, "required": d is inspect.Parameter.empty,
                 "default": None if d is inspect.Parameter.empty else _plain(d)}
                for n, d in self.user_options().items()]


def declared_parameters(factory: Callable[..., Any]) -> tuple[dict[str, Any], bool]:
    """The keyword parameters ``factory`` declares, with their defaults, and whether it also
    takes options it does not declare. A class whose ``__init__`` takes ``**options`` and
    passes them on to its base declares the base's parameters too: the classes of its MRO are
    read until one ``__init__`` takes no ``**options`` (a subclass's own default wins), so a
    base class's options reach every subclass without being restated."""
    found: dict[str, Any] = {}
    chain: list[Callable[..., Any]] = [factory]
    if isinstance(factory, type):
        chain = [vars(c)["__init__"] for c in factory.__mro__
                 if c is not object and "__init__" in vars(c)]
    for target in chain:
        try:
            params = list(inspect.signature(target).parameters.values())
        except (TypeError, ValueError):
            return found, True
        for p in params:
            if p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY) and p.name != "self":
                found.setdefault(p.name, p.default)
        if not any(p.kind is p.VAR_KEYWORD for p in params):
            return found, False
    # A class whose chain of **options ends at object's __init__ takes nothing more.
    return found, not isinstance(factory, type)


#: Factory arguments the study passes itself, per kind (the kind's singular label).
SUPPLIED_ARGUMENTS: dict[str, tuple[str, ...]] = {
    "strategy": ("space", "seed", "constraints"),
    "dataset": ("seed",),
    "pruner": ("directions",),
}


def _plain(value: Any) -> Any:
    """``value`` as JSON can hold it: numbers, strings, booleans, ``None``, lists and string-keyed
    dicts of those; anything else as its ``repr``."""
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    if isinstance(value, (list, tuple)):
        return [_plain(v) for v in value]
    if isinstance(value, dict) and all(isinstance(k, str) for k in value):
        return {k: _plain(v) for k, v in value.items()}
    return repr(value)


class Registry:
    """The components of one kind, keyed by name."""

    def __init__(self, kind: str, components: dict[str, Component],
                 blocked: Callable[[str], tuple[list[str], list[str]]] | None = None,
                 resolve: Callable[[str], Component | None] | None = None):
        self.kind = kind
        self._components = dict(sorted(components.items()))
        #: ``resolve(name)``: a component for a name no plugin registers (a dotted path to a
        #: user's search space), or None; remembered once found.
        self._resolve = resolve
        #: ``blocked(name)``: the blocked plugins that register ``name`` and those that may (the
        #: host's :meth:`~frugalnas.host.plugins.PluginHost.blocked_registrants`); an unknown
        #: name's error names them.
        self._blocked = blocked

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
            found = self._resolve(name) if self._resolve is not None else None
            if found is not None:
                self._components[name] = found
                return found
            registering, unknown = self._blocked(name) if self._blocked else ([], [])
            raise UnknownComponentError(self.kind, name, self._components, registering,
                                        unknown) from None

    def create(self, name: str, host: Any = None, **options: Any) -> Any:
        return self.get(name).create(host, **options)

    def describe(self, options: bool = False) -> list[dict[str, Any]]:
        """One row per component: name, plugin, summary, distribution, version; with
        ``options``, also ``options`` (:meth:`Component.describe_options`) and
        ``accepts_any_option``."""
        rows: list[dict[str, Any]] = []
        for c in self._components.values():
            row: dict[str, Any] = {"name": c.name, "plugin": c.plugin, "summary": c.summary,
                                   "distribution": c.distribution or "",
                                   "version": c.version or ""}
            if options:
                row["options"] = c.describe_options()
                row["accepts_any_option"] = c.accepts_any_option
            rows.append(row)
        return rows
