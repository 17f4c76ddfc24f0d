"""The builder's guard: each replay of a define-by-run builder that the study's process would
run (discovering the space's decisions, proposing, parsing and varying architectures) runs
first in a guard process of its own (:class:`BuilderGuard`), answered by the study's process
decision by decision; only a replay that ended there runs in the study's process. A builder
that kills its process (``os.abort()``, a segfault) is then a one-line error naming the builder
and the decisions it had made: before the first trial while the space is discovered, or a FAIL
trial when it was proposed. The guard process is started as the evaluation processes are
(:mod:`frugalnas.engine.isolation`)."""

from __future__ import annotations

import atexit
import functools
import inspect
import os
import sys
import threading
import time
from collections.abc import Callable, Mapping
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import cloudpickle

from frugalnas.host.dotted import is_dotted, load_dotted
from frugalnas.host.plugins import PluginHost

if TYPE_CHECKING:
    from frugalnas.ports.config import StudyConfig
from frugalnas.engine.child_process import (CandidateFailure, _Child, _ChildDied, _child_start,
                                            _Deadline, _portable, _receive, _send,
                                            failure_reason, trains)


#: The attribute of a guarded builder function that holds its :class:`BuilderGuard`.
GUARD_ATTR = "frugalnas_builder_guard"


class BuilderCrash(CandidateFailure):
    """The guard process of a define-by-run builder died while the builder ran."""


class BuilderGuard:
    """Runs a define-by-run builder in a process of its own (started on first use, again
    after it died) with the answers of a trial of the study's process, asked decision by
    decision (see the module). Thread-safe and re-entrant: a replay whose answers come from
    a strategy that replays the builder itself (to sample or mutate) nests in the same
    process."""

    def __init__(self, builder: Callable[..., Any]):
        self.builder = builder
        self._payload = cloudpickle.dumps(builder)
        self._child: _Child | None = None
        self._lock = threading.RLock()

    def check(self, trial: Any, options: Mapping[str, Any]) -> None:
        """Run the builder with ``options`` in the guard process, its decisions answered by
        ``trial``. Raises what the builder (or ``trial``) raised there, or
        :class:`BuilderCrash` when the process died."""
        import torch  # a builder needs torch; loaded only with one

        device = str(torch.get_default_device())
        with self._lock:
            child = self._running()
            clean, raised_here = False, None
            try:
                child.send(("build", dict(options), int(trial.num_classes),
                            tuple(trial.input_shape), device))
                while True:
                    message = child.recv(None)
                    if message[0] == "ask":
                        try:
                            answer: tuple[str, Any] = ("ok", _suggest(trial, *message[1:]))
                        except Exception as exc:
                            raised_here, answer = exc, ("err", _portable(exc))
                        child.send(answer)
                        continue
                    clean = True
                    if raised_here is not None:
                        raise raised_here
                    if message[0] == "raised":
                        raise message[1]
                    return
            except _ChildDied:
                if raised_here is not None:  # a nested replay's crash, already named
                    raise raised_here from None
                raise BuilderCrash(_died(child.reap()[0])) from None
            finally:
                if not clean:
                    child.kill()
                    if self._child is child:
                        self._child = None

    def _running(self) -> _Child:
        if self._child is None:
            child = _Child({"sys_path": list(sys.path), "builder": self._payload},
                           entry="frugalnas.engine.builder_guard:guard_main")
            try:
                message = child.recv(time.monotonic() + 300)
            except (_ChildDied, _Deadline):
                child.kill()
                raise BuilderCrash(f"{_died(child.reap()[0])} before the builder "
                                   "ran") from None
            if message[0] != "ready":
                child.kill()
                raise BuilderCrash(f"its process could not load the builder: {message[1]}")
            self._child = child
        return self._child

    def close(self) -> None:
        """End the guard process."""
        with self._lock:
            child, self._child = self._child, None
        if child is not None:
            child.kill()


