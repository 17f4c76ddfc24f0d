"""TrialRunner: how a study runs its trials, apart from the study's API.

A :class:`TrialRunner` belongs to one :class:`~frugalnas.engine.study.Study` (``study.runner``)
and does what every way of running trials shares: the plugin session (``start``: bind the
strategy and call ``frugalnas_study_started`` once; ``finish``: ``frugalnas_study_finished``
and release the backend), one trial (:meth:`TrialRunner.run`, optuna's objective: suggest the
architecture, evaluate it under ``trial_timeout``, record metrics, cost and constraints, give
a failure its reason), the :class:`~frugalnas.ports.trial_report.TrialReport` of each finished
trial and the lifecycle hooks that receive it, and the rule that stops a search
(:meth:`TrialRunner.stop_rule`). ``Study.optimize``, ``Study.ask``/``Study.tell`` and the
shared-storage workers (:mod:`frugalnas.distribution.worker`) all run trials through it, as optuna's
``Study`` runs ``_optimize`` and ``_tell``.
"""

from __future__ import annotations

import contextlib
import datetime
import math
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import replace
from typing import TYPE_CHECKING, Any

import optuna
from optuna.trial import FrozenTrial, TrialState

from frugalnas.ports import optuna_compat
from frugalnas.ports import strategy as strategy_protocol
from frugalnas.ports.architecture import Architecture
from frugalnas.ports.errors import (ConfigError, Interrupted, OperationalFailure, PluginHookError,
                                   TrialFailure, one_line, raise_interrupted)
from frugalnas.ports.estimator import EstimateResult
from frugalnas.engine.strategy_services import bind_strategy
from frugalnas.engine.child_process import CandidateFailure, failure_reason
from frugalnas.engine.isolation import (CRASHED_REASON, MAX_CRASHES, CrashRecord,
                                        IsolatedEvaluator, resolve_isolation)
from frugalnas.ports.keys import (ARCHITECTURE_ATTR, CONSTRAINTS_ATTR, COST_ATTR, FAIL_REASON_ATTR,
                                 FEASIBLE_ATTR, INTERRUPTED_PREFIX, METRICS_ATTR, VIOLATION_ATTR)
from frugalnas.engine.storage_url import cause_chain, operational_failure
from frugalnas.ports.trial_constraints import recorded_feasible
from frugalnas.ports.trial_report import TrialReport, per_step_vectors

if TYPE_CHECKING:
    from frugalnas.engine.study import Study

#: The reason given to the plugins for a trial of a dead worker failed by the heartbeat check.
STALE_REASON = "stale trial: its worker stopped sending heartbeats (killed or hung)"

#: A stop rule: given the trial that just finished, the reason to end the search now, or None.
StopCheck = Callable[[FrozenTrial], "str | None"]

#: The signals that stop a run as an :class:`~frugalnas.ports.errors.Interrupted`.
STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


