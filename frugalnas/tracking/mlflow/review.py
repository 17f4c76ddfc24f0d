"""The review of a study on its MLflow parent run, kept incrementally.

The parent run shows a leaderboard and a best-so-far (one objective) or Pareto (two
objectives) plot. Rebuilding them from the storage costs time in proportion to the study, and
a study rewrites them every few seconds while trials finish; :class:`StudyReview` instead takes
each completed trial once, when the tracker writes or checks its run, and keeps a bounded
amount of it:

- the leaderboard: the :data:`TOP` best trials (with two objectives, the Pareto front first,
  up to :data:`TOP` of it, then the best by the first objective);
- the best-so-far curve: exactly, as its change points (the trials that improved on every
  lower-numbered trial), whatever order the trials arrive in;
- the plotted trial values: a sample of at most :data:`SAMPLE` trials, every trial whose
  number is a multiple of a stride that doubles whenever the sample would grow beyond that,
  plus the trials of the curve and of the front.

So rendering the review costs the same at 10,000 trials as at 100; only the count of trials
and the trial numbers seen (a set of integers) grow with the study.
"""

from __future__ import annotations

import bisect
import heapq
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from frugalnas.ports.keys import ARCHITECTURE_ATTR, COST_ATTR, METRICS_ATTR
from frugalnas.ports.trial_constraints import recorded_feasible

#: Rows of the leaderboard.
TOP = 100
#: Most trial values drawn on the plot beyond the best-so-far curve or Pareto front.
SAMPLE = 1000


@dataclass(frozen=True)
class ReviewEntry:
    """What the review keeps of one completed trial."""

    number: int
    values: tuple[float, ...]
    architecture: str = ""
    metrics: Mapping[str, float] = field(default_factory=dict)
    cost: Mapping[str, float] = field(default_factory=dict)
    feasible: bool | None = None
    completed: str | None = None


def _dominates(a: Sequence[float], b: Sequence[float], signs: Sequence[int]) -> bool:
    better = False
    for x, y, s in zip(a, b, signs):
        if s * x < s * y:
            return False
        if s * x > s * y:
            better = True
    return better


