"""Conformance checks for strategies (optuna samplers with frugalnas's optional protocol,
:mod:`frugalnas.ports.strategy`)."""

from __future__ import annotations

import inspect
from collections.abc import Callable, Mapping
from typing import Any

import frugalnas
from frugalnas.ports.space import params_of
from frugalnas.engine.study import Study
from frugalnas.ports import strategy as protocol
from frugalnas.ports.config import StudyConfig
from frugalnas.ports.keys import FAIL_REASON_ATTR
from frugalnas.testing._suite import SkipCheck, Suite, quiet_host
from frugalnas.testing.setups import SMALL_DATA, SMALL_NB201, study_estimator_options


CPU = {"device": "cpu"}


def _resolve(options: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None) -> dict[str, Any]:
    if options is None:
        return {}
    return dict(options() if callable(options) else options)


def make_study(host: Any, *, space: str, space_options: Any = None, strategy: Any = "random",
               strategy_options: Any = None, estimator: str = "nb201-table",
               estimator_options: Any = None, dataset: str | None = "synthetic",
               dataset_options: Any = None, seed: int = 0) -> Any:
    """An in-memory study created by name, as ``frugalnas.create_study`` creates one, with
    ``host`` minus the tracking and progress plugins, training on the CPU (the same results
    on every machine)."""
    return frugalnas.create_study(
        space=space, space_options=_resolve(space_options), strategy=strategy,
        strategy_options=_resolve(strategy_options), estimator=estimator,
        estimator_options=_resolve(estimator_options), dataset=dataset,
        dataset_options=_resolve(dataset_options), backend="single-device",
        backend_options=dict(CPU), seed=seed, host=quiet_host(host))


