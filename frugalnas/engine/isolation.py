"""Trial isolation: each trial's evaluation in a child process, so that a candidate that
aborts, segfaults or is killed for memory costs its trial only.

The study's :class:`~frugalnas.engine.runner.TrialRunner` hands the architecture to an
:class:`IsolatedEvaluator`, which keeps evaluation processes (one per concurrent trial,
started on first use with ``python -c``, never forked from the study's process, so torch's
threads and CUDA state are not copied). A child builds the study's plugin host, space,
estimator, backend and dataset once from the study's configuration and evaluates trial
after trial. The estimator sees a :class:`TrialContext` whose study-facing calls
(``report``, ``log_metrics``, ``history``, ``store``, ``artifact_dir``/``artifact_file``) go
over a socket to the parent, which makes them on the study exactly as in-process (the
pruner decides there; ``optuna.TrialPruned`` travels back). The result, the backend's
trial outputs or the exception come back the same way.

When the child dies during a trial, the parent reaps it (``os.wait4``: how it died and its
peak resident memory), fails the trial with one line such as ``candidate process killed by
SIGABRT (peak memory 210 MiB)``, records how it died on the trial (:data:`CRASH_ATTR`) and
starts a fresh child for the next trial. A trial that times out (``trial_timeout``) or is
interrupted kills its child too. A child whose parent dies exits within a second.

A study runs isolated only where the child can build the same components: a strategy that
shares an object in memory with its estimator (a supernet) cannot, nor can a plugin passed
as an object rather than by name, nor a space object that cannot be pickled
(:func:`isolation_obstacle`). A space given as an object or named by a dotted path (a
define-by-run builder) travels to the child pickled with cloudpickle: by reference where its
module can be imported there, by value where it cannot (a function of the running script,
``__main__``).

A define-by-run builder runs in the study's process too; :mod:`frugalnas.engine.builder_guard`
runs each of those replays first in a guard process.
"""

from __future__ import annotations

import contextlib
import os
import sys
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import Connection
from pathlib import Path
from typing import TYPE_CHECKING, Any

import cloudpickle
from optuna.trial import TrialState

from frugalnas.ports import optuna_compat
from frugalnas.ports import strategy as strategy_protocol
from frugalnas.ports.config import ISOLATION_MODES
from frugalnas.ports.errors import ConfigError, TrialFailure, one_line
from frugalnas.ports.estimator import EstimateResult, JSONValue, PastTrial, StudyStore, TrialContext
from frugalnas.ports.keys import ARCHITECTURE_ATTR, CRASH_ATTR
from frugalnas.engine.trial_context import (OptunaStudyStore, study_artifact_dir,
                                            study_artifact_file, study_history)
from frugalnas.host.kinds import BACKENDS, DATASETS, SEARCH_SPACES
from frugalnas.host.dotted import is_dotted, load_dotted
from frugalnas.host.plugins import PluginHost
from frugalnas.engine.builder_guard import unguarded
from frugalnas.engine.child_process import (CandidateFailure, _Child, _ChildDied, _child_start,
                                            _Deadline, _portable, _receive, _send, failure_reason,
                                            trains)

if TYPE_CHECKING:
    from frugalnas.ports.architecture import Architecture
    from frugalnas.ports.config import StudyConfig
    from frugalnas.engine.study import Study

#: A candidate whose evaluation process died this many times is not evaluated again.
MAX_CRASHES = 2
#: How the fail reason of a candidate refused for its crashes starts.
CRASHED_REASON = "candidate refused"


def isolation_obstacle(sampler: Any, host: PluginHost, config: StudyConfig) -> str | None:
    """Why trials of a study with ``config``, strategy ``sampler`` and plugins ``host``
    cannot run in a child process, or ``None`` when they can."""
    return _shared_state(sampler, config) or _rebuild_obstacle(host, config)


def _shared_state(sampler: Any, config: StudyConfig) -> str | None:
    shared = strategy_protocol.shared_states(sampler)
    if shared:
        names = ", ".join(sorted(t.__name__ for t in shared))
        return (f"strategy {config.strategy!r} shares a {names} in memory with the estimator, "
                "which a child process cannot see")
    return None


