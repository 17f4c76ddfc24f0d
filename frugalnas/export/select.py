"""Which trial(s) to export: the best, the K best, a chosen trial, a Pareto trial, or the best
under a constraint. Every wrong choice is a one-line ConfigError naming the valid ones."""

from __future__ import annotations

import operator
import re
from typing import Any

from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports.errors import ConfigError
from frugalnas.ports.keys import COST_ATTR, METRICS_ATTR
from frugalnas.leaderboard import fmt_number, leaderboard_rows

OPERATORS = {"<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt,
             "==": operator.eq}
_CONSTRAINT = re.compile(r"^\s*([A-Za-z_][\w.]*)\s*(<=|>=|==|<|>)\s*([-+0-9.eE]+)\s*$")


def _numbers(numbers: list[int], limit: int = 30) -> str:
    """``0-3, 5, 7-9``: trial numbers as ranges (at most ``limit`` of them, then ``...``)."""
    parts: list[str] = []
    numbers = sorted(numbers)
    i = 0
    while i < len(numbers):
        j = i
        while j + 1 < len(numbers) and numbers[j + 1] == numbers[j] + 1:
            j += 1
        parts.append(str(numbers[i]) if i == j else f"{numbers[i]}-{numbers[j]}")
        i = j + 1
    return ", ".join(parts[:limit]) + (", ..." if len(parts) > limit else "")


def completed(study: Any) -> list[FrozenTrial]:
    trials = [t for t in study.optuna_study.get_trials(deepcopy=False, states=(TrialState.COMPLETE,))
              if t.values is not None]
    if not trials:
        raise ConfigError(f"study {study.name!r} has no completed trial to export")
    return trials


def _describe(study: Any, t: FrozenTrial) -> str:
    values = ", ".join(f"{n}={fmt_number(v)}" for n, v in zip(study.config.objectives, t.values))
    return f"trial {t.number} ({values})"


def pareto_choices(study: Any) -> list[FrozenTrial]:
    """The Pareto trials, best first by the first objective (the order ``pareto=I`` picks
    from)."""
    sign = 1 if study.directions[0] == "maximize" else -1
    return sorted(study.optuna_study.best_trials, key=lambda t: (-sign * t.values[0], t.number))


def _pareto_list(study: Any) -> str:
    return "; ".join(f"{i} = {_describe(study, t)}" for i, t in enumerate(pareto_choices(study)))


def quantity(study: Any, t: FrozenTrial, name: str) -> float | None:
    """An objective, a metric of the estimator or a cost field (``cost_params`` or just
    ``params``, ``cost_seconds``, ...) of trial ``t``; ``None`` when the trial has none."""
    if name in study.config.objectives:
        return float(t.values[study.config.objectives.index(name)])
    metrics = t.user_attrs.get(METRICS_ATTR) or {}
    if name in metrics:
        return float(metrics[name])
    cost = t.user_attrs.get(COST_ATTR) or {}
    if name.startswith("cost_") and name[5:] in cost:
        return float(cost[name[5:]])
    if name in cost:
        return float(cost[name])
    return None


def parse_constraint(text: str) -> tuple[str, str, float]:
    match = _CONSTRAINT.match(text or "")
    if not match:
        raise ConfigError(f"malformed constraint {text!r}; expected NAME<=NUMBER (or >=, <, >, "
                          "==), e.g. 'params<=50000' or 'latency_ms<2'")
    name, op, raw = match.groups()
    try:
        bound = float(raw)
    except ValueError:
        raise ConfigError(f"malformed constraint {text!r}: {raw!r} is not a number") from None
    return name, op, bound