class StrategyChecks(Suite):
    """The strategy contract: created with ``space=``/``seed=`` (and ``host=`` if it asks), an
    ``optuna.samplers.BaseSampler`` whose optional protocol methods are callable; drives a real
    in-memory study (architectures asked through the space's ``suggest``) for ``n_trials``
    trials without a failed trial; proposes the same architectures for the same seed; and,
    if it has ``propose(study, trial, k)``, gives ``k`` distinct valid architectures none of
    which was evaluated before.

    ``strategy`` is a registered name, a factory ``f(space=, seed=, [host=,] **options)`` or a
    sampler object (then the reproducibility check is skipped: it needs two of them).
    ``space`` is a registered name or a :class:`frugalnas.SearchSpace`. The study scores with
    ``estimator`` and ``estimator_options`` (default: ``nb201-table`` with
    ``any_network=True``, which scores the cells of the tiny default space as in the
    benchmark network)."""

    kind = "strategies"
    checks = ("check_is_sampler", "check_proposals", "check_reproducible", "check_propose")

    def __init__(self, strategy: Any, space: Any = "nb201", *, host: Any = None,
                 name: str | None = None, seed: int = 0, n_trials: int = 6,
                 strategy_options: Any = None, space_options: Any = None,
                 estimator: str = "nb201-table", estimator_options: Any = None,
                 dataset: str | None = "synthetic", dataset_options: Any = None):
        self.strategy, self.space, self.host = strategy, space, host
        self.seed, self.n_trials = seed, n_trials
        self.strategy_options = strategy_options
        self.space_options = (space_options if space_options is not None else
                              SMALL_NB201 if space == "nb201" else {})
        self.estimator = estimator
        self.estimator_options = study_estimator_options(estimator, estimator_options)
        self.dataset = dataset
        self.dataset_options = (dataset_options if dataset_options is not None else
                                SMALL_DATA if dataset == "synthetic" else {})
        if name is None:
            name = strategy if isinstance(strategy, str) else getattr(
                strategy, "__name__", type(strategy).__name__)
        self.subject = f"strategy {name!r}"
        self._used_instance = False
        #: The study a sampler object drove (it can drive one only); check_propose reuses it.
        self._instance_study: Any = None

    # -- helpers -------------------------------------------------------------------------
    def _host(self) -> Any:
        return quiet_host(self.host)

    def _space(self) -> Any:
        if isinstance(self.space, str):
            return self._host().create("search_spaces", self.space, **_resolve(self.space_options))
        return self.space

    def _sampler(self, space: Any, seed: int) -> Any:
        import optuna

        if isinstance(self.strategy, optuna.samplers.BaseSampler):
            if self._used_instance:
                raise SkipCheck("a sampler object can drive one study only; give a factory or "
                                "a registered name to check reproducibility")
            self._used_instance = True
            return self.strategy
        options = _resolve(self.strategy_options)
        if isinstance(self.strategy, str):
            return self._host().create("strategies", self.strategy, space=space, seed=seed,
                                       **options)
        try:
            if "host" in inspect.signature(self.strategy).parameters:
                options["host"] = self._host()
        except (TypeError, ValueError):
            pass
        return self.strategy(space=space, seed=seed, **options)

    def _study(self, seed: int | None = None) -> Any:
        seed = self.seed if seed is None else seed
        if isinstance(self.strategy, str) and isinstance(self.space, str):
            return make_study(self.host, space=self.space, space_options=self.space_options,
                              strategy=self.strategy, strategy_options=self.strategy_options,
                              estimator=self.estimator, estimator_options=self.estimator_options,
                              dataset=self.dataset, dataset_options=self.dataset_options,
                              seed=seed)
        import optuna

        host = self._host()
        space = self._space()
        sampler = self._sampler(space, seed)
        config = StudyConfig(space=space.name, strategy=type(sampler).__name__,
                             estimator=self.estimator,
                             estimator_options=_resolve(self.estimator_options),
                             dataset=self.dataset, dataset_options=_resolve(self.dataset_options),
                             backend="single-device", backend_options=dict(CPU), seed=seed)
        estimator = host.create_estimator(self.estimator, config.estimator_options)
        ostudy = optuna.create_study(sampler=sampler, directions=["maximize"])
        return Study(ostudy, config, host, space, estimator)

    def _run(self, seed: int | None = None, n_trials: int | None = None) -> Any:
        n_trials = self.n_trials if n_trials is None else n_trials
        study = self._study(seed)
        study.optimize(n_trials=n_trials)
        if study.strategy is self.strategy:
            self._instance_study = study
        trials = study.optuna_study.get_trials(deepcopy=False)
        failed = [t for t in trials if t.state.name == "FAIL"]
        if failed:
            reasons = "; ".join(f"trial {t.number}: {t.user_attrs.get(FAIL_REASON_ATTR, '?')}"
                                for t in failed[:3])
            self.fail(f"{len(failed)} of {len(trials)} trial(s) of an in-memory study failed "
                      f"({reasons})")
        if len(trials) < n_trials and not protocol.should_stop(study.strategy, study.optuna_study):
            self.fail(f"the study stopped after {len(trials)} of {n_trials} trials although "
                      "should_stop() did not ask for it")
        return study

    # -- checks --------------------------------------------------------------------------
    def check_is_sampler(self) -> None:
        import optuna

        sampler = self._study().strategy if isinstance(self.strategy, str) else \
            self._sampler(self._space(), self.seed)
        self._used_instance = False
        if not isinstance(sampler, optuna.samplers.BaseSampler):
            self.fail(f"created {type(sampler).__name__}, not an optuna.samplers.BaseSampler")
        for s in protocol.strategy_chain(sampler):
            if not isinstance(s, protocol.Strategy):
                continue
            inner = s.inner
            if inner is not None and not isinstance(inner, optuna.samplers.BaseSampler):
                self.fail(f"{type(s).__name__}.inner is a {type(inner).__name__}; a wrapping "
                          "strategy keeps the sampler it wraps in inner")

    def check_proposals(self) -> None:
        study = self._run()
        records = study.trials
        if not records:
            self.fail("an in-memory study ran no trial")
        for record in records:
            arch = record.architecture
            try:
                study.space.validate(arch)
            except Exception as exc:
                self.fail(f"trial {record.number} evaluated {arch}, which the space rejects: {exc}")
            if dict(record.params) != dict(params_of(study.space, arch)):
                self.fail(f"trial {record.number} has parameters {record.params}, which are not "
                          f"those of its architecture {arch}")

    def check_reproducible(self) -> None:
        first = [str(t.architecture) for t in self._run().trials]
        second = [str(t.architecture) for t in self._run().trials]
        if first != second:
            diff = next(i for i, (a, b) in enumerate(zip(first + [None], second + [None]))
                        if a != b)
            self.fail(f"two studies with seed {self.seed} diverge at trial {diff}: "
                      f"{first[diff] if diff < len(first) else 'nothing'} vs "
                      f"{second[diff] if diff < len(second) else 'nothing'}")

    def check_propose(self) -> None:
        from optuna.trial import TrialState

        # A sampler object drives one study: check the one an earlier check ran, if any.
        study = self._instance_study if self._instance_study is not None else self._run()
        sampler = study.strategy
        if not isinstance(sampler, protocol.Proposer):
            raise SkipCheck(f"{type(sampler).__name__} has no propose(study, trial, k), so "
                            "there is nothing to check (such a strategy cannot sit inside "
                            "the prescreen strategy)")
        ostudy = study.optuna_study
        trial = ostudy.ask()
        frozen = next(t for t in ostudy.get_trials(deepcopy=False, states=(TrialState.RUNNING,))
                      if t.number == trial.number)
        k = 3
        try:
            archs = sampler.propose(ostudy, frozen, k)
        finally:
            ostudy.tell(trial, state=TrialState.FAIL)
        if not isinstance(archs, list) or len(archs) != k:
            self.fail(f"propose(study, trial, {k}) returned {archs!r}; expected a list of {k} "
                      "architectures")
        for arch in archs:
            try:
                study.space.validate(arch)
            except Exception as exc:
                self.fail(f"propose() gave {arch!r}, which the space rejects: {exc}")
        if len({a.key for a in archs}) != k:
            self.fail(f"propose(study, trial, {k}) repeated an architecture: "
                      f"{[str(a) for a in archs]}")
        done = {t.architecture.key for t in study.completed_trials()}
        again = [str(a) for a in archs if a.key in done]
        if again:
            self.fail(f"propose() gave architecture(s) already evaluated: {again}")


def check_strategy(strategy: Any, space: Any = "nb201", *, host: Any = None, seed: int = 0,
                   n_trials: int = 6, strategy_options: Any = None, space_options: Any = None,
                   estimator: str = "nb201-table", estimator_options: Any = None,
                   dataset: str | None = "synthetic", dataset_options: Any = None,
                   checks: list[str] | None = None) -> list[str]:
    """Run the strategy checks; returns the names of the checks run (not skipped), raises
    :class:`~frugalnas.testing.ConformanceError` at the first broken rule.

    ``strategy`` is a registered name, a factory ``f(space=, seed=, [host=,] **options)`` or a
    sampler object; ``space`` a registered name (default: a tiny NB201 space) or a
    :class:`frugalnas.SearchSpace`. The study scores with ``estimator`` (default: the
    ``nb201-table`` lookup, instant, with ``estimator_options`` ``{"any_network": True}``
    unless given; pick one that fits your space)."""
    return StrategyChecks(strategy, space, host=host, seed=seed, n_trials=n_trials,
                          strategy_options=strategy_options, space_options=space_options,
                          estimator=estimator, estimator_options=estimator_options,
                          dataset=dataset, dataset_options=dataset_options).run(checks)