def _rebuild_obstacle(host: PluginHost, config: StudyConfig) -> str | None:
    """Why a child process cannot build the study's components from ``config``, or None."""
    try:
        space_payload(host, config)
    except Exception as exc:
        return (f"space {config.space!r} cannot be sent to a child process (cloudpickle: "
                f"{one_line(exc)}); define it in a module that the script imports, so that a "
                "child process can import it")
    # The child rebuilds the plugin host from plugin names: the components it creates must
    # not come from a plugin passed as an object (lifecycle plugins stay in the parent).
    objects = {name for name, info in host.infos.items()
               if info.source == "explicit" and name not in host.named_plugins}
    needed = [("estimator", host.estimators().get(config.estimator)),
              ("space", host.registry("search_spaces").get(config.space)),
              ("backend", host.registry("backends").get(config.backend))]
    if config.dataset is not None:
        needed.append(("dataset", host.registry("datasets").get(config.dataset)))
    for kind, component in needed:
        if component.plugin in objects:
            return (f"{kind} {component.name!r} comes from plugin {component.plugin!r}, passed "
                    "as an object; a child process rebuilds the plugins from their names")
    return None


def check_process_isolation(sampler: Any, host: PluginHost, config: StudyConfig) -> None:
    """Raise ConfigError when isolation ``process`` is impossible (:func:`isolation_obstacle`)."""
    obstacle = isolation_obstacle(sampler, host, config)
    if obstacle is not None:
        raise ConfigError(f"isolate 'process' is not possible: {obstacle}; use isolate "
                          "'none' (or 'auto', which runs such studies in-process)")


def resolve_isolation(mode: str, study: Study) -> str:
    """``"none"`` or ``"process"`` for ``mode`` (:data:`ISOLATION_MODES`) and ``study``:
    ``auto`` isolates estimators that train (:func:`trains`) where nothing stands in the
    way, and says in one warning line what does (unless it is a strategy's shared state,
    which runs in-process by design); ``process`` where something does is a ConfigError
    naming it."""
    if mode not in ISOLATION_MODES:
        raise ConfigError(f"invalid isolate {mode!r}; valid: {', '.join(ISOLATION_MODES)}")
    if mode == "none" or (mode == "auto" and not trains(study.estimator)):
        return "none"
    if mode == "process":
        check_process_isolation(study.strategy, study.host, study.config)
        return "process"
    if _shared_state(study.strategy, study.config):
        return "none"
    obstacle = _rebuild_obstacle(study.host, study.config)
    if obstacle is None:
        return "process"
    print(f"frugalnas: warning: trials are evaluated in this process, not isolated: {obstacle}",
          file=sys.stderr, flush=True)
    return "none"


def space_payload(host: PluginHost, config: StudyConfig) -> bytes | None:
    """The study's space object, pickled for a child process, when ``config`` names it by a
    dotted path (a define-by-run builder or a SearchSpace class, given as an object or
    imported): cloudpickle sends a function of the running script (``__main__``) by value,
    one of an importable module by reference. ``None`` for a registered space. Raises what
    pickling raises (an object holding a lock, a file, a connection)."""
    if not is_dotted(config.space):
        return None
    given = host.given_spaces.get(config.space)
    payload: bytes = cloudpickle.dumps(unguarded(given if given is not None
                                                 else load_dotted(config.space)))
    return payload


def crash_count(study: Study, arch: Architecture) -> int:
    """How many trials of ``study`` failed because ``arch``'s evaluation process died."""
    text = str(arch)
    return sum(1 for t in study.optuna_study.get_trials(deepcopy=False,
                                                        states=(TrialState.FAIL,))
               if CRASH_ATTR in t.user_attrs and t.user_attrs.get(ARCHITECTURE_ATTR) == text)


class CrashRecord:
    """:func:`crash_count` for every trial of a study at a cost that does not grow with the
    study: each :meth:`count` reads only the trials created since the last one and those it
    read unfinished (a trial's crash is recorded before it fails, and a finished trial never
    changes)."""

    def __init__(self) -> None:
        self._feed = optuna_compat.TrialFeed()
        self._open: set[int] = set()
        self._counts: dict[str, int] = {}
        self._lock = threading.Lock()

    def count(self, study: Study, arch: Architecture) -> int:
        """How many trials of ``study`` failed because ``arch``'s evaluation process died."""
        with self._lock:
            for t in self._feed.read(study.optuna_study, self._open):
                if not t.state.is_finished():
                    self._open.add(t.number)
                    continue
                self._open.discard(t.number)
                text = t.user_attrs.get(ARCHITECTURE_ATTR)
                if t.state == TrialState.FAIL and CRASH_ATTR in t.user_attrs and text:
                    self._counts[text] = self._counts.get(text, 0) + 1
            return self._counts.get(str(arch), 0)