def _suggest(trial: Any, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``trial.<method>(*args, **kwargs)`` for one of the builder's suggest calls."""
    calls = {"suggest_categorical": trial.suggest_categorical,
             "suggest_int": trial.suggest_int, "suggest_float": trial.suggest_float}
    return calls[method](*args, **kwargs)


def _died(how: str) -> str:
    """``"its process was killed by SIGABRT"`` or ``"its process ended (exit 3)"``."""
    return (f"its process ended ({how})" if how.startswith("exit")
            else f"its process was killed by {how}")


def guarded(builder: Callable[..., Any]) -> Callable[..., Any]:
    """``builder`` that runs first in a :class:`BuilderGuard`'s process and then here, with
    the same answers (a replay here asks each decision once)."""
    guard = BuilderGuard(builder)
    atexit.register(guard.close)

    @functools.wraps(builder)
    def run_guarded(trial: Any, *args: Any, **options: Any) -> Any:
        guard.check(trial, options)
        return builder(trial, *args, **options)

    run_guarded.__dict__[GUARD_ATTR] = guard
    return run_guarded


def unguarded(space: Any) -> Any:
    """The builder a :func:`guarded` function runs; any other object as it is."""
    guard = space.__dict__.get(GUARD_ATTR) if inspect.isfunction(space) else None
    return guard.builder if isinstance(guard, BuilderGuard) else space


def guard_builder(host: PluginHost, config: StudyConfig, mode: str) -> bool:
    """Where trials will be isolated (``mode`` ``process``, or ``auto`` with an estimator
    that trains), make the define-by-run builder that ``config.space`` names (a dotted path,
    or an object given to ``host``) run first in a guard process whenever this process runs
    it (:func:`guarded`). Call it before the space is created: its discovery is covered too.
    Whether the builder is guarded now."""
    if mode == "none" or not is_dotted(config.space):
        return False
    given = host.given_spaces.get(config.space)
    given = given if given is not None else load_dotted(config.space)
    if not inspect.isfunction(given) or unguarded(given) is not given:
        return False
    if mode == "auto":
        try:
            estimator = host.create_estimator(config.estimator, config.estimator_options)
        except Exception:  # the configuration's checks say what is wrong
            return False
        if not trains(estimator):
            return False
    try:
        host.given_spaces[config.space] = guarded(given)
    except Exception:  # it cannot be pickled: isolation is refused, or runs in-process
        return False
    return True


class _RemoteModelTrial:
    """The trial a builder receives in its guard process: ``num_classes``,
    ``input_shape`` and ``in_channels``, and ``suggest_*`` calls answered by the parent."""

    def __init__(self, conn: Connection, builder: Callable[..., Any], num_classes: int,
                 input_shape: tuple[int, ...]):
        self._conn, self._builder = conn, builder
        self.num_classes = int(num_classes)
        self.input_shape = tuple(input_shape)
        self.in_channels = int(input_shape[0])

    def _ask(self, method: str, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        _send(self._conn, ("ask", method, args, kwargs))
        while True:
            message = _receive(self._conn)
            if message[0] == "build":  # the parent replays the builder to answer: nested
                _build(self._conn, self._builder, message)
                continue
            status, value = message
            if status == "err":
                raise value
            return value

    def suggest_categorical(self, name: str, choices: Any) -> Any:
        return self._ask("suggest_categorical", (name, list(choices)), {})

    def suggest_int(self, name: str, low: int, high: int, *, step: int = 1,
                    log: bool = False) -> Any:
        return self._ask("suggest_int", (name, low, high), {"step": step, "log": log})

    def suggest_float(self, name: str, low: float, high: float, *, step: float | None = None,
                      log: bool = False) -> Any:
        return self._ask("suggest_float", (name, low, high), {"step": step, "log": log})


def _build(conn: Connection, builder: Callable[..., Any], message: tuple[Any, ...]) -> None:
    """Run ``builder`` for one ``("build", options, num_classes, input_shape, device)``
    message and say how it ended."""
    import torch

    _, options, num_classes, input_shape, device = message
    trial = _RemoteModelTrial(conn, builder, num_classes, input_shape)
    try:
        with torch.device(device):
            builder(trial, **options)
    except Exception as exc:
        _send(conn, ("raised", _portable(exc)))
    else:
        _send(conn, ("built",))


def guard_main(fd: int) -> None:
    """A builder's guard process: load the builder, then run it for each replay the parent
    asks (see :class:`BuilderGuard`) until the parent goes away."""
    conn, init = _child_start(fd)
    try:
        import torch  # noqa: F401  (before the first replay: a builder needs it)

        builder = cloudpickle.loads(init["builder"])
    except Exception as exc:
        _send(conn, ("failed", failure_reason(exc)))
        os._exit(3)
    _send(conn, ("ready",))
    while True:
        _build(conn, builder, _receive(conn))
