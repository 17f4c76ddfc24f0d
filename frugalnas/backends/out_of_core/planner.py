"""Planner of the out-of-core backend: the cheapest per-block policy that meets a budget.

Small models are planned exactly (every assignment of resident/swap/recompute is simulated
with :mod:`.cost`); larger ones greedily: starting from all-resident, take the move with
the best bytes saved per second added until the budget holds, then improve by single-block
changes while any lowers the step time.
"""

from __future__ import annotations

import itertools
import statistics
from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

from frugalnas.ports.errors import check_choice
from frugalnas.backends.out_of_core.cost import POLICIES, RECOMPUTE, RESIDENT, SWAP, Profile, isolated_costs, peak_bytes, step_time

PLANNERS = ("auto", "exact", "greedy")
FORCED = ("plan", RESIDENT, SWAP, RECOMPUTE)
EXACT_MAX_BLOCKS = 9


@dataclass
class Plan:
    """A policy per block, with the model's estimates and whether the budget is met."""

    policies: list[str]
    time: float
    peak: int
    budget: int | None
    feasible: bool
    method: str
    profile: Profile
    #: seconds of the steps run under the plan so far (where the backend times them)
    measured: list[float] = field(default_factory=list)

    def counts(self) -> dict[str, int]:
        return {p: self.policies.count(p) for p in POLICIES}

    def counts_text(self) -> str:
        return ", ".join(f"{n} {p}" for p, n in self.counts().items() if n)

    def measured_step(self) -> float | None:
        """The median measured step, the first one left out when there are others (it
        warms caches up)."""
        steps = self.measured[1:] if len(self.measured) > 1 else self.measured
        return statistics.median(steps) if steps else None

    def prediction_error(self) -> float | None:
        """(predicted - measured) / measured step time; ``None`` before a timed step."""
        measured = self.measured_step()
        return None if not measured else (self.time - measured) / measured

    def to_dict(self) -> dict[str, object]:
        """The plan as plain data (JSON): the choice per block with its measured figures, and
        the estimates (seconds, bytes)."""
        prof = self.profile
        blocks = []
        for i, (b, p) in enumerate(zip(prof.blocks, self.policies)):
            swap, rec = isolated_costs(prof, i)
            blocks.append({"name": b.name, "policy": p, "forward_seconds": b.fwd,
                           "backward_seconds": b.bwd, "saved_bytes": b.saved,
                           "input_bytes": b.input, "swap_added_seconds": swap,
                           "recompute_added_seconds": rec})
        return {"method": self.method, "budget_bytes": self.budget, "feasible": self.feasible,
                "predicted_step_seconds": self.time, "predicted_peak_bytes": self.peak,
                "incore_step_seconds": prof.incore_time(), "incore_peak_bytes": prof.incore_peak,
                "outside_blocks": {"forward_seconds": prof.head_fwd,
                                   "backward_seconds": prof.head_bwd, "saved_bytes": prof.fixed,
                                   "after_blocks_saved_bytes": prof.tail},
                "host_bandwidth": prof.bandwidth, "transfers_overlap": prof.overlap,
                "counts": self.counts(), "blocks": blocks,
                "measured_step_seconds": self.measured_step(),
                "prediction_error": self.prediction_error()}

    def table(self) -> str:
        """The plan explained: one row per block with its measured figures and choice."""
        prof = self.profile
        head = (f"{'block':<24}{'fwd ms':>9}{'bwd ms':>9}{'saved KiB':>12}{'input KiB':>11}"
                f"{'swap ms':>9}{'recomp ms':>10}  choice")
        rows = [head, "-" * len(head)]
        for i, (b, p) in enumerate(zip(prof.blocks, self.policies)):
            swap, rec = isolated_costs(prof, i)
            rows.append(f"{b.name[:23]:<24}{b.fwd * 1e3:9.3f}{b.bwd * 1e3:9.3f}{b.saved / 1024:12.1f}"
                        f"{b.input / 1024:11.1f}{swap * 1e3:9.3f}{rec * 1e3:10.3f}  {p}")
        budget = "none" if self.budget is None else f"{self.budget / 1024:.1f} KiB"
        rows.append("-" * len(head))
        rows.append(f"outside blocks: fwd {prof.head_fwd * 1e3:.3f} ms, bwd {prof.head_bwd * 1e3:.3f} ms, "
                    f"saved {prof.fixed / 1024:.1f} KiB"
                    + (f" + {prof.tail / 1024:.1f} KiB after the blocks (freed before their "
                       "backward)" if prof.tail else "")
                    + f"; host link {prof.bandwidth / 1e9:.2f} GB/s "
                    f"({'overlapped' if prof.overlap else 'not overlapped'})")
        rows.append(f"plan ({self.method}): est. step {self.time * 1e3:.3f} ms vs in-core "
                    f"{prof.incore_time() * 1e3:.3f} ms; est. peak {self.peak / 1024:.1f} KiB, "
                    f"budget {budget}, in-core {prof.incore_peak / 1024:.1f} KiB"
                    + ("" if self.feasible else "; BUDGET NOT MET (least-memory plan used)"))
        error, measured = self.prediction_error(), self.measured_step()
        if error is not None and measured is not None:
            rows.append(f"measured step {measured * 1e3:.3f} ms (median of "
                        f"{max(1, len(self.measured) - 1)}): prediction error {100 * error:+.1f} %")
        return "\n".join(rows)