# -- the parent's side -------------------------------------------------------------------------
class IsolatedEvaluator:
    """Evaluates a study's trials in child processes (see the module); :meth:`close` ends
    them. Thread-safe: concurrent trials (``n_jobs > 1``) each take their own child."""

    def __init__(self, study: Study):
        self.study = study
        self._idle: list[_Child] = []
        self._lock = threading.Lock()

    def _init_message(self) -> dict[str, Any]:
        study = self.study
        return {"sys_path": list(sys.path), "host": study.host.spec(), "config": study.config,
                "space": space_payload(study.host, study.config), "study_name": study.name,
                "directions": tuple(study.directions)}

    def _take(self) -> _Child:
        with self._lock:
            if self._idle:
                return self._idle.pop()
        return _Child(self._init_message())

    def evaluate(self, arch: Architecture, trial: Any, timeout: float | None = None
                 ) -> EstimateResult:
        """``arch`` scored by the study's estimator in a child process, for ``trial``
        (``None``: outside a trial). Raises what the estimator raised (pruning included), a
        :class:`CandidateFailure` when the child died (the trial records how), a
        :class:`TrialFailure` after ``timeout`` seconds."""
        study = self.study
        study.space.validate(arch)
        deadline = None if not timeout else time.monotonic() + float(timeout)
        child = self._take()
        healthy = False
        try:
            child.send(("evaluate", str(arch), None if trial is None else int(trial.number)))
            while True:
                message = child.recv(deadline)
                kind = message[0]
                if kind == "call":
                    child.send(self._answer(trial, message[1], message[2]))
                elif kind == "ready":
                    child.ready = True
                elif kind == "failed":  # it could not build the components
                    raise CandidateFailure("the evaluation process could not start: "
                                           f"{message[1]}")
                elif kind == "done":
                    result: EstimateResult = message[1]
                    metrics, artifacts = message[2], message[3]
                    result.metrics.update(metrics)
                    result.artifacts.update(artifacts)
                    healthy = True
                    return result
                elif kind == "raised":
                    healthy = message[3]
                    exc = message[1]
                    if isinstance(exc, Exception):
                        raise exc
                    raise CandidateFailure(message[2])
        except _ChildDied:
            how, reason = child.reap()
            if not child.ready:  # not the candidate's doing: its error is on stderr
                raise CandidateFailure(f"the evaluation process could not start ({how}; its "
                                       "error is printed above)") from None
            if trial is not None:
                trial.set_user_attr(CRASH_ATTR, how)
            raise CandidateFailure(reason) from None
        except _Deadline:
            raise TrialFailure(f"trial timed out after {timeout:g} s (trial_timeout)") from None
        finally:
            if healthy:
                with self._lock:
                    self._idle.append(child)
            else:
                child.kill()

    def _answer(self, trial: Any, name: str, args: tuple[Any, ...]) -> tuple[str, Any]:
        """Make one study-facing call of the child's context; ``("ok", value)`` or
        ``("err", exception)``."""
        study = self.study
        ostudy = study.optuna_study
        try:
            if name == "report":
                step, metrics, last = args
                if trial is not None:
                    study.report_step(trial, dict(metrics), step, last=last)
                value: Any = None
            elif name == "log_metrics":
                study.log_metrics(dict(args[0]), args[1])
                value = None
            elif name == "history":
                value = study_history(ostudy, study.space, args[0])
            elif name == "store_read":
                value = OptunaStudyStore(ostudy).read()
            elif name == "store_write":
                OptunaStudyStore(ostudy).write(args[0], args[1])
                value = None
            elif name == "artifact_dir":
                value = study_artifact_dir(ostudy, args[0])
            elif name == "artifact_file":
                value = study_artifact_file(ostudy, args[0])
            else:
                raise ValueError(f"unknown call {name!r} from an evaluation process")
            return ("ok", value)
        except Exception as exc:
            return ("err", _portable(exc))

    def close(self) -> None:
        """End the idle children (each releases its backend)."""
        with self._lock:
            children, self._idle = self._idle, []
        for child in children:
            child.close()


