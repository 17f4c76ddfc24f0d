"""The ``inherited`` estimator: scores a DAG candidate with weights from the shared store.

With the ``si-evolution`` strategy it also runs the strategy's plan: the first trial of a
generation trains the generation's population on the shared weights (sampled training,
through the study's backend), re-scores that population for the next selection, saves the
store and logs the generation's figures with ``study.log_metrics``. The cost of that training
is charged to that trial, so the sum of the trials' costs is the search's compute.
"""

from __future__ import annotations

import threading
import time
from typing import Any

import optuna
from optuna.trial import TrialState

from frugalnas.core.architecture import Architecture
from frugalnas.core.cost import Cost, count_params
from frugalnas.core.errors import check_range
from frugalnas.core.estimator import EstimateResult, EvaluationContext, Estimator
from frugalnas.sievo.sampler import FITNESS_ATTR, SIEvolutionSampler, find_sievo_sampler
from frugalnas.sievo.session import SievoSession, checkpoint_path


class InheritedEstimator(Estimator):
    """Scores a DAG candidate on validation data with weights inherited from the shared store
    (no training of its own); with ``si-evolution`` it runs the sampled training.

    Options: ``checkpoint_dir``, ``valid_limit`` (score on the first N validation examples),
    ``bn_recalibration_batches`` (before scoring, recalibrate the candidate's batch-norm
    statistics on that many fixed training batches of ``bn_recalibration_batch_size``, in
    training mode without gradients; 0: normalise with the validation batch's own
    statistics)."""

    name = "inherited"
    provides = ("inherited_accuracy", "generation")
    measures = ("seconds", "flops", "params")

    def __init__(self, checkpoint_dir: str | None = None, valid_limit: int | None = None,
                 bn_recalibration_batches: int = 2, bn_recalibration_batch_size: int = 64):
        check_range("bn_recalibration_batches", bn_recalibration_batches, 0)
        check_range("bn_recalibration_batch_size", bn_recalibration_batch_size, 2)
        self.checkpoint_dir = checkpoint_dir
        self.valid_limit = valid_limit
        self.bn_recalibration_batches = int(bn_recalibration_batches)
        self.bn_recalibration_batch_size = int(bn_recalibration_batch_size)
        self._sessions: dict[str, SievoSession] = {}
        self._lock = threading.Lock()

    # -- the shared store ----------------------------------------------------------------
    def session(self, context: EvaluationContext) -> SievoSession:
        """The weight-store session of the context's study (one per checkpoint file)."""
        study = context.study
        path = None
        if study is not None:
            sampler = find_sievo_sampler(study.optuna_study.sampler)
            folder = self.checkpoint_dir or (sampler.checkpoint_dir if sampler else None)
            path = checkpoint_path(study.optuna_study, folder)
        with self._lock:
            key = str(path)
            if key not in self._sessions:
                self._sessions[key] = SievoSession(context.space, context.dataset, path,
                                                   seed=context.seed)
            return self._sessions[key]

    def _valid(self, context: EvaluationContext):
        data = context.dataset
        n = self.valid_limit or len(data.valid_x)
        return data.valid_x[:n], data.valid_y[:n]

    def _calibration(self, session: SievoSession, context: EvaluationContext):
        if not self.bn_recalibration_batches:
            return None
        return session.calibration_batches(context.dataset, self.bn_recalibration_batches,
                                           self.bn_recalibration_batch_size)

    # -- scoring -------------------------------------------------------------------------
    def evaluate(self, arch: Architecture, context: EvaluationContext) -> EstimateResult:
        start = time.perf_counter()
        session = self.session(context)
        study, trial = context.study, context.trial
        sampler = find_sievo_sampler(study.optuna_study.sampler) if study is not None else None
        metrics: dict[str, float] = {}
        spent = Cost()
        if sampler is not None and trial is not None:
            metrics["generation"] = float(sampler.generation_of(trial.number))
            spent = self._run_plan(session, sampler, context)
        x, y = self._valid(context)
        with session.lock:
            acc, flops = session.score(arch, context.backend, x, y,
                                       self._calibration(session, context))
            params = count_params(session.network(arch))
        metrics["inherited_accuracy"] = acc
        if sampler is not None and trial is not None:
            self._generation_summary(sampler, context, acc)
        cost = Cost(seconds=time.perf_counter() - start, flops=flops + spent.flops, params=params,
                    epochs=spent.epochs)
        return EstimateResult(value=acc, metrics=metrics, cost=cost)

    def _run_plan(self, session: SievoSession, sampler: SIEvolutionSampler,
                  context: EvaluationContext) -> Cost:
        """Train the population of this trial's generation unless that was done already."""
        ostudy: optuna.Study = context.study.optuna_study
        generation = sampler.generation_of(context.trial.number)
        with session.lock:
            if session.trained_generation >= generation:
                return Cost()
            plan = sampler.plan(ostudy, generation)
            population = [context.space.parse(a) for a in plan["population"]]
            data = context.dataset
            options = dict(batch_size=sampler.batch_size, lr=sampler.lr,
                           momentum=sampler.momentum, weight_decay=sampler.weight_decay)
            flops, seconds, steps = 0.0, 0.0, 0
            if generation == 0 and sampler.warmup_batches:
                space = context.space
                warm = session.train(lambda rng: space.sample(rng), data, context.backend,
                                     generation=-1, batches=sampler.warmup_batches, **options)
                flops, seconds, steps = warm["flops"], warm["seconds"], warm["steps"]
            info = session.train(population, data, context.backend, generation=generation,
                                 batches=sampler.batches_per_generation, **options)
            flops += info["flops"]
            seconds += info["seconds"]
            steps += info["steps"]
            metrics = {"sievo_train_loss": info["loss"], "sievo_train_seconds": seconds,
                       "sievo_store_params": float(session.store.num_parameters()),
                       "sievo_store_entries": float(len(session.store))}
            if generation > 0:
                x, y = self._valid(context)
                calibration = self._calibration(session, context)
                accs = []
                for arch in population:
                    acc, f = session.score(arch, context.backend, x, y, calibration)
                    accs.append(acc)
                    flops += f
                sign = _sign(ostudy)
                ostudy.set_user_attr(FITNESS_ATTR.format(generation), [sign * a for a in accs])
                metrics["sievo_parents_mean"] = sum(accs) / len(accs)
                metrics["sievo_parents_max"] = max(accs)
            session.save(study=ostudy.study_name)
        context.log_study_metrics(metrics, step=generation)
        samples = steps * sampler.batch_size
        return Cost(flops=flops, epochs=samples / max(1, len(context.dataset.train_x)))

    def _generation_summary(self, sampler: SIEvolutionSampler, context: EvaluationContext,
                            acc: float) -> None:
        """After the last trial of a generation, log the fitness of the population that
        survives selection, the offspring's mean, the best so far and the store's size."""
        ostudy: optuna.Study = context.study.optuna_study
        number = context.trial.number
        generation = sampler.generation_of(number)
        first = sampler.first_trial(generation)
        if number != first + sampler.generation_size(generation) - 1:
            return
        sign = _sign(ostudy)
        done = {t.number: sign * t.values[0] for t in
                ostudy.get_trials(deepcopy=False, states=(TrialState.COMPLETE,)) if t.values}
        done[number] = sign * acc
        offspring = [v for n, v in done.items() if first <= n <= number]
        plan = sampler.plan(ostudy, generation)
        attrs = ostudy.user_attrs  # one storage read for every generation's re-scores
        parents = attrs.get(FITNESS_ATTR.format(generation)) if generation else None
        pool = sorted(offspring + [f for f in (parents or []) if f is not None], reverse=True)
        survivors = [sign * f for f in pool[:sampler.population_size]]
        rescored = [f for g in range(1, generation + 1)
                    for f in attrs.get(FITNESS_ATTR.format(g)) or [] if f is not None]
        best = max(list(done.values()) + rescored)
        session = self.session(context)
        context.log_study_metrics({
            "sievo_population_mean": sum(survivors) / len(survivors),
            "sievo_population_max": max(survivors) if sign > 0 else min(survivors),
            "sievo_offspring_mean": sign * sum(offspring) / len(offspring),
            "sievo_best_so_far": sign * best,
            "sievo_store_params": float(session.store.num_parameters()),
            "sievo_population_size": float(len(plan["population"])),
        }, step=generation)


def _sign(study: optuna.Study) -> float:
    return 1.0 if study.directions[0] == optuna.study.StudyDirection.MAXIMIZE else -1.0


def weight_store_of(study: Any):
    """The shared :class:`WeightStore` of a study that uses the ``inherited`` estimator."""
    estimator = study.estimator
    if not isinstance(estimator, InheritedEstimator):
        from frugalnas.core.errors import ConfigError

        raise ConfigError(f"study {study.name!r} uses estimator {study.config.estimator!r}; "
                          "the weight store belongs to the 'inherited' estimator")
    return estimator.session(study.context()).store