def _evaluate(profile: Profile, policies: Sequence[str]) -> tuple[float, int]:
    return step_time(profile, policies), peak_bytes(profile, policies)


def _exact(profile: Profile, budget: int) -> list[str] | None:
    best, best_time = None, float("inf")
    for pol in itertools.product(POLICIES, repeat=len(profile.blocks)):
        t, peak = _evaluate(profile, pol)
        if peak <= budget and t < best_time:
            best, best_time = list(pol), t
    return best


def _one_change(pol: list[str]) -> Iterator[list[str]]:
    """Every plan that differs from ``pol`` in one block's policy."""
    for i, current in enumerate(pol):
        for p in POLICIES:
            if p != current:
                yield pol[:i] + [p] + pol[i + 1:]


def _greedy(profile: Profile, budget: int) -> list[str] | None:
    """Cut memory by the change with the most bytes saved per second lost until the budget
    holds, then take any single change that is faster and still fits."""
    pol = [RESIDENT] * len(profile.blocks)
    t, peak = _evaluate(profile, pol)
    while peak > budget:
        best = None
        for cand in _one_change(pol):
            ct, cp = _evaluate(profile, cand)
            if cp >= peak:
                continue
            score = (peak - cp) / max(ct - t, 1e-12)
            if best is None or score > best[0]:
                best = (score, cand, ct, cp)
        if best is None:
            return None
        _, pol, t, peak = best
    improved = True
    while improved:  # each accepted change becomes the base of the next candidates
        improved = False
        for i in range(len(pol)):
            for p in POLICIES:
                if p == pol[i]:
                    continue
                cand = pol[:i] + [p] + pol[i + 1:]
                ct, cp = _evaluate(profile, cand)
                if cp <= budget and ct < t - 1e-12:
                    pol, t, peak, improved = cand, ct, cp, True
    return pol


def _least_memory(profile: Profile) -> list[str]:
    """The uniform plan (all-swap or all-recompute) with the smaller peak."""
    n = len(profile.blocks)
    return min(([SWAP] * n, [RECOMPUTE] * n), key=lambda pol: peak_bytes(profile, pol))


def make_plan(profile: Profile, budget: int | None, planner: str = "auto",
              policy: str = "plan") -> Plan:
    """The plan for ``profile`` under ``budget`` bytes (``None``: no limit). ``policy`` other
    than ``"plan"`` forces one policy on every block (used to compare in benchmarks)."""
    check_choice("planner", planner, PLANNERS)
    check_choice("policy", policy, FORCED)
    n = len(profile.blocks)
    method = planner
    if policy != "plan":
        pol: list[str] | None = [policy] * n
        method = f"forced {policy}"
    elif budget is None:
        pol, method = [RESIDENT] * n, "no budget"
    else:
        if planner == "auto":
            method = "exact" if n <= EXACT_MAX_BLOCKS else "greedy"
        pol = _exact(profile, budget) if method == "exact" else _greedy(profile, budget)
    feasible = pol is not None
    if pol is None:
        pol = _least_memory(profile)
    t, peak = _evaluate(profile, pol)
    feasible = feasible and (budget is None or peak <= budget)
    return Plan(pol, t, peak, budget, feasible, method, profile)