# -- the child's side --------------------------------------------------------------------------
class _RemoteStore(StudyStore):
    def __init__(self, call: Any, identity: Any):
        self._call, self._identity = call, identity

    @property
    def identity(self) -> Any:
        return self._identity

    def read(self) -> dict[str, JSONValue]:
        return dict(self._call("store_read"))

    def write(self, key: str, value: JSONValue) -> None:
        self._call("store_write", key, value)


@dataclass
class ChildTrialContext(TrialContext):
    """The port in an evaluation process: the components are the child's own, everything
    about the study is asked of the parent."""

    _conn: Connection | None = field(default=None, kw_only=True, repr=False, compare=False)
    _number: int | None = field(default=None, kw_only=True, repr=False, compare=False)
    _study_name: str | None = field(default=None, kw_only=True, repr=False, compare=False)
    _directions: tuple[str, ...] = field(default=("maximize",), kw_only=True, repr=False,
                                         compare=False)

    def _call(self, name: str, *args: Any) -> Any:
        assert self._conn is not None
        _send(self._conn, ("call", name, args))
        status, value = _receive(self._conn)
        if status == "err":
            raise value
        return value

    @property
    def trial_number(self) -> int | None:
        return self._number

    @property
    def study_name(self) -> str | None:
        return self._study_name

    @property
    def directions(self) -> tuple[str, ...]:
        return self._directions

    def report(self, step: int, metrics: Mapping[str, float], *, last: bool = False) -> None:
        if self._number is not None:
            self._call("report", step, {k: float(v) for k, v in metrics.items()}, last)

    def log_metrics(self, metrics: Mapping[str, float], step: int) -> None:
        self._call("log_metrics", {k: float(v) for k, v in metrics.items()}, step)

    def history(self, states: Sequence[TrialState] | None = (TrialState.COMPLETE,)
                ) -> list[PastTrial]:
        return list(self._call("history", None if states is None else tuple(states)))

    @property
    def store(self) -> StudyStore:
        return _RemoteStore(self._call, ("study", self._study_name))

    def artifact_dir(self, tag: str) -> Path | None:
        path: Path | None = self._call("artifact_dir", tag)
        return path

    def artifact_file(self, name: str) -> Path | None:
        path: Path | None = self._call("artifact_file", name)
        return path


def child_main(fd: int) -> None:
    """An evaluation process: build the components, then evaluate what the parent sends
    until it says close (or goes away)."""
    conn, init = _child_start(fd)
    config = init["config"]
    try:
        host = PluginHost(**init["host"])
        if init.get("space") is not None:  # the parent's space object, pickled
            host.given_spaces[config.space] = cloudpickle.loads(init["space"])
        space = host.create(SEARCH_SPACES, config.space, **config.space_options)
        estimator = host.create_estimator(config.estimator, config.estimator_options)
        backend = host.create(BACKENDS, config.backend, **config.backend_options)
    except Exception as exc:
        reason = failure_reason(exc)
        print(f"frugalnas: error: evaluation process: {reason}", file=sys.stderr, flush=True)
        _send(conn, ("failed", reason))
        os._exit(3)
    _send(conn, ("ready",))
    datasets: list[Any] = []

    def load_dataset(host: PluginHost = host) -> Any:
        if not datasets:
            datasets.append(host.create(DATASETS, config.dataset, seed=config.seed,
                                        **config.dataset_options))
        return datasets[0]

    while True:
        message = _receive(conn)
        if message[0] == "close":
            with contextlib.suppress(Exception):
                backend.release()
            conn.close()
            os._exit(0)
        _, text, number = message
        context = ChildTrialContext(
            space=space, backend=backend, seed=config.seed,
            dataset_loader=load_dataset if config.dataset is not None else None,
            _conn=conn, _number=number, _study_name=init["study_name"],
            _directions=init["directions"])
        try:
            try:
                result = estimator.evaluate(space.parse(text), context)
            finally:
                metrics, artifacts = backend.trial_outputs()
            _send(conn, ("done", result, metrics, artifacts))
        except BaseException as exc:
            # An Exception travels back as itself; SystemExit and the like become the reason.
            healthy = isinstance(exc, Exception)
            travels = _portable(exc) if healthy else None
            _send(conn, ("raised", travels, failure_reason(exc), healthy))
            if not healthy:
                os._exit(1)
