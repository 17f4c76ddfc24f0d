"""The hypervolume reference point of a study with several objectives: given, or fixed once
from the trials seen, beyond the worst value of each objective."""

from __future__ import annotations

import json
from typing import Any

from frugalnas.ports.errors import ConfigError


#: Study user attribute: the hypervolume reference point, once fixed (JSON list).
HV_REFERENCE_ATTR = "frugalnas_mlflow_hypervolume_reference"
#: Completed trials needed before the default hypervolume reference is fixed (the end of a
#: session fixes it with fewer).
HV_MIN_TRIALS = 10
#: The default reference lies this fraction of the observed range beyond the worst value.
HV_MARGIN = 0.1


def default_reference(points: list[list[float]], directions: list[str],
                      margin: float = HV_MARGIN) -> list[float]:
    """The default hypervolume reference point: per objective, the worst value among
    ``points``, moved ``margin`` times the observed range further from the optimum (``margin``
    times the value, or ``margin`` itself at 0, when every point has the same value), so that
    the extreme trials add volume too."""
    ref = []
    for k, d in enumerate(directions):
        col = [float(p[k]) for p in points]
        worst = min(col) if d == "maximize" else max(col)
        span = max(col) - min(col)
        pad = margin * span if span > 0 else (margin * abs(worst) or margin)
        ref.append(worst - pad if d == "maximize" else worst + pad)
    return ref


def parse_reference(value: Any, n_objectives: int) -> list[float]:
    """The ``hypervolume_reference`` option as floats (a list, or text such as ``[0, 30]`` or
    ``0,30``); :class:`ConfigError` naming the value when it is not one finite number per
    objective."""
    import math

    items = value
    if isinstance(value, str):
        text = value.strip()
        try:
            items = json.loads(text)
        except ValueError:
            items = [v for v in text.strip("[]()").split(",") if v.strip()]
    try:
        ref = [float(v) for v in items]
        ok = all(math.isfinite(v) for v in ref) and not isinstance(items, (str, bytes))
    except (TypeError, ValueError):
        ok = False
    if not ok or len(ref) != n_objectives:
        raise ConfigError(f"invalid mlflow hypervolume_reference {value!r}; expected {n_objectives} "
                          f"finite number(s), one per objective, in the objectives' units "
                          "(e.g. [0, 100])")
    return ref
