"""Pruning with several objectives: stop a trial whose intermediate objective vector is
dominated by those of earlier trials at the same step.

optuna's ``Trial.report`` takes one value and its pruners compare one number per step
(optuna issue #3450 asks for more). In a frugalnas study with several objectives the estimator
reports a dict of metrics after each epoch (:meth:`frugalnas.engine.study.Study.report_step`);
the study keeps the vector of the objectives' values on the trial (user attribute
:data:`~frugalnas.ports.keys.INTERMEDIATE_ATTR`) and asks the pruner's :meth:`prune_vector`.

The rule of :class:`ParetoPruner` (``pareto``) at step ``s``: collect the vectors that the other
trials of the study (finished or running) reported at the same step ``s``; sort them together
with the trial's own vector into non-dominated fronts (Deb et al., "A fast and elitist
multiobjective genetic algorithm: NSGA-II", IEEE TEVC 2002); stop the trial when its vector is
not on one of the first ``keep_fronts`` fronts (with the default 1: when some earlier trial was
better or equal in every objective and strictly better in one at that step). It is the
multi-objective counterpart of the median stopping rule (Golovin et al., "Google Vizier",
KDD 2017), which compares a trial with earlier trials at the same step; replacing "worse than
the median" by "dominated" follows the non-dominated ranking used by multi-objective
successive halving (Schmucker et al., "Multi-objective asynchronous successive halving",
arXiv:2106.12639, 2021). Warm-up as in optuna's MedianPruner: nothing is pruned before
``n_startup_trials`` trials have finished or before step ``n_warmup_steps``.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import optuna
from optuna.study import StudyDirection
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.keys import INTERMEDIATE_ATTR
from frugalnas.multiobjective.pareto import (VALID_DIRECTIONS, crowding, direction_signs,
                                             nondominated_ranks)


def nondominated_rank(points: np.ndarray, index: int) -> int:
    """The non-dominated front (0 = the Pareto front) of row ``index`` of ``points``, every
    objective maximised."""
    return int(nondominated_ranks(points)[index])


def intermediate_vectors(trial: FrozenTrial, n_objectives: int) -> dict[int, list[float]]:
    """A trial's intermediate objective vectors by step: the user attribute
    :data:`INTERMEDIATE_ATTR` of a multi-objective frugalnas trial, or optuna's
    ``intermediate_values`` (as 1-vectors) in a single-objective study."""
    stored = trial.user_attrs.get(INTERMEDIATE_ATTR)
    if stored:
        return {int(k): [float(x) for x in v] for k, v in stored.items()}
    if n_objectives == 1:
        return {int(k): [float(v)] for k, v in trial.intermediate_values.items()}
    return {}


class ParetoPruner(optuna.pruners.BasePruner):
    """Stops a trial whose intermediate objective vector at a step is dominated by the vectors
    of other trials at the same step (not on the first ``keep_fronts`` non-dominated fronts).

    ``n_startup_trials``: no pruning until that many trials have finished (COMPLETE or
    PRUNED). ``n_warmup_steps``: no pruning at steps below it. ``interval_steps``: decide every
    that many steps after the warm-up. ``min_trials_at_step``: at least that many other
    trials must have reported the step. ``margin``: the benefit of the doubt, as a fraction of
    each objective's range among the vectors at that step; the trial's vector is moved that
    far in the better direction of every objective before it is compared, so it is stopped
    only when others beat it by more than the margin (an epsilon-dominance test, Laumanns et
    al., Evolutionary Computation 10(3), 2002). ``directions``: the study's (read from the study
    when not given)."""

    def __init__(self, directions: Sequence[str] | None = None, n_startup_trials: int = 5,
                 n_warmup_steps: int = 0, interval_steps: int = 1, keep_fronts: int = 1,
                 min_trials_at_step: int = 1, margin: float = 0.0):
        check_range("pareto n_startup_trials", n_startup_trials, 0)
        check_range("pareto n_warmup_steps", n_warmup_steps, 0)
        check_range("pareto interval_steps", interval_steps, 1)
        check_range("pareto keep_fronts", keep_fronts, 1)
        check_range("pareto min_trials_at_step", min_trials_at_step, 1)
        check_range("pareto margin", margin, 0.0)
        self.directions = _check_directions(directions, "pareto")
        self.n_startup_trials, self.n_warmup_steps = int(n_startup_trials), int(n_warmup_steps)
        self.interval_steps, self.keep_fronts = int(interval_steps), int(keep_fronts)
        self.min_trials_at_step, self.margin = int(min_trials_at_step), float(margin)

    # -- frugalnas's route: a vector per step ----------------------------------------------
    def prune_vector(self, study: optuna.Study, trial_number: int, step: int,
                     values: Sequence[float]) -> bool:
        """Whether the trial ``trial_number`` whose objective vector after ``step`` is
        ``values`` should stop."""
        if not _decides_at(step, self.n_warmup_steps, self.interval_steps):
            return False
        others = _vectors_at_step(study, trial_number, step, len(values), self.n_startup_trials)
        if others is None or len(others) < self.min_trials_at_step:
            return False
        signs = _signs(self.directions, study, len(values), "pareto")
        points = np.asarray([*others, list(values)], dtype=float) * signs
        if self.margin:
            points[-1] += self.margin * np.ptp(points, axis=0)
        return nondominated_rank(points, len(others)) >= self.keep_fronts

    # -- optuna's pruner API ---------------------------------------------------------------
    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        """optuna's entry point: decides on the trial's latest reported step."""
        return _prune_latest(self, study, trial)

    def __repr__(self) -> str:
        return (f"ParetoPruner(n_startup_trials={self.n_startup_trials}, n_warmup_steps="
                f"{self.n_warmup_steps}, interval_steps={self.interval_steps}, keep_fronts="
                f"{self.keep_fronts}, margin={self.margin})")


class ParetoHalvingPruner(optuna.pruners.BasePruner):
    """Asynchronous successive halving on non-dominated rank (after Schmucker et al.,
    "Multi-objective asynchronous successive halving", arXiv:2106.12639, 2021).

    Rungs at steps ``min_resource * reduction_factor ** k``. When a trial reports a rung step,
    it is sorted with every other trial's vector at that step by NSGA-II's order
    (non-dominated rank, then larger crowding distance first); it goes on when it is among the
    best ``ceil(n / reduction_factor)`` of the ``n`` vectors, else it stops. Steps between rungs
    are never pruned. Unlike ``pareto``, which stops every dominated trial, this keeps a fixed
    fraction at each rung whatever the noise, so the compute saved is set by
    ``reduction_factor`` and the number of rungs, and a trial that is dominated only by a
    little can still go on when few trials are ahead of it.

    ``n_startup_trials``: no pruning until that many trials have finished (COMPLETE or
    PRUNED). ``min_trials_at_step``: at least that many other trials must have reported the
    rung. ``directions``: the study's (read from the study when not given)."""

    def __init__(self, directions: Sequence[str] | None = None, n_startup_trials: int = 5,
                 min_resource: int = 1, reduction_factor: int = 2, min_trials_at_step: int = 1):
        check_range("pareto-halving n_startup_trials", n_startup_trials, 0)
        check_range("pareto-halving min_resource", min_resource, 1)
        check_range("pareto-halving reduction_factor", reduction_factor, 2)
        check_range("pareto-halving min_trials_at_step", min_trials_at_step, 1)
        self.directions = _check_directions(directions, "pareto-halving")
        self.n_startup_trials, self.min_resource = int(n_startup_trials), int(min_resource)
        self.reduction_factor = int(reduction_factor)
        self.min_trials_at_step = int(min_trials_at_step)

    def is_rung(self, step: int) -> bool:
        """Whether ``step`` is one of the rungs ``min_resource * reduction_factor ** k``."""
        if step < self.min_resource or step % self.min_resource:
            return False
        ratio = step // self.min_resource
        while ratio % self.reduction_factor == 0:
            ratio //= self.reduction_factor
        return ratio == 1

    def prune_vector(self, study: optuna.Study, trial_number: int, step: int,
                     values: Sequence[float]) -> bool:
        """Whether the trial ``trial_number`` whose objective vector after ``step`` is
        ``values`` should stop."""
        if not self.is_rung(step):
            return False
        others = _vectors_at_step(study, trial_number, step, len(values), self.n_startup_trials)
        if others is None or len(others) < self.min_trials_at_step:
            return False
        signs = _signs(self.directions, study, len(values), "pareto-halving")
        points = np.asarray([*others, list(values)], dtype=float) * signs
        ranks = nondominated_ranks(points)
        crowd = np.zeros(len(points))
        for r in np.unique(ranks):
            idx = np.where(ranks == r)[0]
            crowd[idx] = crowding(points[idx])
        me = len(others)
        # Position of the trial in NSGA-II order; ties with others count against it.
        ahead = sum(1 for i in range(me)
                    if (ranks[i], -crowd[i]) <= (ranks[me], -crowd[me]))
        return ahead >= math.ceil(len(points) / self.reduction_factor)

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        """optuna's entry point: decides on the trial's latest reported step."""
        return _prune_latest(self, study, trial)

    def __repr__(self) -> str:
        return (f"ParetoHalvingPruner(n_startup_trials={self.n_startup_trials}, min_resource="
                f"{self.min_resource}, reduction_factor={self.reduction_factor})")


