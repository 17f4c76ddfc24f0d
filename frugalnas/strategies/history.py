"""What a strategy reads from its study: the completed trials in trial-number order as a
:class:`History` (architectures, objective values, violations, every architecture already
proposed), read incrementally (:func:`read_history`), and :func:`fitness`, the one ranking of
those values that every strategy uses (objectives, Pareto ranks and crowding, constraint
violations)."""

from __future__ import annotations

import bisect
import math
import threading
from collections.abc import Iterable, Iterator, Sequence, Set
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports import optuna_compat
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.keys import ARCHITECTURE_ATTR
from frugalnas.ports.space import SearchSpace
from frugalnas.ports.trial_architecture import architecture_from
from frugalnas.ports.trial_constraints import constraint_values, violation
from frugalnas.multiobjective.pareto import crowding, direction_signs, nondominated_ranks


class SeenKeys(Set[str]):
    """Architecture keys, as a set that is cheap to extend for one proposal: ``keys`` of its
    own over a ``base`` it reads but never copies or changes (the keys of a study's finished
    trials, shared by every proposal). ``add`` adds to its own keys; ``seen | other`` is a new
    :class:`SeenKeys` over this one (a view: later additions to this one show through)."""

    __slots__ = ("_own", "_base")

    def __init__(self, keys: Iterable[str] = (), base: Set[str] | None = None):
        self._own = set(keys)
        self._base: Set[str] = frozenset() if base is None else base

    def __contains__(self, key: object) -> bool:
        return key in self._own or key in self._base

    def __iter__(self) -> Iterator[str]:
        yield from self._base
        yield from (k for k in self._own if k not in self._base)

    def __len__(self) -> int:
        return len(self._base) + sum(1 for k in self._own if k not in self._base)

    def __or__(self, other: Iterable[Any]) -> SeenKeys:
        return SeenKeys(other, base=self)

    def add(self, key: str) -> None:
        if key not in self._base:
            self._own.add(key)


@dataclass
class History:
    """Completed architectures (trial-number order) with their values, and every proposed key.

    The history :func:`read_history` returns shares its lists with the sampler's record of the
    study, which grows in place: a strategy reads them and never changes them."""

    archs: list[Architecture] = field(default_factory=list)
    values: list[list[float]] = field(default_factory=list)
    numbers: list[int] = field(default_factory=list)
    #: Every key proposed before (finished, running or waiting trials; a plain set given here
    #: becomes a :class:`SeenKeys`).
    seen: SeenKeys = field(default_factory=SeenKeys)
    #: Each completed trial's total relative constraint violation (0.0: feasible, or a study
    #: without constraints); user attribute :data:`~frugalnas.ports.keys.VIOLATION_ATTR`.
    violations: list[float] = field(default_factory=list)
    #: Each completed trial's ``value - bound`` per constraint (constraint-name order; empty
    #: tuples without constraints), user attribute :data:`~frugalnas.ports.keys.CONSTRAINTS_ATTR`.
    constraint_diffs: list[tuple[float, ...]] = field(default_factory=list)
    #: The keys of the finished trials: the part of :attr:`seen` that stays seen for every
    #: later proposal (the rest belongs to unfinished trials and to this proposal).
    settled: Set[str] = field(default_factory=frozenset)
    #: The numbers of the completed trials in the order this process read them (it only
    #: grows): a strategy that keeps state across proposals reads the numbers past its last
    #: position instead of the whole history.
    log: list[int] = field(default_factory=list)
    #: How many completed trials violate a constraint (``None``: count :attr:`violations`).
    violating: int | None = None

    def __post_init__(self) -> None:
        if not isinstance(self.seen, SeenKeys):
            self.seen = SeenKeys(self.seen)

    def __len__(self) -> int:
        return len(self.archs)

    def any_violation(self) -> bool:
        """Whether some completed trial violated a constraint."""
        if self.violating is not None:
            return self.violating > 0
        return any(v > 0 for v in self.violations)

    def row(self, number: int) -> int:
        """The position of the completed trial numbered ``number`` in the lists."""
        at = bisect.bisect_left(self.numbers, number)
        if at == len(self.numbers) or self.numbers[at] != number:
            raise KeyError(number)
        return at


def _arch_of(trial: FrozenTrial, space: SearchSpace,
             parsed: dict[str, Architecture | None]) -> Architecture | None:
    """The rule of :func:`~frugalnas.ports.trial_architecture.architecture_from`, cached per
    recorded string (an unfinished trial is read on every proposal until it finishes) and
    ``None``, never an error, for an unreadable one: a trial of another space or a partial one
    is not ours to reuse."""
    text = trial.user_attrs.get(ARCHITECTURE_ATTR)
    if text and text in parsed:
        return parsed[text]
    try:
        arch: Architecture | None = architecture_from(text, trial.params, space)
    except Exception:
        arch = None
    if text:
        parsed[text] = arch
    return arch


