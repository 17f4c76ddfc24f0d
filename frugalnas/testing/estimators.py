"""Conformance checks for estimators (:class:`frugalnas.Estimator`)."""

from __future__ import annotations

import copy
import dataclasses
import math
import numbers
import random
from collections.abc import Callable, Mapping
from typing import Any

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.datasets.images import synthetic
from frugalnas.ports.cost import Cost
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.testing._suite import SkipCheck, Suite, close, describe
from frugalnas.testing.setups import SMALL_DATA, SMALL_NB201


#: Measured costs that cannot be 0 (an evaluation takes time; a network has parameters);
#: FLOPs, epochs and peak memory may truly be 0 (a parameter count, no training, a CPU).
_NEVER_ZERO = ("seconds", "params")


def _real(value: Any) -> bool:
    return isinstance(value, numbers.Real) and not isinstance(value, bool)


class EstimatorChecks(Suite):
    """The estimator contract: honest declarations (``provides``, ``measures``,
    ``needs_dataset``, ``objective_names()``), an :class:`EstimateResult` with a finite value,
    every declared metric and every measured cost, no dataset use when it declares none,
    the same score for the same architecture and seed, and metrics it declares known before
    evaluation (``known_metrics``) equal to the evaluated ones.

    Without ``study`` the estimator scores an architecture of ``space`` in a bare
    :class:`TrialContext` (``backend``, ``dataset``, ``seed``, no study or trial). With
    ``study`` (a function returning a fresh :class:`frugalnas.Study`), it scores the
    architecture of a trial the study asks for, in the study's context; if ``estimator`` is
    ``None`` the study's own estimator is checked."""

    kind = "estimators"
    checks = ("check_declarations", "check_evaluate", "check_needs_dataset",
              "check_reproducible", "check_known_metrics")

    def __init__(self, estimator: Any, space: Any = None, *, name: str | None = None,
                 dataset: Any = None, backend: Any = None, seed: int = 0,
                 fresh: Callable[[], Any] | None = None, study: Callable[[], Any] | None = None):
        if estimator is None and study is None:
            raise ValueError("give an estimator, or a study factory whose estimator is checked")
        self.estimator, self.seed, self.study_factory = estimator, seed, study
        self._fresh_factory = fresh
        if study is None:
            if space is None:
                space = NB201Space(**SMALL_NB201)
            if dataset is None:
                dataset = synthetic(seed=seed, **SMALL_DATA)
            if backend is None:
                backend = SingleDeviceBackend("cpu")
        self.space, self.dataset, self.backend = space, dataset, backend
        # A pristine copy for the reproducibility check, taken before any evaluation.
        self._pristine = None
        if estimator is not None and fresh is None:
            try:
                self._pristine = copy.deepcopy(estimator)
            except Exception:  # locks, open files: evaluate the same object twice instead
                self._pristine = None
        self.subject = (describe("estimator", estimator, name) if estimator is not None
                        else f"estimator {name!r}")

    # -- helpers -------------------------------------------------------------------------
    def _subject_estimator(self) -> Any:
        if self.estimator is None:
            self.estimator = self.study_factory().estimator
        return self.estimator

    def _fresh(self) -> Any:
        if self._fresh_factory is not None:
            return self._fresh_factory()
        if self._pristine is not None:
            return copy.deepcopy(self._pristine)
        return self._subject_estimator()

    def _evaluate(self, *, fresh: bool = False, with_data: bool = True) -> tuple[Any, Any, Any]:
        """``(estimator, architecture, result)`` of one evaluation."""
        if self.study_factory is not None:
            study = self.study_factory()
            if fresh:
                estimator = self._fresh() if self.estimator is not None else study.estimator
            else:
                estimator = self.estimator if self.estimator is not None else study.estimator
                self.estimator = estimator
            candidate = study.ask()
            arch, context = candidate.architecture, study.context(candidate.trial)
            if not with_data:
                context = dataclasses.replace(context, dataset_loader=None)
        else:
            estimator = self._fresh() if fresh else self.estimator
            arch = self.space.sample(random.Random(self.seed))
            data = self.dataset
            context = TrialContext(space=self.space, backend=self.backend, seed=self.seed,
                                   dataset_loader=(lambda: data) if with_data else None)
        return estimator, arch, estimator.evaluate(arch, context)

    # -- checks --------------------------------------------------------------------------
    def check_declarations(self) -> None:
        est = self._subject_estimator()
        if not isinstance(est, Estimator):
            self.fail(f"{type(est).__name__} does not subclass frugalnas.Estimator")
        if not isinstance(est.needs_dataset, bool):
            self.fail(f"needs_dataset is {est.needs_dataset!r}; declare True or False")
        for attr in ("provides", "measures"):
            value = getattr(est, attr)
            if not isinstance(value, (tuple, list)) or not all(isinstance(v, str) for v in value):
                self.fail(f"{attr} is {value!r}; expected a tuple of names")
            if len(set(value)) != len(value):
                self.fail(f"{attr} {tuple(value)} names a metric twice")
        fields = [f.name for f in dataclasses.fields(Cost)]
        unknown = [m for m in est.measures if m not in fields]
        if unknown:
            self.fail(f"measures names {unknown}, which are not Cost fields; valid: "
                      f"{', '.join(fields)}")
        names = est.objective_names()
        missing = [n for n in ("value", *est.provides, *est.measures) if n not in names]
        if missing:
            self.fail(f"objective_names() {tuple(names)} lacks {missing}; it must include "
                      "'value', every name in provides and every name in measures")

    def check_evaluate(self) -> None:
        est, arch, result = self._evaluate()
        where = f"evaluate({arch})"
        if not isinstance(result, EstimateResult):
            self.fail(f"{where} returned {type(result).__name__}, not an EstimateResult")
        if not _real(result.value) or not math.isfinite(result.value):
            self.fail(f"{where} gave value {result.value!r}; expected a finite number")
        if not isinstance(result.metrics, dict):
            self.fail(f"{where} gave metrics {result.metrics!r}; expected a dict")
        for key, value in result.metrics.items():
            if not isinstance(key, str) or not _real(value):
                self.fail(f"{where} gave metric {key!r}={value!r}; metrics map names to numbers")
        missing = [n for n in est.provides if n not in result.metrics]
        if missing:
            self.fail(f"{where} lacks the metric(s) {missing} its provides declares "
                      f"(metrics: {sorted(result.metrics)}); a study with such an objective "
                      "would fail every trial")
        for name in est.objective_names():
            try:
                value = result.objective(name)
            except KeyError as exc:
                self.fail(f"objective {name!r} of objective_names() cannot be read from the "
                          f"result of {where}: {exc}")
            if not math.isfinite(value):
                self.fail(f"objective {name!r} of {where} is {value!r}; objectives must be finite")
        if not isinstance(result.cost, Cost):
            self.fail(f"{where} gave cost {result.cost!r}; expected a frugalnas.Cost")
        for name in est.measures:
            value = getattr(result.cost, name)
            if not _real(value) or not math.isfinite(value) or value < 0:
                self.fail(f"{where} gave cost {name}={value!r}; expected a finite number >= 0")
            if value == 0 and name in _NEVER_ZERO:
                self.fail(f"{where} left cost {name} at 0 although measures declares it")
        if not isinstance(result.artifacts, dict) or not all(
                isinstance(k, str) and isinstance(v, (str, bytes))
                for k, v in result.artifacts.items()):
            self.fail(f"{where} gave artifacts that are not {{file name: str or bytes}}")

    def check_needs_dataset(self) -> None:
        est = self._subject_estimator()
        if est.needs_dataset:
            return
        try:
            self._evaluate(with_data=False)
        except Exception as exc:
            self.fail(f"needs_dataset is False, but evaluate() in a context without a dataset "
                      f"raised {type(exc).__name__}: {exc}")

    def check_reproducible(self) -> None:
        _, arch, first = self._evaluate(fresh=True)
        _, arch2, second = self._evaluate(fresh=True)
        if arch2 != arch:  # a study chose another architecture: not the estimator's doing
            self.fail(f"two studies of the same seed asked for {arch} and {arch2}")
        if not close(float(first.value), float(second.value)):
            self.fail(f"two fresh estimators scored {arch} with the same seed as "
                      f"{first.value!r} and {second.value!r}")
        for name in self._subject_estimator().provides:
            a, b = first.metrics.get(name), second.metrics.get(name)
            if a is not None and b is not None and not close(float(a), float(b)):
                self.fail(f"two fresh estimators gave metric {name!r} = {a!r} and {b!r} for "
                          f"{arch} with the same seed")


    def check_known_metrics(self) -> None:
        """What ``known_metrics`` gives before evaluation is what the evaluation reports (a
        strategy proposes by it; skipped for an estimator that knows nothing beforehand)."""
        est = self._subject_estimator()
        if self.study_factory is not None:
            study = self.study_factory()
            candidate = study.ask()
            arch, space = candidate.architecture, study.space
            known = est.known_metrics(arch, space)
            context = study.context(candidate.trial)
        else:
            arch, space = self.space.sample(random.Random(self.seed)), self.space
            known = est.known_metrics(arch, space)
            data = self.dataset
            context = TrialContext(space=space, backend=self.backend, seed=self.seed,
                                   dataset_loader=lambda: data)
        if not isinstance(known, Mapping):
            self.fail(f"known_metrics({arch}) returned {known!r}; expected a mapping of "
                      "metric names to numbers")
        if not known:
            raise SkipCheck(f"{type(est).__name__} knows no metric before evaluating")
        for key, value in known.items():
            if not isinstance(key, str) or not _real(value) or not math.isfinite(value):
                self.fail(f"known_metrics({arch}) gave {key!r}={value!r}; expected metric "
                          "names mapped to finite numbers")
        result = est.evaluate(arch, context)
        for key, value in known.items():
            try:
                evaluated = result.objective(key)
            except KeyError:
                self.fail(f"known_metrics({arch}) gives {key!r}, which evaluate() does not "
                          f"report (metrics: {sorted(result.metrics)}); a constraint on it "
                          "would be met before evaluation and fail after")
            if not close(float(value), float(evaluated)):
                self.fail(f"known_metrics({arch}) gives {key}={value!r}, but evaluate() "
                          f"reports {evaluated!r}; a strategy trusting it would propose "
                          "architectures that break the study's constraints")


def check_estimator(estimator: Any, space: Any = None, *, dataset: Any = None,
                    backend: Any = None, seed: int = 0, fresh: Callable[[], Any] | None = None,
                    study: Callable[[], Any] | None = None,
                    checks: list[str] | None = None) -> list[str]:
    """Run the estimator checks on ``estimator``; returns the names of the checks run, raises
    :class:`~frugalnas.testing.ConformanceError` at the first broken rule.

    It scores an architecture of ``space`` (default: a tiny NB201 space) on ``dataset``
    (default: small synthetic images) with ``backend`` (default: the CPU). ``fresh`` makes a
    new estimator with the same options (default: a deep copy taken before the first
    evaluation). An estimator that needs a study (the state a strategy shares) is checked
    with ``study``, a function that returns a fresh :class:`frugalnas.Study`."""
    return EstimatorChecks(estimator, space, dataset=dataset, backend=backend, seed=seed,
                           fresh=fresh, study=study).run(checks)