class HypervolumePruner(optuna.pruners.BasePruner):
    """Stops a trial when too few of the learning curves seen so far would carry it to a
    result that adds hypervolume to the front of the completed trials.

    At step ``s`` every completed trial that reported ``s`` gives one curve: its gain from
    ``s`` to the end, per objective, ``final - value at s`` in the better direction (counted
    as zero when it got worse). Adding each gain to the running trial's vector at ``s`` gives
    one candidate final vector per curve; a candidate "adds hypervolume" when no completed
    trial's final vector is better or equal in every objective (then it would enlarge the
    front's dominated region whatever the reference point). The trial's chance is the share of
    candidates that add hypervolume; it is stopped when the chance is at most ``min_chance``.
    With ``min_chance=0`` (the default) a trial is stopped only when no observed curve would
    make it count; larger values trade hypervolume for compute.

    The rule judges a trial by where it could end rather than by where it is: a trial at
    chance level after one epoch is kept when trials that were there too gained enough to
    reach the front's empty region (a small network where the front is sparse), and a trial
    that leads at a step is stopped when no observed gain lifts it past a completed result
    with fewer resources. How much an early step says about the end is read from the
    study's own curves, so it needs no assumption about the objectives. An objective that
    does not change during training (a parameter count) has no gain and counts as final.

    ``n_startup_trials``: no pruning until that many trials have finished (COMPLETE or
    PRUNED); nothing is pruned either while no completed trial reported the step.
    ``n_warmup_steps``: no pruning at steps below it. ``interval_steps``: decide every that
    many steps after the warm-up. ``min_chance``: in [0, 1). ``directions``: the study's (read
    from the study when not given)."""

    def __init__(self, directions: Sequence[str] | None = None, n_startup_trials: int = 5,
                 n_warmup_steps: int = 0, interval_steps: int = 1, min_chance: float = 0.0):
        check_range("pareto-hv n_startup_trials", n_startup_trials, 0)
        check_range("pareto-hv n_warmup_steps", n_warmup_steps, 0)
        check_range("pareto-hv interval_steps", interval_steps, 1)
        check_range("pareto-hv min_chance", min_chance, 0.0)
        if min_chance >= 1:
            raise ConfigError(f"invalid pareto-hv min_chance {min_chance!r}; valid range: "
                              "[0, 1) (1 or more would stop every trial)")
        self.directions = _check_directions(directions, "pareto-hv")
        self.n_startup_trials, self.n_warmup_steps = int(n_startup_trials), int(n_warmup_steps)
        self.interval_steps, self.min_chance = int(interval_steps), float(min_chance)

    def chance(self, study: optuna.Study, trial_number: int, step: int,
               values: Sequence[float]) -> float | None:
        """The share of completed trials' curves from ``step`` that would carry ``values`` to
        a final vector no completed trial dominates; ``None`` while there is nothing to learn
        from (fewer than ``n_startup_trials`` finished trials, or no completed trial reported
        ``step``)."""
        others = _other_trials(study, trial_number, self.n_startup_trials)
        if others is None:
            return None
        n = len(values)
        signs = _signs(self.directions, study, n, "pareto-hv")
        finals, curves = [], []
        for t in others:
            if t.state != TrialState.COMPLETE or t.values is None or len(t.values) != n:
                continue
            finals.append(t.values)
            vec = intermediate_vectors(t, n).get(step)
            if vec is not None and len(vec) == n:
                curves.append((vec, t.values))
        if not curves:
            return None
        final = np.asarray(finals, dtype=float) * signs
        at_step = np.asarray([u for u, _ in curves], dtype=float) * signs
        ends = np.asarray([f for _, f in curves], dtype=float) * signs
        candidates = np.asarray(values, dtype=float) * signs + np.maximum(ends - at_step, 0.0)
        dominated = (final[None, :, :] >= candidates[:, None, :]).all(axis=2).any(axis=1)
        return float(1.0 - dominated.mean())

    def prune_vector(self, study: optuna.Study, trial_number: int, step: int,
                     values: Sequence[float]) -> bool:
        """Whether the trial ``trial_number`` whose objective vector after ``step`` is
        ``values`` should stop."""
        if not _decides_at(step, self.n_warmup_steps, self.interval_steps):
            return False
        chance = self.chance(study, trial_number, step, values)
        return chance is not None and chance <= self.min_chance

    def prune(self, study: optuna.Study, trial: FrozenTrial) -> bool:
        """optuna's entry point: decides on the trial's latest reported step."""
        return _prune_latest(self, study, trial)

    def __repr__(self) -> str:
        return (f"HypervolumePruner(n_startup_trials={self.n_startup_trials}, n_warmup_steps="
                f"{self.n_warmup_steps}, interval_steps={self.interval_steps}, min_chance="
                f"{self.min_chance})")


