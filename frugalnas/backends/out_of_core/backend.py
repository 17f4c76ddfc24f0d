"""Built-in plugin: the out-of-core backend (layer swapping and recomputation after KARMA,
Wahib et al., SC20).

Under a memory budget for saved activations, a plan decides per block of the model whether
its activations stay on the device, are swapped to host memory, or are recomputed in
backward. The plan is the cheapest under a cost model fed by a one-off profile of the model
(per architecture and input shape, cached); see ``docs/out_of_core.md``. After each evaluation
the plans it used come back through ``trial_outputs`` (metrics and ``out_of_core_plan.json``).
"""

from __future__ import annotations

import hashlib
import json
import threading
import time
import weakref
from typing import Any

import torch
from torch import nn

from frugalnas.ports.backend import Backend, LossFn
from frugalnas.ports.errors import ConfigError, TrialFailure, check_choice, check_range
from frugalnas.ports.network import BlockNetwork
from frugalnas.backends.out_of_core.hooks import ModelRuntime, StepContext
from frugalnas.backends.out_of_core.cost import RECOMPUTE, RESIDENT, SWAP
from frugalnas.backends.out_of_core.planner import FORCED, PLANNERS, Plan, make_plan
from frugalnas.backends.out_of_core.profile import param_storages, profile_model, run_step
from frugalnas.backends.single_device import resolve_device


def find_blocks(model: nn.Module) -> list[tuple[str, nn.Module]]:
    """The model's blocks in forward order: its ``forward_blocks()`` when it is a
    :class:`~frugalnas.ports.network.BlockNetwork` (NB201 and DAG-space networks), else the
    children of an ``nn.Sequential``; anything else stays resident."""
    if isinstance(model, BlockNetwork):
        modules: list[Any] = list(model.forward_blocks())
    elif isinstance(model, nn.Sequential):
        modules = list(model.children())
    else:
        modules = []
    names = {id(m): name for name, m in model.named_modules()}
    blocks, seen = [], set()
    for i, m in enumerate(modules):
        if isinstance(m, nn.Module) and m is not model and id(m) not in seen:
            seen.add(id(m))
            blocks.append((names.get(id(m), f"block{i}"), m))
    return blocks


def _mib(nbytes: int | None) -> str:
    return "none" if nbytes is None else f"{nbytes / 2**20:.2f} MiB ({nbytes} bytes)"


def structure_key(model: nn.Module) -> str:
    """A digest of the model's class and module tree (its architecture, not its weights)."""
    text = f"{type(model).__module__}.{type(model).__qualname__}\n{model!r}"
    return hashlib.sha1(text.encode()).hexdigest()[:16]


