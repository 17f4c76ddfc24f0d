"""Cost model of the out-of-core backend: what a per-block plan costs in time and memory.

In the spirit of KARMA (Wahib et al., SC20), a step is modelled as one compute stream plus a
device-to-host and a host-to-device copy queue. Offloading block ``i``'s saved activations
overlaps the forward of the later blocks (and the head); prefetching it overlaps the
backward of block ``i + 1``; a recomputed block pays its forward again in backward. Where
the device has no copy engine (the CPU), nothing overlaps and every transfer is paid in full;
there the profile measures every block under every policy, and a plan's time is the sum of
what its choices were measured to cost, so the hooks, allocations and copies the simulation
does not see are counted too.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field

RESIDENT, SWAP, RECOMPUTE = "resident", "swap", "recompute"
POLICIES = (RESIDENT, SWAP, RECOMPUTE)


@dataclass
class BlockProfile:
    """Measured figures of one block: forward and backward seconds, bytes of the activations
    it saves for backward (``saved``), and bytes of its input (what recomputation keeps)."""

    name: str
    fwd: float
    bwd: float
    saved: int
    input: int


@dataclass
class Profile:
    """A model's profile at one input shape: its blocks in forward order, the time and saved
    bytes of everything outside the blocks (``head_*``; ``fixed``: saved before or between
    the blocks, held all step; ``tail``: saved after the last block, by the head and the loss,
    which autograd frees before the backward of any block, such as a language model's
    (N, T, vocabulary) log-probabilities), and the host link."""

    blocks: list[BlockProfile]
    head_fwd: float = 0.0
    head_bwd: float = 0.0
    fixed: int = 0
    bandwidth: float = 1e10          # bytes/s of the host link, each direction
    overlap: bool = False            # transfers run beside compute (True on CUDA)
    incore_peak: int = 0             # measured peak of saved bytes with every block resident
    tail: int = 0                    # saved after the last block (head, loss): freed first
    extra: dict[str, float] = field(default_factory=dict)
    #: per policy measured: the blocks' forward and backward seconds under it
    measured: dict[str, tuple[list[float], list[float]]] = field(default_factory=dict)
    step_overhead: float = 0.0       # seconds a step costs the backend outside the model

    def transfer(self, i: int) -> float:
        return self.blocks[i].saved / self.bandwidth

    def incore_time(self) -> float:
        return (self.head_fwd + self.head_bwd + sum(b.fwd + b.bwd for b in self.blocks)
                + self.step_overhead)


def stash(block: BlockProfile, policy: str) -> int:
    """Bytes a block keeps on the device between its forward and its backward."""
    if policy == RESIDENT:
        return block.saved
    if policy == RECOMPUTE:
        return block.input
    return 0


def peak_bytes(profile: Profile, policies: Sequence[str]) -> int:
    """Upper bound of the saved bytes held on the device during a step under ``policies``:
    the stash and the tail at the end of forward, and at each block's backward the stash of
    the blocks below it, the block's own working set, and (where transfers overlap compute)
    the block below it, prefetched; ``fixed`` throughout."""
    blocks = profile.blocks
    n = len(blocks)
    below = [0] * (n + 1)            # below[i] = stash of blocks 0..i-1
    for i, (b, p) in enumerate(zip(blocks, policies)):
        below[i + 1] = below[i] + stash(b, p)
    peak = below[n] + profile.tail
    early = profile.overlap          # prefetch one block ahead only where it can overlap
    if early and n and policies[n - 1] == SWAP:   # prefetched during the head's backward
        peak = max(peak, below[n - 1] + blocks[n - 1].saved + profile.tail)
    for i in range(n - 1, -1, -1):
        b, p = blocks[i], policies[i]
        work = b.saved + (b.input if p == RECOMPUTE else 0)
        ahead = blocks[i - 1].saved if early and i > 0 and policies[i - 1] == SWAP else 0
        peak = max(peak, below[i] + work + ahead)
    return profile.fixed + peak


def step_time(profile: Profile, policies: Sequence[str]) -> float:
    """Predicted seconds of one forward-backward under ``policies``, the backend's own
    per-step cost included. Where transfers do not overlap compute and every policy used
    was profiled, a block costs what it was measured to cost under its policy (its hooks,
    copies and recomputation included); otherwise the step is simulated from the resident
    times, the host link's bandwidth and the overlap (:func:`simulated_step_time`)."""
    if not profile.overlap and set(policies) <= profile.measured.keys():
        t = profile.head_fwd + profile.head_bwd + profile.step_overhead
        for i, (block, p) in enumerate(zip(profile.blocks, policies)):
            fwd, bwd = profile.measured[p]
            # taking activations off the device never speeds a block up: a faster
            # measurement under swap or recompute is noise
            t += max(fwd[i] + bwd[i], block.fwd + block.bwd)
        return t
    return simulated_step_time(profile, policies) + profile.step_overhead


def simulated_step_time(profile: Profile, policies: Sequence[str]) -> float:
    """Simulated seconds of one forward-backward under ``policies``: one compute stream and
    a copy queue each way (KARMA's model), fed by the resident profile."""
    blocks = profile.blocks
    n = len(blocks)
    t = 0.0
    d2h_free = 0.0
    offload_done = [0.0] * n
    for i, (b, p) in enumerate(zip(blocks, policies)):
        t += b.fwd
        if p == SWAP:
            if profile.overlap:
                start = max(t, d2h_free)
                d2h_free = offload_done[i] = start + profile.transfer(i)
            else:
                t += profile.transfer(i)
                offload_done[i] = t
    t += profile.head_fwd
    h2d_free = 0.0
    issue = t                        # prefetch of the last block is issued before backward
    t += profile.head_bwd
    for i in range(n - 1, -1, -1):
        b, p = blocks[i], policies[i]
        start = t                    # gradient reaches block i: prefetch of block i-1 issues
        if p == SWAP:
            if profile.overlap:
                begin = max(issue, h2d_free, offload_done[i])
                h2d_free = begin + profile.transfer(i)
                t = max(t, h2d_free)
            else:
                t += profile.transfer(i)
        if p == RECOMPUTE:
            t += b.fwd
        t += b.bwd
        issue = start
    return t


def isolated_costs(profile: Profile, i: int) -> tuple[float, float]:
    """(swap, recompute) seconds added when only block ``i`` leaves the device."""
    n = len(profile.blocks)
    base = step_time(profile, [RESIDENT] * n)
    costs = []
    for p in (SWAP, RECOMPUTE):
        pol = [RESIDENT] * n
        pol[i] = p
        costs.append(max(0.0, step_time(profile, pol) - base))
    return costs[0], costs[1]
