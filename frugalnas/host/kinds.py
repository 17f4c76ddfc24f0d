"""The component kinds: the one table of what frugalnas calls a kind of component.

Each :class:`Kind` names its registry (``search_spaces``), the label its messages use
(``search space``), the option group of the command line and the run file (``-o space.KEY``,
``space_options``; ``None`` for a kind a study does not configure directly) and the
registration hook (``frugalnas_search_spaces``), and carries its port: the type every
component of the kind is an instance of (``Kind[SearchSpace]``), named by reference so that
listing the kinds imports nothing. :meth:`PluginHost.create
<frugalnas.host.plugins.PluginHost.create>` given a kind (``SEARCH_SPACES``) returns that
type and refuses a factory that makes anything else. :data:`KINDS` (kind -> label),
:data:`GROUPS` (kind -> option group) and :data:`OPTION_GROUPS` are derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from frugalnas.ports.config import StudyConfig
from frugalnas.ports.errors import PluginError
from frugalnas.ports.lazy import load_reference

if TYPE_CHECKING:
    import optuna

    from frugalnas.ports.backend import Backend
    from frugalnas.ports.data import DataSource
    from frugalnas.ports.estimator import Estimator
    from frugalnas.ports.space import SearchSpace

P = TypeVar("P")


@dataclass(frozen=True)
class Kind(Generic[P]):
    """One kind of component; ``port`` is ``"module:Class"``, the type of its components."""

    name: str
    label: str
    group: str | None = None
    port: str = "builtins:object"

    @property
    def hook(self) -> str:
        """The registration hook of this kind."""
        return f"frugalnas_{self.name}"

    def port_type(self) -> type[P]:
        """The type every component of this kind is an instance of (imported here)."""
        found: type[P] = load_reference(self.port)
        return found

    def check(self, component: Any, name: str, plugin: str) -> P:
        """``component`` itself when it is an instance of the port, else a PluginError naming
        the component, its plugin and the type it should be."""
        port = self.port_type()
        if not isinstance(component, port):
            raise PluginError(f"plugin {plugin!r}: {self.label} {name!r} made a "
                              f"{type(component).__name__}, not a {port.__module__}."
                              f"{port.__qualname__}")
        return component


SEARCH_SPACES: Kind[SearchSpace] = Kind("search_spaces", "search space", "space",
                                        "frugalnas.ports.space:SearchSpace")
# The proxy and surrogate bases belong to their features: typed Any here, checked by reference.
PROXIES: Kind[Any] = Kind("proxies", "proxy", None, "frugalnas.proxies.base:Proxy")
ESTIMATORS: Kind[Estimator] = Kind("estimators", "estimator", "estimator",
                                   "frugalnas.ports.estimator:Estimator")
SURROGATES: Kind[Any] = Kind("surrogates", "surrogate", None,
                             "frugalnas.surrogates.base:Surrogate")
STRATEGIES: Kind[optuna.samplers.BaseSampler] = Kind("strategies", "strategy", "strategy",
                                                     "optuna.samplers:BaseSampler")
BACKENDS: Kind[Backend] = Kind("backends", "backend", "backend", "frugalnas.ports.backend:Backend")
DATASETS: Kind[DataSource] = Kind("datasets", "dataset", "dataset",
                                  "frugalnas.ports.data:DataSource")
PRUNERS: Kind[optuna.pruners.BasePruner] = Kind("pruners", "pruner", "pruner",
                                               "optuna.pruners:BasePruner")
# The launcher contract belongs to the distribution layer above: checked by reference.
LAUNCHERS: Kind[Any] = Kind("launchers", "launcher", None,
                            "frugalnas.distribution.launcher:Launcher")

#: Every kind, in the order ``frugalnas plugins`` lists them.
ALL_KINDS: tuple[Kind[Any], ...] = (SEARCH_SPACES, PROXIES, ESTIMATORS, SURROGATES, STRATEGIES,
                                    BACKENDS, DATASETS, PRUNERS, LAUNCHERS)

_BY_NAME: dict[str, Kind[Any]] = {k.name: k for k in ALL_KINDS}

#: kind -> its label (``"search_spaces": "search space"``).
KINDS: dict[str, str] = {k.name: k.label for k in ALL_KINDS}

#: kind -> its option group, for the kinds a study configures (``-o GROUP.KEY``).
GROUPS: dict[str, str] = {k.name: k.group for k in ALL_KINDS if k.group is not None}

#: The option groups, in the order of the StudyConfig fields they fill (``GROUP`` and
#: ``GROUP_options``), as the command line's help and messages list them.
OPTION_GROUPS: tuple[str, ...] = tuple(f.name for f in fields(StudyConfig)
                                       if f.name in GROUPS.values())


def get_kind(name: str) -> Kind[Any]:
    """The kind named ``name`` (``"search_spaces"``); a :class:`PluginError` listing the
    valid kinds for any other name."""
    found = _BY_NAME.get(name)
    if found is None:
        raise PluginError(f"unknown component kind {name!r}; valid kinds: {', '.join(KINDS)}")
    return found
