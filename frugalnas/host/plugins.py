"""The plugin host: built-in plugins, entry points, ``-p NAME`` / ``-p no:NAME``, registries.

Loading follows pytest: built-ins first, then every entry point of the group ``frugalnas``
(unless ``FRUGALNAS_DISABLE_PLUGIN_AUTOLOAD`` is set, or restricted by
``FRUGALNAS_PLUGINS_ALLOW``), then plugins named explicitly. A blocked name is never loaded.
Hook implementations are validated against the specs when a plugin is registered. As pytest
takes an unmarked ``pytest_*`` function for a hook, a plugin's function named ``frugalnas_*``
is a hook implementation with or without ``@frugalnas.hookimpl`` (the marker is needed only
for options such as ``tryfirst``); one whose name is no hook is refused.
"""

from __future__ import annotations

import difflib
import functools
import importlib
import importlib.metadata
import inspect
import types
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from types import ModuleType
from typing import Any, overload

import pluggy

from frugalnas.builtins import BUILTIN_PLUGINS
from frugalnas.host import hookspecs
from frugalnas.host.dotted import is_dotted, load_dotted
from frugalnas.host.loading import ENTRY_POINT_GROUP, allow_list, autoload_disabled
from frugalnas.ports.errors import ConfigError, DuplicateComponentError, PluginError
from frugalnas.host.kinds import KINDS, Kind, P, get_kind
from frugalnas.host.registry import Component, Registry
from frugalnas.ports.secrets import OptionRoles

hookimpl = pluggy.HookimplMarker("frugalnas")
#: The prefix of every hook name; a plugin's function with this prefix is taken as a hook.
HOOK_PREFIX = "frugalnas_"


class HookManager(pluggy.PluginManager):
    """pluggy's plugin manager for frugalnas's hooks: as pytest does for ``pytest_*``, a
    plugin's function (or method) named ``frugalnas_*`` implements the hook of that name
    even without ``@frugalnas.hookimpl``, so a forgotten marker registers the hook instead
    of silently nothing, and a misspelt name is refused as an unknown hook."""

    def __init__(self) -> None:
        super().__init__("frugalnas")

    def parse_hookimpl_opts(self, plugin: Any, name: str) -> Any:
        opts = super().parse_hookimpl_opts(plugin, name)
        if opts is not None or not name.startswith(HOOK_PREFIX):
            return opts
        found = inspect.getattr_static(plugin, name, None)
        if isinstance(found, (staticmethod, classmethod, types.MethodType)) \
                or inspect.isfunction(found):
            return {}  # an unmarked implementation: pluggy's defaults for every option
        return None


@dataclass(frozen=True)
class PluginInfo:
    name: str
    module: str
    source: str  # "builtin", "entrypoint" or "explicit"
    distribution: str | None = None
    version: str | None = None


def _split_plugin_args(args: Iterable[str]) -> tuple[list[str], set[str]]:
    """Split pytest-style ``-p`` values into plugins to add and names to block."""
    add, block = [], set()
    for arg in args:
        if arg.startswith("no:"):
            block.add(arg[3:])
        else:
            add.append(arg)
    return add, block