def _check_directions(directions: Sequence[str] | None, name: str) -> list[str] | None:
    if directions is None:
        return None
    for d in directions:
        if d not in VALID_DIRECTIONS:
            raise ConfigError(f"invalid direction {d!r} for pruner {name!r}; valid: "
                              f"{', '.join(VALID_DIRECTIONS)}")
    return list(directions)


def _decides_at(step: int, n_warmup_steps: int, interval_steps: int) -> bool:
    """Whether a pruner with this warm-up and interval decides at ``step``."""
    return step >= n_warmup_steps and (step - n_warmup_steps) % interval_steps == 0


def _other_trials(study: optuna.Study, trial_number: int,
                  n_startup_trials: int) -> list[FrozenTrial] | None:
    """The study's other trials (finished or running); ``None`` while fewer than
    ``n_startup_trials`` of them have finished."""
    trials = [t for t in study.get_trials(deepcopy=False, states=(
        TrialState.COMPLETE, TrialState.PRUNED, TrialState.RUNNING)) if t.number != trial_number]
    if sum(1 for t in trials if t.state.is_finished()) < n_startup_trials:
        return None
    return trials


def _vectors_at_step(study: optuna.Study, trial_number: int, step: int, n_objectives: int,
                     n_startup_trials: int) -> list[list[float]] | None:
    """The vectors other trials (finished or running) reported at ``step``; ``None`` while
    fewer than ``n_startup_trials`` other trials have finished."""
    trials = _other_trials(study, trial_number, n_startup_trials)
    if trials is None:
        return None
    others = []
    for t in trials:
        vec = intermediate_vectors(t, n_objectives).get(step)
        if vec is not None and len(vec) == n_objectives:
            others.append(vec)
    return others