def best_under(study: Any, constraint: str) -> FrozenTrial:
    """The best trial among those meeting ``constraint``, by the first objective the
    constraint does not name."""
    name, op, bound = parse_constraint(constraint)
    trials = completed(study)
    known = [t for t in trials if quantity(study, t, name) is not None]
    if not known:
        names = sorted({*study.config.objectives,
                        *(trials[0].user_attrs.get(METRICS_ATTR) or {}),
                        *(f"cost_{k}" for k in trials[0].user_attrs.get(COST_ATTR) or {})})
        names = [n for n in names if n.startswith(("cost_",)) or n in study.config.objectives] + \
            [n for n in names if not n.startswith("cost_") and n not in study.config.objectives]
        raise ConfigError(f"unknown quantity {name!r} in constraint {constraint!r}; valid: "
                          f"{', '.join(names)}")
    ok = [t for t in known if OPERATORS[op](quantity(study, t, name), bound)]
    if not ok:
        values = [quantity(study, t, name) for t in known]
        raise ConfigError(f"no completed trial of study {study.name!r} meets {constraint!r}; "
                          f"{name} ranges over [{fmt_number(min(values))}, "
                          f"{fmt_number(max(values))}] in its {len(known)} completed trial(s)")
    objectives = study.config.objectives
    target = next((i for i, o in enumerate(objectives) if o != name), 0)
    sign = 1 if study.directions[target] == "maximize" else -1
    return min(ok, key=lambda t: (-sign * t.values[target], t.number))


def select_trials(study: Any, *, trial: int | None = None, top: int | None = None,
                  pareto: int | None = None, constraint: str | None = None) -> list[FrozenTrial]:
    """The trials to export, best first. At most one of ``trial``, ``top``, ``pareto`` and
    ``constraint``; none means the best trial (a study with several objectives needs one)."""
    given = [name for name, v in (("trial", trial), ("top", top), ("pareto", pareto),
                                  ("constraint", constraint)) if v is not None]
    if len(given) > 1:
        raise ConfigError(f"choose the trial(s) to export with one of trial, top, pareto or "
                          f"constraint; got {', '.join(given)}")
    trials = completed(study)
    multi = len(study.config.objectives) > 1
    if trial is not None:
        if isinstance(trial, bool) or not isinstance(trial, int):
            raise ConfigError(f"invalid trial {trial!r}; expected a trial number")
        for t in trials:
            if t.number == trial:
                return [t]
        states = {t.number: t.state.name for t in study.optuna_study.get_trials(deepcopy=False)}
        what = f"is {states[trial]}" if trial in states else "does not exist"
        raise ConfigError(f"trial {trial} of study {study.name!r} {what}; completed trials: "
                          f"{_numbers([t.number for t in trials])}")
    if pareto is not None:
        if not multi:
            raise ConfigError(f"pareto applies to a study with several objectives; study "
                              f"{study.name!r} has one ({study.config.objectives[0]}): use "
                              "trial or top")
        front = pareto_choices(study)
        if isinstance(pareto, bool) or not isinstance(pareto, int) or not 0 <= pareto < len(front):
            raise ConfigError(f"invalid Pareto choice {pareto!r} for study {study.name!r}; valid: "
                              f"0-{len(front) - 1}: {_pareto_list(study)}")
        return [front[pareto]]
    if constraint is not None:
        return [best_under(study, constraint)]
    if top is not None:
        if isinstance(top, bool) or not isinstance(top, int) or top < 1:
            raise ConfigError(f"invalid top {top!r}; expected an integer >= 1 (up to "
                              f"{len(trials)}, the completed trials)")
        by_number = {t.number: t for t in trials}
        return [by_number[row["trial"]] for row in leaderboard_rows(study, limit=top, sizes=False)]
    if multi:
        raise ConfigError(f"study {study.name!r} has {len(study.config.objectives)} objectives "
                          f"({', '.join(study.config.objectives)}); choose a Pareto trial with "
                          f"pareto=I (--pareto I), I in 0-{len(pareto_choices(study)) - 1}: "
                          f"{_pareto_list(study)}; or a constraint such as "
                          f"'{study.config.objectives[1]}<=X' (--constraint), or trial=N")
    sign = 1 if study.directions[0] == "maximize" else -1
    return [min(trials, key=lambda t: (-sign * t.values[0], t.number))]