class PluginHost:
    """A pluggy plugin manager plus the component registries built from it."""

    def __init__(self, plugins: Sequence[str | ModuleType | object] = (),
                 disable_plugins: Iterable[str] = (), autoload: bool | None = None):
        # One name is a list of one name, not a sequence of letters.
        plugins = [plugins] if isinstance(plugins, str) else list(plugins)
        disable_plugins = [disable_plugins] if isinstance(disable_plugins, str) \
            else list(disable_plugins)
        named = [p for p in plugins if isinstance(p, str)]
        add, block = _split_plugin_args(named)
        self.blocked = set(block) | set(disable_plugins)
        #: The plugins asked for by name, to build the same host in another process (a
        #: virtual-node worker); plugins given as objects cannot travel and are left out.
        self.named_plugins: list[str] = list(add)
        self.pm = HookManager()
        self.pm.add_hookspecs(hookspecs)
        self.infos: dict[str, PluginInfo] = {}
        self._registries: dict[str, Registry] = {}
        #: Search spaces given as Python objects (``create_study(space=builder)``), by the
        #: dotted name the study's configuration records for them.
        self.given_spaces: dict[str, object] = {}

        for name, module in BUILTIN_PLUGINS.items():
            if name not in self.blocked:
                self._register_module(name, module, "builtin")

        eps = {ep.name: ep for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP)}
        autoload = (not autoload_disabled()) if autoload is None else autoload
        self.autoload = autoload
        allow = allow_list()
        if autoload:
            for name, ep in eps.items():
                if name in self.blocked or name in self.infos:
                    continue
                if allow is not None and name not in allow:
                    continue
                self._register_entry_point(ep, "entrypoint")

        for item in add:
            if item in self.blocked or item in self.infos:
                continue
            if item in eps:
                self._register_entry_point(eps[item], "explicit")
            else:
                self._register_module(item, item, "explicit")
        for obj in plugins:
            if not isinstance(obj, str):
                name = getattr(obj, "__name__", None) or type(obj).__name__
                if name not in self.blocked:
                    self._register_object(name, obj, PluginInfo(name, name, "explicit"))

    # -- loading -------------------------------------------------------------------------
    def _register_module(self, name: str, module_path: str, source: str) -> None:
        try:
            module = importlib.import_module(module_path)
        except Exception as exc:
            raise PluginError(
                f"plugin {name!r} failed to import module {module_path!r}: "
                f"{type(exc).__name__}: {exc}") from exc
        self._register_object(name, module, PluginInfo(name, module_path, source))

    def _register_entry_point(self, ep: importlib.metadata.EntryPoint, source: str) -> None:
        try:
            obj = ep.load()
        except Exception as exc:
            raise PluginError(
                f"plugin {ep.name!r} (entry point {ep.value!r}) failed to load: "
                f"{type(exc).__name__}: {exc}") from exc
        dist = getattr(ep, "dist", None)
        info = PluginInfo(ep.name, ep.value, source,
                          dist.metadata["Name"] if dist else None, dist.version if dist else None)
        self._register_object(ep.name, obj, info)

    def _register_object(self, name: str, obj: object, info: PluginInfo) -> None:
        try:
            self.pm.register(obj, name=name)
        except pluggy.PluginValidationError as exc:
            raise PluginError(f"plugin {name!r} has an invalid hook: {exc}") from exc
        except ValueError as exc:
            raise PluginError(f"plugin {name!r} could not be registered: {exc}") from exc
        unknown = [caller.name for caller in self.pm.get_hookcallers(obj) or []
                   if caller.spec is None]
        if unknown:
            self.pm.unregister(obj)
            valid = sorted(n for n in dir(hookspecs) if n.startswith(HOOK_PREFIX))
            near = [f"{n} (did you mean {close[0]}?)" if (close := difflib.get_close_matches(
                n, valid, n=1)) else n for n in unknown]
            raise PluginError(
                f"plugin {name!r} implements unknown hook(s) {', '.join(near)}; "
                f"valid hooks: {', '.join(valid)}")
        self.infos[name] = info
        self._registries.clear()

    # -- registries ----------------------------------------------------------------------
    def registry(self, kind: str) -> Registry:
        """The components of ``kind`` (one of :data:`KINDS`), built on first use."""
        get_kind(kind)  # an unknown kind is a PluginError listing the valid ones
        if kind not in self._registries:
            self._registries[kind] = self._build_registry(kind)
        return self._registries[kind]

    def _build_registry(self, kind: str) -> Registry:
        spec = get_kind(kind)
        label = spec.label
        caller = getattr(self.pm.hook, spec.hook)
        found: dict[str, Component] = {}
        for impl in reversed(caller.get_hookimpls()):
            provided = self._call_registration(impl, kind)
            info = self.infos.get(impl.plugin_name)
            for name, factory in provided.items():
                if name in found:
                    raise DuplicateComponentError(
                        f"{label} {name!r} is registered by both plugin "
                        f"{found[name].plugin!r} and plugin {impl.plugin_name!r}; block one "
                        f"with -p no:NAME")
                found[name] = Component(label, name, factory, impl.plugin_name,
                                        info.distribution if info else None,
                                        info.version if info else None)
        resolve = self._resolve_space if kind == "search_spaces" else None
        return Registry(label, found, functools.partial(self.blocked_registrants, kind), resolve)

    def _resolve_space(self, name: str) -> Component | None:
        """The search space a dotted path names (:mod:`frugalnas.host.dotted`), or one given
        to this host as an object (:attr:`given_spaces`): a SearchSpace subclass, or an
        object a plugin turns into a space factory (``frugalnas_space_factory``)."""
        if not is_dotted(name):
            return None
        from frugalnas.ports.space import SearchSpace

        obj = self.given_spaces[name] if name in self.given_spaces else load_dotted(name)
        if isinstance(obj, type) and issubclass(obj, SearchSpace):
            factory: Any = obj
        else:
            factory = self.pm.hook.frugalnas_space_factory(obj=obj, name=name)
            if factory is None:
                raise ConfigError(
                    f"{name!r} names a {type(obj).__name__}, which is no search space: "
                    "expected a define-by-run builder function (see docs/spaces.md) or a "
                    "frugalnas.SearchSpace subclass")
        return Component("search space", name, factory, name.partition(":")[0])

    @staticmethod
    def _call_registration(impl: Any, kind: str, **kwargs: Any) -> dict[str, Any]:
        try:
            provided = impl.function(**{k: v for k, v in kwargs.items() if k in impl.argnames})
        except Exception as exc:
            raise PluginError(
                f"plugin {impl.plugin_name!r} failed in frugalnas_{kind}: "
                f"{type(exc).__name__}: {exc}") from exc
        provided = provided or {}
        if not isinstance(provided, dict):
            raise PluginError(
                f"plugin {impl.plugin_name!r}: frugalnas_{kind} must return a dict of "
                f"name -> factory, got {type(provided).__name__}")
        return provided

    @overload
    def create(self, kind: Kind[P], name: str, **options: Any) -> P: ...

    @overload
    def create(self, kind: str, name: str, **options: Any) -> Any: ...

    def create(self, kind: Kind[Any] | str, name: str, **options: Any) -> Any:
        """Create component ``name`` of ``kind`` (a :class:`Kind`, typed by its port, or its
        name); its factory gets this host if it asks for it. A factory that makes something
        other than the kind's port type is a PluginError naming its plugin."""
        spec = kind if isinstance(kind, Kind) else get_kind(kind)
        component = self.registry(spec.name).get(name)
        return spec.check(component.create(self, **options), name, component.plugin)

    def estimators(self) -> Registry:
        """Registered estimators plus those derived from other components
        (``frugalnas_derived_estimators``, e.g. one per proxy); registered names win. A derived
        factory with ``derived_from = (kind, name)`` belongs to the plugin that registered that
        component (a third-party proxy's estimator is that plugin's, not the ``proxies``
        plugin's), so listing and checking a plugin's components include it."""
        if "_all_estimators" not in self._registries:
            found: dict[str, Component] = {}
            for impl in reversed(self.pm.hook.frugalnas_derived_estimators.get_hookimpls()):
                info = self.infos.get(impl.plugin_name)
                owner = (impl.plugin_name, info.distribution if info else None,
                         info.version if info else None)
                for name, factory in self._call_registration(impl, "derived_estimators",
                                                             host=self).items():
                    origin = self._origin(getattr(factory, "derived_from", None))
                    found.setdefault(name, Component("estimator", name, factory,
                                                     *(origin or owner)))
            found.update({n: self.registry("estimators").get(n)
                          for n in self.registry("estimators")})
            self._registries["_all_estimators"] = Registry(
                "estimator", found, functools.partial(self.blocked_registrants, "estimators"))
        return self._registries["_all_estimators"]

    def blocked_registrants(self, kind: str, name: str) -> tuple[list[str], list[str]]:
        """For an unknown component ``name`` of ``kind``: the blocked plugins (``-p no:NAME``)
        that register it, and the blocked plugins that may. A blocked built-in plugin is asked
        (its module is frugalnas's own; an estimator name is also looked up among its proxies,
        each of which is an estimator); any other blocked plugin is not imported to ask, so it
        may register it."""
        registering, unknown = [], []
        hooks = [get_kind(kind).hook] + ([get_kind("proxies").hook] if kind == "estimators"
                                         else [])
        for plugin in sorted(self.blocked):
            if plugin not in BUILTIN_PLUGINS:
                unknown.append(plugin)
                continue
            try:
                module = importlib.import_module(BUILTIN_PLUGINS[plugin])
                names: set[str] = set()
                for hook in hooks:
                    function = getattr(module, hook, None)
                    if callable(function):
                        names.update(function() or {})
            except Exception:  # a built-in that cannot answer: it may register it
                unknown.append(plugin)
                continue
            if name in names:
                registering.append(plugin)
        return registering, unknown

    def _origin(self, derived_from: Any) -> tuple[str, str | None, str | None] | None:
        """Plugin, distribution and version of the component ``(kind, name)`` a derived
        estimator is made from, or None when it names no registered component."""
        if not (isinstance(derived_from, tuple) and len(derived_from) == 2
                and derived_from[0] in KINDS and derived_from[0] != "estimators"):
            return None
        registry = self.registry(derived_from[0])
        if derived_from[1] not in registry:
            return None
        source = registry.get(derived_from[1])
        return source.plugin, source.distribution, source.version

    def create_estimator(self, name: str, options: dict[str, Any]) -> Any:
        """The estimator ``name`` (registered or derived) with ``options``."""
        return self.estimators().create(name, self, **options)

    @property
    def hook(self) -> Any:
        return self.pm.hook

    def call_each(self, hook: str, kwargs: Mapping[str, Any],
                  on_error: Callable[[str, BaseException], None]) -> None:
        """Call each implementation of the hook named ``hook`` in pluggy's order, so that an
        exception names the plugin that raised it: ``on_error(plugin_name, exc)`` is called for
        it (and may re-raise) and the next implementation still runs. Hooks with wrapper
        implementations are called through pluggy as a whole; a failure is then attributed
        from the traceback."""
        caller = getattr(self.hook, hook)
        impls = caller.get_hookimpls()
        if not impls:
            return
        if any(getattr(i, "hookwrapper", False) or getattr(i, "wrapper", False) for i in impls):
            try:
                caller(**kwargs)
            except Exception as exc:
                on_error(_culprit(exc, impls), exc)
            return
        for impl in reversed(impls):
            try:
                impl.function(*[kwargs[name] for name in impl.argnames])
            except Exception as exc:
                on_error(impl.plugin_name, exc)

    def answers(self, hook: str, **kwargs: Any) -> dict[str, Any]:
        """Call each implementation of the hook named ``hook`` in pluggy's order and return
        the answers that are not ``None`` by plugin name (an exception propagates)."""
        out: dict[str, Any] = {}
        for impl in reversed(getattr(self.hook, hook).get_hookimpls()):
            answer = impl.function(*[kwargs[name] for name in impl.argnames])
            if answer is not None:
                out[impl.plugin_name] = answer
        return out

    def option_roles(self) -> dict[str, OptionRoles]:
        """The roles every plugin declares for its options, by plugin name."""
        answers: dict[str, OptionRoles] = self.answers("frugalnas_option_roles")
        for plugin, answer in answers.items():
            if not isinstance(answer, OptionRoles):
                raise PluginError(f"plugin {plugin!r} returned {answer!r} from "
                                  "frugalnas_option_roles; expected an OptionRoles(secret=..., "
                                  "run=...)")
        return answers

    def implements(self, hook: str) -> bool:
        """Whether any loaded plugin implements the hook named ``hook``."""
        return bool(getattr(self.hook, hook).get_hookimpls())

    def spec(self) -> dict[str, Any]:
        """What rebuilds this host elsewhere: ``PluginHost(**host.spec())``."""
        return {"plugins": list(self.named_plugins), "disable_plugins": sorted(self.blocked),
                "autoload": self.autoload}

    def has_plugin(self, name: str) -> bool:
        return self.pm.has_plugin(name)


def _culprit(exc: BaseException, impls: list[Any]) -> str:
    codes = {getattr(i.function, "__code__", None): i.plugin_name for i in impls}
    name, tb = "(unknown plugin)", exc.__traceback__
    while tb is not None:
        name = codes.get(tb.tb_frame.f_code, name)
        tb = tb.tb_next
    return name


def get_host(plugins: Sequence[Any] = (), disable_plugins: Iterable[str] = ()) -> PluginHost:
    """A new host with the built-in and installed plugins, plus ``plugins`` and less
    ``disable_plugins``; nothing is shared between two calls, so what one study registers in
    its host (a given search space) no other study sees."""
    return PluginHost(list(plugins), list(disable_plugins))


def list_components(kind: str) -> list[str]:
    """Names of the registered components of ``kind`` (built-in and installed plugins)."""
    return get_host().registry(kind).names()


def create_component(kind: str, name: str, **options: Any) -> Any:
    """Create the component ``name`` of ``kind`` from the built-in and installed plugins."""
    return get_host().create(kind, name, **options)