@contextlib.contextmanager
def _handling(handler: Callable[[int, Any], None]) -> Iterator[None]:
    """``handler`` for each of :data:`STOP_SIGNALS` that has Python's default or frugalnas's
    own handler (one the program set itself is left alone), in the main thread only, while
    the block runs."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    ours = (signal.SIG_DFL, signal.default_int_handler, raise_interrupted)
    taken = [sig for sig in STOP_SIGNALS if signal.getsignal(sig) in ours]
    previous = {sig: signal.signal(sig, handler) for sig in taken}
    try:
        yield
    finally:
        for sig, old in previous.items():
            signal.signal(sig, old)


def signals_interrupt() -> contextlib.AbstractContextManager[None]:
    """SIGINT and SIGTERM raise :class:`~frugalnas.ports.errors.Interrupted` naming the
    signal while the block runs, so that what runs trials (``frugalnas run``, a worker) stops
    on ``kill`` as on Ctrl-C (main thread only; a handler the program set is kept)."""
    return _handling(raise_interrupted)


class _StorageLost(BaseException):
    """A full disk under the storage met inside a trial: carried past optuna's catch of
    trial errors (it is no failure of the candidate) to :func:`storage_failures_stop`."""

    def __init__(self, failure: OperationalFailure):
        super().__init__(str(failure))
        self.failure = failure


@contextlib.contextmanager
def storage_failures_stop() -> Iterator[None]:
    """Around optuna's ``optimize``: a full disk under the storage met inside a trial stops
    the search as the :class:`OperationalFailure` it is (one line on the command line)."""
    try:
        yield
    except _StorageLost as lost:
        raise lost.failure from lost.__cause__


class Candidate:
    """A trial handed out by :meth:`Study.ask`, with the architecture to evaluate."""

    def __init__(self, trial: optuna.Trial, architecture: Architecture):
        self.trial, self.architecture = trial, architecture

    @property
    def number(self) -> int:
        return self.trial.number


class StopRule:
    """An optuna callback that ends ``optimize`` after a trial: at the first of ``checks``
    that gives a reason, else when the study's strategy chain says its search is over
    (reason ``"strategy"``). :attr:`reason` says which stopped it (``None``: none did)."""

    def __init__(self, runner: "TrialRunner", checks: Sequence[StopCheck] = ()):
        self.runner, self.checks = runner, tuple(checks)
        self.reason: str | None = None

    @property
    def needed(self) -> bool:
        """Whether anything can stop the search (optuna copies every finished trial for
        callbacks, so a callback that can never stop is better left out)."""
        return bool(self.checks) or strategy_protocol.can_stop(self.runner.study.strategy)

    def __call__(self, ostudy: optuna.Study, frozen: FrozenTrial) -> None:
        for check in self.checks:
            reason = check(frozen)
            if reason:
                self.reason = reason
                ostudy.stop()
                return
        if self.runner.search_is_over():
            self.reason = "strategy"
            ostudy.stop()


class TrialRunner:
    """Runs the trials of one study and keeps its plugin session (see the module)."""

    def __init__(self, study: "Study"):
        self.study = study
        self._started = False
        self._errors_lock = threading.Lock()
        #: Where trials are evaluated: ``"none"`` (in this process) or ``"process"`` (a
        #: child process per concurrent trial, :mod:`frugalnas.engine.isolation`).
        self.isolation = "none"
        self._isolated: IsolatedEvaluator | None = None
        self._crashes = CrashRecord()
        self._ever_isolated = False
        #: Whether this thread is inside a trial's objective (:meth:`run`), and a stop signal
        #: that came while optuna created or recorded a trial (see :meth:`interrupts`).
        self._in_objective = False
        self._pending: int | None = None

    def isolate(self, mode: str) -> str:
        """Set where trials are evaluated (``auto``, ``none`` or ``process``, see
        :func:`~frugalnas.engine.isolation.resolve_isolation`); returns the resolved mode."""
        self.isolation = resolve_isolation(mode, self.study)
        return self.isolation

    # -- the session ---------------------------------------------------------------------
    @property
    def started(self) -> bool:
        """Whether a session is open (between :meth:`start` and :meth:`finish`)."""
        return self._started

    def start(self) -> None:
        """Open the plugin session, once: bind the strategy chain to the study and call
        ``frugalnas_study_started``."""
        if not self._started:
            self._started = True
            bind_strategy(self.study.strategy, self.study)
            self.notify("frugalnas_study_started", study=self.study)

    def finish(self) -> None:
        """Close the session: ``frugalnas_study_finished``, then release the backend."""
        if self._started:
            self._started = False
            try:
                self.notify("frugalnas_study_finished", study=self.study)
            finally:
                isolated, self._isolated = self._isolated, None
                if isolated is not None:
                    isolated.close()
                backend = self.study._backend  # only when the study created one
                if backend is not None:
                    backend.release()

    # -- stopping ------------------------------------------------------------------------
    def search_is_over(self) -> bool:
        """The one stop rule of every run: the strategy chain's ``should_stop(study)``."""
        return strategy_protocol.should_stop(self.study.strategy, self.study.optuna_study)

    def stop_rule(self, *checks: StopCheck) -> StopRule:
        """The callback for ``optuna.Study.optimize`` that stops at ``checks`` (a worker's
        own limits) or when :meth:`search_is_over`."""
        return StopRule(self, checks)

    # -- one trial -----------------------------------------------------------------------
    def propose(self, trial: optuna.Trial) -> Architecture:
        """The trial's architecture from the strategy (``space.suggest``), recorded on the
        trial; ``frugalnas_trial_started`` is called."""
        arch = self.study.space.suggest(trial)
        trial.set_user_attr(ARCHITECTURE_ATTR, str(arch))
        self.notify("frugalnas_trial_started", study=self.study, trial=trial, architecture=arch)
        return arch

    def run(self, trial: optuna.Trial) -> float | Sequence[float]:
        """Run one trial (optuna's objective): propose, evaluate under ``trial_timeout``,
        record; a failure gets its reason (user attribute ``fail_reason``) and is raised on
        for optuna to record, a pruned trial raises ``optuna.TrialPruned``. The plugins get a
        :class:`TrialReport` in every case. An interrupt (Ctrl-C, SIGTERM) fails the trial
        with the signal named and is raised on."""
        arch: Architecture | None = None
        self._in_objective = True
        try:
            self.raise_pending()
            try:
                arch = self.propose(trial)
            except Exception as exc:
                self.check_storage(exc)
                self.proposal_failed(trial, exc)
                raise
            return self.evaluate_and_record(trial, arch)
        except KeyboardInterrupt as exc:
            self._in_objective = False  # another signal waits until the trial is recorded
            self.interrupted(trial, arch, exc)
            raise
        finally:
            self._in_objective = False

    def evaluate_and_record(self, trial: optuna.Trial, arch: Architecture
                            ) -> float | Sequence[float]:
        """The rest of :meth:`run` once ``arch`` is proposed."""
        study = self.study
        try:
            self.refuse_crashed(arch)
            with trial_timeout(study.config.trial_timeout):
                result = self.evaluate(arch, trial)
            values = study.objective_values(result)
        except optuna.TrialPruned as exc:
            steps = study._intermediate.pop(trial.number, None)
            self.finished(trial, arch, TrialState.PRUNED, error=str(exc), steps=steps)
            raise
        except Exception as exc:
            steps = study._intermediate.pop(trial.number, None)
            self.check_storage(exc)
            reason = failure_reason(exc)
            trial.set_user_attr(FAIL_REASON_ATTR, reason)
            self.finished(trial, arch, TrialState.FAIL, error=reason, steps=steps)
            raise
        steps = study._intermediate.pop(trial.number, None)
        self.record(trial, result)
        self.finished(trial, arch, TrialState.COMPLETE, values, result, steps=steps)
        return values if len(values) > 1 else values[0]

    def proposal_failed(self, trial: optuna.Trial, exc: Exception) -> None:
        """Give ``trial``, whose proposal raised ``exc``, its fail reason, unless the storage
        recorded one (a worker's duplicate check does)."""
        with contextlib.suppress(Exception):
            stored = optuna_compat.storage_of(self.study.optuna_study).get_trial(
                optuna_compat.trial_id(trial))
            if FAIL_REASON_ATTR not in stored.user_attrs:
                trial.set_user_attr(FAIL_REASON_ATTR, failure_reason(exc))

    def set_fail_reason(self, trial: optuna.Trial, reason: str) -> None:
        """Record why ``trial`` failed (user attribute ``fail_reason``); a storage that
        refuses the write leaves it without one."""
        with contextlib.suppress(Exception):
            trial.set_user_attr(FAIL_REASON_ATTR, reason)

    def interrupted(self, trial: optuna.Trial, arch: Architecture | None,
                    exc: KeyboardInterrupt) -> None:
        """Record ``trial`` as stopped by the signal of ``exc`` (optuna then fails it) and
        tell the plugins, so that its MLflow run is closed KILLED."""
        signum = exc.signum if isinstance(exc, Interrupted) else int(signal.SIGINT)
        reason = f"{INTERRUPTED_PREFIX}{Interrupted(signum).signal_name}"
        steps = self.study._intermediate.pop(trial.number, None)
        self.set_fail_reason(trial, reason)
        if arch is not None:
            self.finished(trial, arch, TrialState.FAIL, error=reason, steps=steps)

    # -- interrupts ----------------------------------------------------------------------
    def interrupts(self, in_this_thread: bool = True) -> contextlib.AbstractContextManager[None]:
        """Around optuna's loop of trials: SIGINT and SIGTERM stop it as
        :class:`~frugalnas.ports.errors.Interrupted`, and no trial is left RUNNING. A signal
        that comes inside a trial's objective (proposal, evaluation, recording) is raised
        there: the trial fails with the signal named (:meth:`interrupted`). One that comes
        while optuna creates or records a trial (storage writes, outside the objective) waits
        for that to end: the search stops before another trial, and a trial being created
        fails as its objective starts; a second signal is raised at once.
        ``in_this_thread=False`` (trials in threads, ``n_jobs > 1``): raised at once."""
        if not in_this_thread:
            return signals_interrupt()
        return self._deferred_interrupts()

    @contextlib.contextmanager
    def _deferred_interrupts(self) -> Iterator[None]:
        self._pending = None
        with _handling(self._on_signal):
            yield
        self.raise_pending()  # after an exception it stays for raise_pending to raise

    def _on_signal(self, signum: int, frame: Any) -> None:
        if self._in_objective or self._pending is not None:
            raise Interrupted(signum)
        self._pending = signum
        with contextlib.suppress(RuntimeError):  # outside optuna's loop: nothing to stop
            self.study.optuna_study.stop()

    def raise_pending(self) -> None:
        """Raise the :class:`~frugalnas.ports.errors.Interrupted` of a signal that came while
        optuna created or recorded a trial (see :meth:`interrupts`)."""
        signum, self._pending = self._pending, None
        if signum is not None:
            raise Interrupted(signum)

    def check_storage(self, exc: Exception) -> None:
        """Raise :class:`_StorageLost` when ``exc`` is the storage's disk filling up (a
        write of optuna's storage failed), not a failure of the candidate."""
        if not any(isinstance(e, optuna.exceptions.StorageInternalError)
                   for e in cause_chain(exc)):
            return
        failure = operational_failure(exc, optuna_compat.storage_url(self.study.optuna_study),
                                      disk_only=True)
        if failure is not None:
            raise _StorageLost(failure) from exc

    def evaluate(self, arch: Architecture, trial: optuna.Trial) -> EstimateResult:
        """``study.evaluate`` in this process, or in a child process when isolated."""
        if self.isolation != "process":
            return self.study.evaluate(arch, trial)
        if self._isolated is None:
            self._isolated = IsolatedEvaluator(self.study)
            self._ever_isolated = True
        return self._isolated.evaluate(arch, trial, self.study.config.trial_timeout)

    def refuse_crashed(self, arch: Architecture) -> None:
        """Raise :class:`CandidateFailure` for a candidate whose evaluation process died
        :data:`MAX_CRASHES` times: it is not evaluated again."""
        # Only an isolated evaluation records a crash; an in-memory storage is written by
        # this process alone, so without one here it holds none (and the read is saved).
        if not self._ever_isolated and optuna_compat.is_in_memory(self.study.optuna_study):
            return
        crashes = self._crashes.count(self.study, arch)
        if crashes >= MAX_CRASHES:
            raise CandidateFailure(f"{CRASHED_REASON}: its evaluation process died in "
                                   f"{crashes} trials; it is not evaluated again")

    def ask(self) -> Candidate:
        """A new trial and its architecture (opens the session if needed)."""
        self.start()
        trial = self.study.optuna_study.ask()
        return Candidate(trial, self.propose(trial))

    def tell(self, candidate: Candidate,
             values: float | Sequence[float] | EstimateResult | None = None,
             state: TrialState | None = None) -> FrozenTrial:
        """Finish a trial from :meth:`ask` with its values (or an :class:`EstimateResult`)."""
        study = self.study
        result: EstimateResult | None = None
        if isinstance(values, EstimateResult):
            result = values
            self.record(candidate.trial, result)
            values = study.objective_values(result)
        if state is None:
            state = TrialState.COMPLETE if values is not None else TrialState.FAIL
        vals = None if values is None else ([float(values)] if isinstance(values, (int, float))
                                            else list(values))
        if (result is None and vals is not None and state == TrialState.COMPLETE
                and study.config.constraints):
            by_name = dict(zip(study.config.objectives, vals))

            def lookup(name: str) -> float:
                if name not in by_name:
                    raise ConfigError(f"constraint {name!r} is not an objective; tell() needs "
                                      "the EstimateResult (tell(candidate, result)) to check it")
                return by_name[name]

            self.record_constraints(candidate.trial, lookup)
        frozen = study.optuna_study.tell(candidate.trial,
                                         vals if state == TrialState.COMPLETE else None,
                                         state=state)
        self.finished(candidate.trial, candidate.architecture, state, vals, result)
        return frozen

    def report_stale(self, frozen: FrozenTrial) -> None:
        """Tell the plugins that a trial of a dead worker was failed by the heartbeat check.
        A trial killed before its architecture could be read is left to the storage (the
        MLflow plugin's reconciliation writes it)."""
        study = self.study
        report = TrialReport.from_frozen(frozen, study.space, study.config.objectives,
                                         error=STALE_REASON)
        if report.architecture is not None:
            self.notify("frugalnas_trial_finished", study=study, report=report)

    # -- recording -----------------------------------------------------------------------
    def record(self, trial: Any, result: EstimateResult) -> None:
        """A completed evaluation's metrics and cost (and constraints) as user attributes."""
        trial.set_user_attr(METRICS_ATTR, {k: float(v) for k, v in result.metrics.items()})
        trial.set_user_attr(COST_ATTR, result.cost.record())
        if self.study.config.constraints:
            self.record_constraints(trial, result.objective)

    def record_constraints(self, trial: Any, lookup: Callable[[str], float]) -> None:
        """Each constraint's ``value - bound`` (optuna's convention: <= 0 is feasible), the
        feasibility and the total relative violation, as user attributes; with optuna >= 5
        also ``trial.set_constraint``, which optuna's samplers and best trials read."""
        config = self.study.config
        diffs: dict[str, float] = {}
        for name, bound in config.constraints.items():
            try:
                value = float(lookup(name))
            except KeyError:
                raise TrialFailure(f"constraint {name!r}: estimator {config.estimator!r} "
                                   "did not produce this metric") from None
            if not math.isfinite(value):
                raise TrialFailure(f"constraint {name!r}: the metric is not finite: {value}")
            diffs[name] = value - bound
        violation = sum(max(0.0, d) / max(abs(b), 1e-12)
                        for d, b in zip(diffs.values(), config.constraints.values()))
        trial.set_user_attr(CONSTRAINTS_ATTR, diffs)
        trial.set_user_attr(FEASIBLE_ATTR, violation == 0.0)
        trial.set_user_attr(VIOLATION_ATTR, violation)
        if hasattr(trial, "set_constraint"):  # optuna >= 5
            for name, d in diffs.items():
                trial.set_constraint(name, d)

    def report(self, trial: optuna.Trial, arch: Architecture, state: TrialState,
               values: Sequence[float] | None = None, result: EstimateResult | None = None,
               error: str | None = None,
               steps: dict[str, list[float]] | None = None) -> TrialReport:
        """The :class:`TrialReport` of a trial this process ran, as it finishes. ``steps``:
        its per-step objective vectors (by default, those the study holds for it)."""
        if steps is None:  # what report_step also stored as INTERMEDIATE_ATTR
            steps = self.study._intermediate.get(trial.number)
        constrained = bool(self.study.config.constraints)
        metrics: dict[str, float] = {}
        if result is not None:
            metrics["value"] = float(result.value)
            metrics.update({k: float(v) for k, v in result.metrics.items()})
        return TrialReport._normalised(
            number=trial.number, state=state, architecture=arch,
            values=tuple(float(v) for v in values)
            if values is not None and state == TrialState.COMPLETE else None,
            metrics=metrics,
            cost=replace(result.cost) if result is not None else None, error=error,
            artifacts=result.artifacts if result is not None else {},
            started=trial.datetime_start, finished=datetime.datetime.now(),
            intermediate=per_step_vectors(steps) if steps else {},
            feasible=recorded_feasible(trial) if constrained else None)

    def finished(self, trial: optuna.Trial, arch: Architecture, state: TrialState,
                 values: Sequence[float] | None = None, result: EstimateResult | None = None,
                 error: str | None = None,
                 steps: dict[str, list[float]] | None = None) -> TrialReport:
        """Build the trial's report and call ``frugalnas_trial_finished`` with it."""
        report = self.report(trial, arch, state, values, result, error, steps)
        self.notify("frugalnas_trial_finished", study=self.study, report=report)
        return report

    # -- plugins -------------------------------------------------------------------------
    def notify(self, hook: str, **kwargs: Any) -> None:
        """Call a lifecycle hook implementation by implementation: one that raises is
        recorded in ``study.plugin_errors`` (and reported once on stderr) and the others
        run."""
        self.study.host.call_each(hook, kwargs,
                                  lambda plugin, exc: self._plugin_failed(plugin, hook, exc))

    def _plugin_failed(self, plugin: str, hook: str, exc: BaseException) -> None:
        errors = self.study.plugin_errors
        with self._errors_lock:
            for known in errors:
                if (known.plugin, known.hook) == (plugin, hook):
                    known.count += 1
                    return
            operational = isinstance(exc, OperationalFailure)
            error = PluginHookError(plugin, hook, str(exc) if operational else one_line(exc),
                                    operational=operational)
            errors.append(error)
        if operational:  # the machine failed: the command's one closing line says it
            return
        print(f"frugalnas: warning: {error}; the study goes on (repeats are counted in "
              "study.plugin_errors)", file=sys.stderr, flush=True)