def _signs(directions: Sequence[str] | None, study: optuna.Study, n: int,
           name: str) -> np.ndarray:
    if directions is not None:
        dirs = list(directions)
    else:
        dirs = ["maximize" if d == StudyDirection.MAXIMIZE else "minimize"
                for d in study.directions]
    if len(dirs) != n:
        raise ConfigError(f"pruner {name!r} was given {len(dirs)} direction(s) {dirs}; the "
                          f"reported vector has {n} value(s)")
    return direction_signs(dirs)


def _prune_latest(pruner: Any, study: optuna.Study, trial: FrozenTrial) -> bool:
    vectors = intermediate_vectors(trial, len(study.directions))
    if not vectors:
        return False
    step = max(vectors)
    return pruner.prune_vector(study, trial.number, step, vectors[step])


def pareto_pruner(directions: Sequence[str] | None = None, n_startup_trials: int = 5,
                  n_warmup_steps: int = 0, interval_steps: int = 1, keep_fronts: int = 1,
                  min_trials_at_step: int = 1, margin: float = 0.0) -> ParetoPruner:
    """Multi-objective pruning: stop a trial whose objective vector at a step is dominated by
    other trials' vectors at that step (warm-up: n_startup_trials, n_warmup_steps; margin: the
    benefit of the doubt as a fraction of each objective's range)."""
    return ParetoPruner(directions, n_startup_trials=n_startup_trials,
                        n_warmup_steps=n_warmup_steps, interval_steps=interval_steps,
                        keep_fronts=keep_fronts, min_trials_at_step=min_trials_at_step,
                        margin=margin)