@dataclass
class FinishedPrefix:
    """What a sampler has read of one study: the history of its finished trials (grown in
    place: finished trials never change), the feed that reads the trials created since the
    last call, and the numbers of the trials read unfinished, read again until they finish.
    So each call of :func:`read_history` reads only what is new or still open."""

    history: History = field(default_factory=lambda: History(violating=0))
    feed: optuna_compat.TrialFeed = field(default_factory=optuna_compat.TrialFeed)
    open: set[int] = field(default_factory=set)
    lock: threading.Lock = field(default_factory=threading.Lock)


def _add_finished(prefix: FinishedPrefix, t: FrozenTrial, arch: Architecture | None) -> None:
    if arch is None:
        return
    h = prefix.history
    h.seen.add(arch.key)
    if t.state != TrialState.COMPLETE or t.values is None:
        return
    diffs = constraint_values(t)
    row = (arch, list(t.values), t.number, violation(t),
           tuple(diffs[k] for k in sorted(diffs)))
    at = len(h.numbers)
    while at and h.numbers[at - 1] > t.number:  # a trial finished after a later-numbered one
        at -= 1
    for column, value in zip((h.archs, h.values, h.numbers, h.violations, h.constraint_diffs), row):
        column.insert(at, value)
    h.log.append(t.number)
    h.violating = (h.violating or 0) + (row[3] > 0)


def read_history(study: optuna.Study, space: SearchSpace, exclude: int,
                 parsed: dict[str, Architecture | None] | None = None,
                 finished: dict[str, FinishedPrefix] | None = None) -> History:
    """The study's history as seen by the trial numbered ``exclude``. ``parsed`` caches
    the architecture strings of unfinished trials and ``finished`` what was read of each
    study (a sampler keeps both across calls): each call reads only the trials created since
    the last one and those still unfinished then, whatever the study's length, and the
    history it returns shares its lists with ``finished`` (nothing is copied)."""
    parsed = {} if parsed is None else parsed
    finished = {} if finished is None else finished
    prefix = finished.get(study.study_name)
    if prefix is None:
        prefix = finished.setdefault(study.study_name, FinishedPrefix())
    pending: set[str] = set()
    with prefix.lock:
        for t in prefix.feed.read(study, prefix.open):
            if t.state.is_finished() and t.number != exclude:
                prefix.open.discard(t.number)
                _add_finished(prefix, t, _arch_of(t, space, parsed))
                parsed.pop(t.user_attrs.get(ARCHITECTURE_ATTR), None)
                continue
            prefix.open.add(t.number)
            if t.number != exclude:  # running or waiting: proposed, so not to be proposed again
                arch = _arch_of(t, space, parsed)
                if arch is not None:
                    pending.add(arch.key)
        done = prefix.history
        return History(done.archs, done.values, done.numbers, SeenKeys(pending, base=done.seen),
                       done.violations, done.constraint_diffs, done.seen, done.log,
                       done.violating)


def fitness(values: Sequence[Sequence[float]], directions: Sequence[StudyDirection],
            violations: Sequence[float] | None = None,
            penalty: float = math.inf) -> np.ndarray:
    """One scalar per trial, higher is better. One objective: the value, negated when it is
    minimised. Several: ``-rank + 0.99 * c / (1 + c)`` with the non-dominated rank and the
    crowding distance ``c`` within that rank (NSGA-II's order, as a number).

    With ``violations`` (each trial's total relative constraint violation) and the default
    ``penalty=inf``, Deb's constrained domination: the fitness above ranks the feasible trials
    (violation 0) among themselves, and every infeasible trial scores below all of them, lower
    the larger its violation. A finite ``penalty`` instead subtracts
    ``penalty * spread * violation`` from an infeasible trial's fitness (``spread``: the
    standard deviation of the unpenalised fitness over all trials), so a trial slightly over a
    bound keeps most of its fitness: a static penalty (Michalewicz & Schoenauer, Evolutionary
    Computation 4(1), 1996). Of two trials with the same value the feasible one still wins."""
    if not len(values):
        return np.zeros(0)
    if violations is not None and any(v > 0 for v in violations):
        viol = np.asarray(violations, dtype=float)
        if math.isfinite(penalty):
            raw = fitness(values, directions)
            return raw - penalty * (float(raw.std()) + 1e-12) * viol
        feasible = viol <= 0
        out = np.empty(len(values))
        if feasible.any():
            out[feasible] = fitness([values[i] for i in np.where(feasible)[0]], directions)
        floor = float(out[feasible].min()) if feasible.any() else 0.0
        out[~feasible] = floor - 1.0 - viol[~feasible]
        return out
    signs = direction_signs(directions)
    obj = np.asarray(values, dtype=float) * signs
    if obj.shape[1] == 1:
        return obj[:, 0]
    ranks = nondominated_ranks(obj)
    out = -ranks.astype(float)
    for r in np.unique(ranks):
        idx = np.where(ranks == r)[0]
        c = np.minimum(crowding(obj[idx]), 1e12)  # boundary points (inf) count as 1e12
        out[idx] += 0.99 * c / (1.0 + c)
    return out