def trial_timeout(seconds: float | None) -> contextlib.AbstractContextManager[None]:
    """Raise TrialFailure after ``seconds`` (none: no limit). Uses SIGALRM, so it applies in
    the main thread (``n_jobs=1``); in worker threads the limit is checked when the evaluation
    returns."""
    return _time_limit(seconds) if seconds else contextlib.nullcontext()


@contextlib.contextmanager
def _time_limit(seconds: float) -> Iterator[None]:
    start = time.monotonic()
    if threading.current_thread() is threading.main_thread() and hasattr(signal, "setitimer"):
        def on_alarm(signum: int, frame: Any) -> None:
            raise TrialFailure(f"trial timed out after {seconds:g} s (trial_timeout)")

        previous = signal.signal(signal.SIGALRM, on_alarm)
        # The alarm repeats until cleared: Python drops an exception raised while a weakref or
        # GC callback runs ("Exception ignored in ..."), so a single alarm can be lost.
        signal.setitimer(signal.ITIMER_REAL, seconds, min(seconds, 1.0))
        try:
            yield
        finally:
            signal.setitimer(signal.ITIMER_REAL, 0)
            signal.signal(signal.SIGALRM, previous)
    else:
        yield
        if time.monotonic() - start > seconds:
            raise TrialFailure(f"trial timed out after {seconds:g} s (trial_timeout)")