def pareto_halving_pruner(directions: Sequence[str] | None = None, n_startup_trials: int = 5,
                          min_resource: int = 1, reduction_factor: int = 2,
                          min_trials_at_step: int = 1) -> ParetoHalvingPruner:
    """Multi-objective successive halving: at steps min_resource * reduction_factor**k keep
    the best 1/reduction_factor of the trials by non-dominated rank and crowding distance."""
    return ParetoHalvingPruner(directions, n_startup_trials=n_startup_trials,
                               min_resource=min_resource, reduction_factor=reduction_factor,
                               min_trials_at_step=min_trials_at_step)


def pareto_hv_pruner(directions: Sequence[str] | None = None, n_startup_trials: int = 5,
                     n_warmup_steps: int = 0, interval_steps: int = 1,
                     min_chance: float = 0.0) -> HypervolumePruner:
    """Multi-objective pruning by hypervolume chance: stop a trial when at most min_chance of
    the completed trials' gains from this step would carry it to a result no completed trial
    dominates."""
    return HypervolumePruner(directions, n_startup_trials=n_startup_trials,
                             n_warmup_steps=n_warmup_steps, interval_steps=interval_steps,
                             min_chance=min_chance)


# optuna's single-objective pruners by name: each a subclass that only gives the one-line
# summary the registry shows, so its options are the optuna class's own signature.
class MedianPruner(optuna.pruners.MedianPruner):
    """optuna's median stopping rule (one objective)."""


class SuccessiveHalvingPruner(optuna.pruners.SuccessiveHalvingPruner):
    """optuna's asynchronous successive halving (one objective)."""


class HyperbandPruner(optuna.pruners.HyperbandPruner):
    """optuna's Hyperband (one objective)."""


class NopPruner(optuna.pruners.NopPruner):
    """No pruning."""


def builtin_pruners() -> dict[str, Any]:
    """The pruners this package registers: ``pareto``, ``pareto-halving`` and ``pareto-hv``
    (several objectives) and optuna's single-objective ones by name."""
    return {
        "pareto": pareto_pruner,
        "pareto-halving": pareto_halving_pruner,
        "pareto-hv": pareto_hv_pruner,
        "median": MedianPruner,
        "successive-halving": SuccessiveHalvingPruner,
        "hyperband": HyperbandPruner,
        "nop": NopPruner,
    }