class OutOfCoreBackend(Backend):
    """Keeps saved activations under a budget by swapping blocks to host memory or recomputing them."""

    name = "out-of-core"

    def __init__(self, budget: int | None = None, budget_fraction: float | None = None,
                 policy: str = "plan", host_bandwidth: float | None = None, planner: str = "auto",
                 device: str = "auto", profile_repeats: int = 2):
        if budget is not None and budget_fraction is not None:
            raise ConfigError(f"give budget ({budget!r}) or budget_fraction ({budget_fraction!r}), not both")
        if budget is not None and (not isinstance(budget, int) or isinstance(budget, bool) or budget < 0):
            raise ConfigError(f"invalid budget {budget!r}; expected a number of bytes (int >= 0)")
        if budget_fraction is not None:
            check_range("budget_fraction", budget_fraction, 0.0)
        if host_bandwidth is not None:
            check_range("host_bandwidth", host_bandwidth, 1.0)
        check_choice("policy", policy, FORCED)
        check_choice("planner", planner, PLANNERS)
        check_range("profile_repeats", profile_repeats, 0)
        self.budget, self.budget_fraction = budget, budget_fraction
        self.policy, self.planner = policy, planner
        self.host_bandwidth = host_bandwidth
        self.profile_repeats = int(profile_repeats)
        self._device = resolve_device(device)
        self._runtimes: weakref.WeakKeyDictionary[nn.Module, ModelRuntime] = weakref.WeakKeyDictionary()
        self._plans: dict[str, Plan] = {}
        self.last_plan: Plan | None = None
        self.last_step_peak = 0       # saved bytes held on the device, last step
        self.max_step_peak = 0        # ... since the last reset_peak_memory()
        self.profiles_run = 0
        self._usage = threading.local()  # per evaluating thread: plans used since trial_outputs

    @property
    def device(self) -> torch.device:
        return self._device

    # -- models ----------------------------------------------------------------------
    def _runtime(self, model: nn.Module) -> ModelRuntime:
        runtime = self._runtimes.get(model)
        if runtime is None:
            key = structure_key(model)
            runtime = ModelRuntime(model, find_blocks(model), key)
            self._runtimes[model] = runtime
        return runtime

    def prepare(self, model: nn.Module) -> nn.Module:
        """Move ``model`` to the device and route its blocks' forward through the backend
        (in place: parameters, module tree and state-dict keys are unchanged)."""
        model = model.to(self.device)
        self._runtime(model)
        return model

    def resolve_budget(self, incore_bytes: int) -> int | None:
        """The budget in bytes: ``budget``, or ``budget_fraction`` of the device memory on
        CUDA and of the measured in-core saved bytes on the CPU (``None``: no limit)."""
        if self.budget is not None:
            return self.budget
        if self.budget_fraction is None:
            return None
        if self.device.type == "cuda":
            total = torch.cuda.get_device_properties(self.device).total_memory
            return int(self.budget_fraction * total)
        return int(self.budget_fraction * incore_bytes)

    def plan_for(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor,
                 targets: torch.Tensor) -> Plan:
        """The plan for ``model`` at this micro-batch's shape (profiled and planned once per
        architecture and shape, then cached)."""
        runtime = self._runtime(model)
        key = f"{runtime.key}|{tuple(inputs.shape)}|{inputs.dtype}|{self.device}"
        plan = self._plans.get(key)
        usage = self._thread_usage()
        if plan is None:
            profile = profile_model(model, runtime, self.device, loss_fn, inputs, targets,
                                    self.profile_repeats, self.host_bandwidth,
                                    policies=self._profiled_policies())
            self.profiles_run += 1
            usage["profiles"] += 1
            plan = make_plan(profile, self.resolve_budget(profile.incore_peak), self.planner, self.policy)
            if not plan.feasible and self.policy == "plan":
                raise TrialFailure(
                    f"out-of-core: no plan keeps this network's saved activations within the "
                    f"budget of {_mib(plan.budget)} at input {tuple(inputs.shape)}; the "
                    f"least-memory plan ({plan.counts_text()}) needs {_mib(plan.peak)}: give "
                    "at least that budget, or a smaller batch")
            self._plans[key] = plan
        entry = usage["plans"].setdefault(key, [plan, 0, {
            "architecture_key": runtime.key, "input_shape": list(inputs.shape),
            "dtype": str(inputs.dtype), "device": str(self.device)}])
        entry[1] += 1
        self.last_plan = plan
        return plan

    def _profiled_policies(self) -> tuple[str, ...]:
        """The policies each block is profiled under. Where copies do not overlap compute
        (the CPU) every policy a plan may choose is measured, so that its time counts the
        hooks, allocations and copies; on CUDA, and where a ``host_bandwidth`` is given (a
        host link to model rather than the one measured), the resident profile feeds the
        simulation."""
        if self.device.type == "cuda" or self.policy == RESIDENT or self.host_bandwidth:
            return (RESIDENT,)
        if self.policy != "plan":
            return (RESIDENT, self.policy)
        if self.budget is None and self.budget_fraction is None:
            return (RESIDENT,)
        return (RESIDENT, SWAP, RECOMPUTE)

    def _thread_usage(self) -> dict[str, Any]:
        usage = getattr(self._usage, "record", None)
        if usage is None:
            usage = self._usage.record = {"plans": {}, "profiles": 0, "peak": 0}
        return usage

    # -- steps -----------------------------------------------------------------------
    def forward_backward(self, model: nn.Module, loss_fn: LossFn, inputs: torch.Tensor,
                         targets: torch.Tensor, loss_scale: float = 1.0) -> float:
        start = time.perf_counter()
        x = inputs.to(self.device, non_blocking=True)
        y = targets.to(self.device, non_blocking=True)
        plan = self.plan_for(model, loss_fn, x, y)
        runtime = self._runtime(model)
        ctx = StepContext(plan.policies, self.device, param_storages(model),
                          [b.saved for b in plan.profile.blocks])
        loss, _, _ = run_step(model, runtime, ctx, loss_fn, x, y, loss_scale)
        self.last_step_peak = ctx.tracker.peak
        self.max_step_peak = max(self.max_step_peak, ctx.tracker.peak)
        usage = self._thread_usage()
        usage["peak"] = max(usage["peak"], ctx.tracker.peak)
        if self.device.type != "cuda" and len(plan.measured) < 256:  # (CUDA: it would wait)
            plan.measured.append(time.perf_counter() - start)
        return loss

    def reset_peak_memory(self) -> None:
        super().reset_peak_memory()
        self.max_step_peak = 0

    def peak_memory(self) -> int:
        """CUDA: peak bytes allocated. CPU: peak saved-activation bytes the backend counted
        as held on the device (the quantity the budget bounds)."""
        if self.device.type == "cuda":
            return super().peak_memory()
        return self.max_step_peak

    # -- explaining ------------------------------------------------------------------
    def plan_table(self) -> str:
        """The last plan used, as a table (one row per block)."""
        return self.last_plan.table() if self.last_plan is not None else "(no plan yet)"

    def describe(self) -> dict[str, object]:
        info: dict[str, object] = {**super().describe(), "policy": self.policy,
                                   "planner": self.planner, "budget": self.budget,
                                   "budget_fraction": self.budget_fraction,
                                   "plans_cached": len(self._plans), "profiles_run": self.profiles_run}
        if self.last_plan is not None:
            plan = self.last_plan
            info.update({"plan": list(plan.policies), "plan_method": plan.method,
                         "plan_budget": plan.budget, "plan_feasible": plan.feasible,
                         "plan_est_peak": plan.peak, "plan_est_seconds": plan.time,
                         "plan_table": plan.table()})
        return info

    def trial_outputs(self) -> tuple[dict[str, float], dict[str, str | bytes]]:
        """The plans used by the evaluation that just ran in this thread (nothing if it ran no
        step): ``out_of_core_plan.json`` (every plan with its per-block choices, measured
        figures and estimates, and how many micro-batches used it), ``out_of_core_plan.txt``
        (the tables) and metrics. Counts and the step estimate describe the plan used most;
        ``ooc_predicted_peak_bytes`` is the highest estimate of all plans used."""
        usage = getattr(self._usage, "record", None)
        self._usage.record = None
        if not usage or not usage["plans"]:
            return {}, {}
        used = list(usage["plans"].values())          # [plan, micro-batches, where]
        main = max(used, key=lambda entry: entry[1])[0]
        counts = main.counts()
        metrics = {"ooc_predicted_peak_bytes": float(max(entry[0].peak for entry in used)),
                   "ooc_predicted_step_seconds": float(main.time),
                   "ooc_swapped_layers": float(counts[SWAP]),
                   "ooc_recomputed_layers": float(counts[RECOMPUTE]),
                   "ooc_resident_layers": float(counts[RESIDENT]),
                   "ooc_plan_feasible": float(all(entry[0].feasible for entry in used)),
                   "ooc_plans": float(len(used)), "ooc_profiles": float(usage["profiles"]),
                   "ooc_measured_peak_bytes": float(usage["peak"])}
        if main.budget is not None:
            metrics["ooc_budget_bytes"] = float(main.budget)
        error = main.prediction_error()
        if error is not None:
            metrics["ooc_measured_step_seconds"] = float(main.measured_step())
            metrics["ooc_prediction_error_pct"] = 100.0 * error
        doc = {"backend": self.name, "policy": self.policy, "planner": self.planner,
               "measured_peak_bytes": usage["peak"],
               "plans": [{**where, "micro_batches": uses, **plan.to_dict()}
                         for plan, uses, where in used]}
        tables = "\n\n".join(f"input {tuple(where['input_shape'])}, {uses} micro-batch(es)\n"
                              f"{plan.table()}" for plan, uses, where in used)
        return metrics, {"out_of_core_plan.json": json.dumps(doc, indent=2),
                         "out_of_core_plan.txt": tables + "\n"}

    def close(self) -> None:
        for runtime in list(self._runtimes.values()):
            runtime.unwrap()
        self._runtimes = weakref.WeakKeyDictionary()
