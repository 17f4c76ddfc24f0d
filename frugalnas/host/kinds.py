"""The component kinds: the one table of what frugalnas calls a kind of component.

Each :class:`Kind` names its registry (``search_spaces``), the label its messages use
(``search space``), the option group of the command line and the run file (``-o space.KEY``,
``space_options``; ``None`` for a kind a study does not configure directly) and the
registration hook (``frugalnas_search_spaces``). :data:`KINDS` (kind -> label),
:data:`GROUPS` (kind -> option group) and :data:`OPTION_GROUPS` are derived from it.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

from frugalnas.ports.config import StudyConfig
from frugalnas.ports.errors import PluginError


@dataclass(frozen=True)
class Kind:
    """One kind of component."""

    name: str
    label: str
    group: str | None = None

    @property
    def hook(self) -> str:
        """The registration hook of this kind."""
        return f"frugalnas_{self.name}"


#: Every kind, in the order ``frugalnas plugins`` lists them.
ALL_KINDS: tuple[Kind, ...] = (
    Kind("search_spaces", "search space", "space"),
    Kind("proxies", "proxy"),
    Kind("estimators", "estimator", "estimator"),
    Kind("surrogates", "surrogate"),
    Kind("strategies", "strategy", "strategy"),
    Kind("backends", "backend", "backend"),
    Kind("datasets", "dataset", "dataset"),
    Kind("pruners", "pruner", "pruner"),
    Kind("launchers", "launcher"),
)

_BY_NAME: dict[str, Kind] = {k.name: k for k in ALL_KINDS}

#: kind -> its label (``"search_spaces": "search space"``).
KINDS: dict[str, str] = {k.name: k.label for k in ALL_KINDS}

#: kind -> its option group, for the kinds a study configures (``-o GROUP.KEY``).
GROUPS: dict[str, str] = {k.name: k.group for k in ALL_KINDS if k.group is not None}

#: The option groups, in the order of the StudyConfig fields they fill (``GROUP`` and
#: ``GROUP_options``), as the command line's help and messages list them.
OPTION_GROUPS: tuple[str, ...] = tuple(f.name for f in fields(StudyConfig)
                                       if f.name in GROUPS.values())


def get_kind(name: str) -> Kind:
    """The kind named ``name`` (``"search_spaces"``); a :class:`PluginError` listing the
    valid kinds for any other name."""
    found = _BY_NAME.get(name)
    if found is None:
        raise PluginError(f"unknown component kind {name!r}; valid kinds: {', '.join(KINDS)}")
    return found