class StudyReview:
    """The bounded, incrementally kept review of a study's completed trials."""

    def __init__(self, objectives: Sequence[str], directions: Sequence[str]) -> None:
        self.objectives = list(objectives)
        self.directions = list(directions)
        self.signs = [1 if d == "maximize" else -1 for d in self.directions]
        self.seen: set[int] = set()
        self.count = 0
        # (sign * first value, -number) min-heap of the TOP best: the root is the worst kept
        self._top: list[tuple[float, int, ReviewEntry]] = []
        # best-so-far change points, ordered by number: numbers and values rise together
        self._curve_numbers: list[int] = []
        self._curve: list[ReviewEntry] = []
        self.front: list[ReviewEntry] = []
        self.stride = 1
        self._sample: dict[int, tuple[float, ...]] = {}
        #: The first few entries, for what a metric the objective ``value`` equals.
        self.first: list[ReviewEntry] = []

    def wants(self, number: int, values: Sequence[float]) -> bool:
        """Whether a trial not seen yet would change more than the count (so a caller builds
        its :class:`ReviewEntry` only then)."""
        if number in self.seen:
            return False
        key = self.signs[0] * float(values[0])
        return (len(self._top) < TOP or key > self._top[0][0] or len(self.first) < 3
                or len(self.objectives) > 1 or self._improves(number, key)
                or number % self.stride == 0)

    def mark(self, number: int) -> None:
        """Count trial ``number`` without keeping anything of it (:meth:`wants` said no)."""
        if number not in self.seen:
            self.seen.add(number)
            self.count += 1

    def add(self, entry: ReviewEntry) -> None:
        """Take one completed trial (a trial seen before is ignored)."""
        if entry.number in self.seen:
            return
        self.mark(entry.number)
        if len(self.first) < 3:
            self.first.append(entry)
        key = self.signs[0] * entry.values[0]
        item = (key, -entry.number, entry)
        if len(self._top) < TOP:
            heapq.heappush(self._top, item)
        elif item[:2] > self._top[0][:2]:
            heapq.heapreplace(self._top, item)
        if len(self.objectives) == 1:
            self._add_to_curve(entry, key)
        else:
            self._add_to_front(entry)
        if entry.number % self.stride == 0:
            self._sample[entry.number] = entry.values
            while len(self._sample) > SAMPLE:
                self.stride *= 2
                self._sample = {n: v for n, v in self._sample.items() if n % self.stride == 0}

    def _improves(self, number: int, key: float) -> bool:
        i = bisect.bisect_left(self._curve_numbers, number)
        return i == 0 or key > self.signs[0] * self._curve[i - 1].values[0]

    def _add_to_curve(self, entry: ReviewEntry, key: float) -> None:
        if not self._improves(entry.number, key):
            return
        i = bisect.bisect_left(self._curve_numbers, entry.number)
        j = i
        while j < len(self._curve) and self.signs[0] * self._curve[j].values[0] <= key:
            j += 1
        self._curve_numbers[i:j] = [entry.number]
        self._curve[i:j] = [entry]

    def _add_to_front(self, entry: ReviewEntry) -> None:
        if any(_dominates(f.values, entry.values, self.signs) for f in self.front):
            return
        self.front = [f for f in self.front if not _dominates(entry.values, f.values, self.signs)]
        self.front.append(entry)

    # -- what the parent run shows ---------------------------------------------------------
    def best(self) -> ReviewEntry | None:
        """The best trial (one objective; the lowest number among equals)."""
        return self._curve[-1] if self._curve else None

    def curve(self) -> list[tuple[int, float]]:
        """The best-so-far curve's change points (trial number, best value)."""
        return [(e.number, e.values[0]) for e in self._curve]

    def points(self) -> list[tuple[int, tuple[float, ...]]]:
        """The plotted trials: the sample with the curve's or front's trials, by number."""
        shown = dict(self._sample)
        for e in (self._curve if len(self.objectives) == 1 else self.front):
            shown[e.number] = e.values
        return sorted(shown.items())

    def rows(self) -> list[dict[str, Any]]:
        """Leaderboard rows (the fields of :func:`frugalnas.leaderboard.leaderboard_rows`),
        best first: the Pareto front first with several objectives."""
        ranked = sorted(self._top, key=lambda item: (-item[0], -item[1]))
        entries = [item[2] for item in ranked]
        front_numbers: set[int] = set()
        if len(self.objectives) > 1:
            front = sorted(self.front, key=lambda e: (-self.signs[0] * e.values[0], e.number))
            front_numbers = {e.number for e in front}
            entries = front + [e for e in entries if e.number not in front_numbers]
        rows = []
        for rank, e in enumerate(entries[:TOP], start=1):
            front_of: int | None = None
            if len(self.objectives) > 1:
                front_of = 1 if e.number in front_numbers else None
            rows.append({
                "rank": rank, "trial": e.number, "architecture": e.architecture,
                "values": dict(zip(self.objectives, e.values)), "front": front_of,
                "params": None, "flops": None, "cost": dict(e.cost), "metrics": dict(e.metrics),
                "feasible": e.feasible, "datetime_complete": e.completed})
        return rows


def entry_of_report(report: Any) -> ReviewEntry:
    """A :class:`ReviewEntry` from a COMPLETE trial's
    :class:`~frugalnas.ports.trial_report.TrialReport`."""
    from dataclasses import asdict

    cost = {k: float(v) for k, v in asdict(report.cost).items()} if report.cost is not None else {}
    return ReviewEntry(
        number=report.number, values=tuple(float(v) for v in report.values),
        architecture=report.architecture_text or "",
        metrics={k: float(v) for k, v in report.metrics.items()
                 if isinstance(v, (int, float))},
        cost=cost, feasible=report.feasible,
        completed=report.finished.isoformat() if report.finished else None)


def entry_of_trial(frozen: Any) -> ReviewEntry:
    """A :class:`ReviewEntry` from a COMPLETE trial as the storage records it."""
    def numbers(raw: Any) -> dict[str, float]:
        return {k: float(v) for k, v in (raw or {}).items()
                if isinstance(v, (int, float)) and not isinstance(v, bool)}

    return ReviewEntry(
        number=frozen.number, values=tuple(float(v) for v in frozen.values),
        architecture=str(frozen.user_attrs.get(ARCHITECTURE_ATTR, "")),
        metrics=numbers(frozen.user_attrs.get(METRICS_ATTR)),
        cost=numbers(frozen.user_attrs.get(COST_ATTR)),
        feasible=recorded_feasible(frozen),
        completed=frozen.datetime_complete.isoformat() if frozen.datetime_complete else None)
