"""Define-by-run model spaces (plugin "define-by-run"): a user's function that builds a
``torch.nn.Module`` while asking its decisions in optuna's vocabulary becomes a search space
every strategy, proxy, surrogate and estimator understands. docs/spaces.md shows how."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from frugalnas.ports.errors import ConfigError
from frugalnas.ports.lazy import lazy_attributes
from frugalnas.host.plugins import hookimpl

if TYPE_CHECKING:
    from frugalnas.spaces.define_by_run.space import DefineByRunSpace

# The plugin loads with every command: the space and the replay (optuna) load when first used.
__getattr__ = lazy_attributes(__name__, {
    "DefineByRunSpace": "frugalnas.spaces.define_by_run.space",
    "ModelTrial": "frugalnas.spaces.define_by_run.replay"})

__all__ = ["DefineByRunSpace", "ModelTrial", "SpaceFactory", "define"]

#: Options every define-by-run space takes besides its builder's own keyword options.
SPACE_OPTIONS = ("discovery",)


class SpaceFactory:
    """A registrable factory of a define-by-run space: ``factory(**options)`` returns the
    :class:`DefineByRunSpace` of its builder, ``options`` going to the builder's keyword
    parameters (checked against its signature like any component's options)."""

    def __init__(self, builder: Callable[..., Any], name: str | None = None):
        if not inspect.isfunction(builder):
            raise ConfigError(f"define() needs a builder function (def builder(trial, ...)), "
                              f"got {builder!r}")
        params = list(inspect.signature(builder).parameters.values())
        if not params or params[0].kind not in (params[0].POSITIONAL_ONLY,
                                                params[0].POSITIONAL_OR_KEYWORD):
            raise ConfigError(f"builder {builder.__qualname__!r} must take "
                              "the trial as its first positional parameter: "
                              "def builder(trial, ...) -> torch.nn.Module")
        clash = [p.name for p in params[1:] if p.name in SPACE_OPTIONS]
        if clash:
            raise ConfigError(f"builder parameter {clash[0]!r} clashes with a space option; "
                              f"rename it (reserved: {', '.join(SPACE_OPTIONS)})")
        self.builder, self.name = builder, name or builder.__name__
        extra = [p.replace(kind=p.KEYWORD_ONLY) for p in params[1:]
                 if p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)]
        discovery = inspect.Parameter("discovery", inspect.Parameter.KEYWORD_ONLY, default=200)
        self.__signature__ = inspect.Signature(extra + [discovery])
        first = (inspect.getdoc(builder) or "").strip().split("\n\n")[0]
        self.__doc__ = first or f"Define-by-run space of {self.name}."

    def __call__(self, discovery: int = 200, **options: Any) -> DefineByRunSpace:
        from frugalnas.spaces.define_by_run.space import DefineByRunSpace

        return DefineByRunSpace(self.builder, self.name, options, discovery=discovery)


def define(builder: Callable[..., Any], name: str | None = None) -> SpaceFactory:
    """The search-space factory of ``builder(trial, **options) -> torch.nn.Module``, which
    asks its decisions with ``trial.suggest_categorical/int/float``. Register it from a
    plugin (``frugalnas_search_spaces`` returning ``{"small_cnn": define(small_cnn)}``) or
    call it (``define(small_cnn)()``) for the space object; ``name`` prefixes the text form
    of its architectures (default: the builder's name)."""
    return SpaceFactory(builder, name)


@hookimpl
def frugalnas_space_factory(obj: object, name: str) -> Callable[..., Any] | None:
    if isinstance(obj, SpaceFactory):
        return obj
    if inspect.isfunction(obj):
        return SpaceFactory(obj, obj.__name__)
    return None
