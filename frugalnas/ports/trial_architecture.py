"""The architecture of a stored optuna trial: one rule for every reader.

The rule: the string the study recorded (user attribute
:data:`~frugalnas.ports.keys.ARCHITECTURE_ATTR`) first, else the trial's parameters when they
hold every decision of the space. A trial whose architecture cannot be read that way has none
(``None``), unless it is COMPLETE or PRUNED: such a trial was evaluated, so an unreadable
architecture is a :class:`~frugalnas.ports.errors.ConfigError` naming the trial (a study
loaded with another space, a damaged storage).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.keys import ARCHITECTURE_ATTR
from frugalnas.ports.space import SearchSpace


def architecture_from(text: str | None, params: Mapping[str, Any],
                      space: SearchSpace) -> Architecture:
    """The rule on its two inputs: ``space.parse(text)`` when ``text`` is given, else
    ``space.from_params(params)`` when ``params`` hold every decision; raises when neither
    reads (the space's own error, or a :class:`ConfigError` naming the missing decisions)."""
    if text:
        return space.parse(text)
    if all(name in params for name in space.distributions()):
        return space.from_params(dict(params))
    raise ConfigError(f"parameters for space {space.name!r} miss decision(s) "
                      f"{sorted(set(space.distributions()) - set(params))}")


def architecture_of(frozen: FrozenTrial, space: SearchSpace) -> Architecture | None:
    """The architecture of ``frozen`` (its recorded string, else complete parameters);
    ``None`` when it cannot be read and the trial is not COMPLETE or PRUNED, for which an
    unreadable architecture is a :class:`ConfigError` naming the trial."""
    try:
        return architecture_from(frozen.user_attrs.get(ARCHITECTURE_ATTR), frozen.params, space)
    except Exception as exc:
        if frozen.state in (TrialState.COMPLETE, TrialState.PRUNED):
            raise ConfigError(f"trial {frozen.number} ({frozen.state.name}) has no readable "
                              f"architecture for space {space.name!r}: {exc}") from None
        return None
