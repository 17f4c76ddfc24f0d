"""The ``inherited`` estimator: scores a candidate with weights inherited from the study's
supernet (:class:`~frugalnas.sievo.session.SievoSession`), on any space with
weight sharing (``dag``, NB201).

When the study's strategy shares :class:`GenerationPlans` (the ``si-evolution`` strategy), the
estimator also carries out the plans: the first trial of a generation trains the generation's
population on the shared weights (sampled training, through the study's backend), records the
population's re-scores for the next selection, saves the store and logs the generation's
figures with ``context.log_metrics``. The cost of that training is charged to that
trial, so the sum of the trials' costs is the search's compute. With any other strategy each
trial first trains its own candidate for ``train_steps`` steps on the shared weights, saves
the store, and then scores it.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.cost import Cost, count_params
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.ports.estimator import EstimateResult, Estimator, TrialContext
from frugalnas.sievo.plan import GenerationPlans
from frugalnas.sievo.session import SievoSession, checkpoint_file
from frugalnas.nn.weight_store import WeightStore
from frugalnas.weight_sharing.supernet import Supernet


def shared_plans(context: TrialContext) -> GenerationPlans | None:
    """The :class:`GenerationPlans` the study's strategy shares, ``None`` when it shares none
    (a strategy other than ``si-evolution``, or an evaluation outside a study)."""
    if not any(isinstance(s, GenerationPlans) for s in context.shared_states.values()):
        return None
    return context.shared(GenerationPlans)


class InheritedEstimator(Estimator):
    """Scores a candidate on validation data with weights inherited from the study's shared
    store (a :class:`~frugalnas.weight_sharing.supernet.Supernet` with one module per
    operation and position), on any space with weight sharing (``dag``, NB201).

    With ``si-evolution`` it runs that strategy's sampled training (the population of each
    generation, in the generation's first trial) and the options below about training are
    ignored. With any other strategy, every trial first trains its own candidate on the shared
    weights: ``train_steps`` SGD steps (default 20) of ``batch_size`` training examples with
    ``lr``, ``momentum``, ``weight_decay`` (a fresh optimizer per trial), then saves the store
    to its checkpoint, so the store learns over the search and a resumed study continues it.
    ``train_steps=0`` only scores. Evaluations outside a trial (``study.evaluate``) never
    train.

    Options: ``checkpoint_dir`` (default: ``<db>-sievo/`` beside a sqlite storage, else a
    temporary folder), ``valid_limit`` (score on the first N validation examples),
    ``bn_recalibration_batches`` (before scoring, recalibrate the candidate's batch-norm
    statistics on that many fixed training batches of ``bn_recalibration_batch_size``, in
    training mode without gradients; 0: ``dag``'s shared batch norms normalise with the
    validation batch's own statistics, ordinary ones with their running statistics),
    ``train_steps``, ``batch_size``, ``lr``, ``momentum``, ``weight_decay``.

    Metrics: ``inherited_accuracy`` (always, equal to ``value``) and ``generation`` (the
    trial's generation: in every trial of a study whose strategy is ``si-evolution``, not
    otherwise). Costs: ``seconds``, ``flops`` (scoring, plus the training charged to the
    trial: the generation's sampled training in a generation's first trial, the candidate's
    ``train_steps`` with another strategy), ``params`` (the candidate network) and ``epochs``
    (that training, in epochs of the training split; 0 in a trial that trains nothing). With
    another strategy and ``train_steps > 0``, each trial's training loss goes to the study as
    ``inherited_train_loss`` (step: the trial number)."""

    name = "inherited"
    provides = ("inherited_accuracy", "generation")
    measures = ("seconds", "flops", "params", "epochs")

    def __init__(self, checkpoint_dir: str | None = None, valid_limit: int | None = None,
                 bn_recalibration_batches: int = 2, bn_recalibration_batch_size: int = 64,
                 train_steps: int = 20, batch_size: int = 64, lr: float = 0.05,
                 momentum: float = 0.9, weight_decay: float = 3e-4):
        check_range("bn_recalibration_batches", bn_recalibration_batches, 0)
        check_range("bn_recalibration_batch_size", bn_recalibration_batch_size, 2)
        check_range("train_steps", train_steps, 0)
        if isinstance(train_steps, float) and not train_steps.is_integer():
            raise ConfigError(f"invalid train_steps {train_steps!r}; expected a whole number of "
                              "steps >= 0")
        check_range("batch_size", batch_size, 2)
        check_range("lr", lr, 0)
        check_range("momentum", momentum, 0, 1)
        check_range("weight_decay", weight_decay, 0)
        self.checkpoint_dir = checkpoint_dir
        self.valid_limit = valid_limit
        self.bn_recalibration_batches = int(bn_recalibration_batches)
        self.bn_recalibration_batch_size = int(bn_recalibration_batch_size)
        self.train_steps = int(train_steps)
        self.training = {"batch_size": int(batch_size), "lr": float(lr),
                         "momentum": float(momentum), "weight_decay": float(weight_decay)}
        self._sessions: dict[str, SievoSession] = {}
        self._lock = threading.Lock()

    # -- the shared store ----------------------------------------------------------------
    def session(self, context: TrialContext) -> SievoSession:
        """The weight-store session of the context's study (one per checkpoint file):
        ``checkpoint_dir`` (the estimator's, else the plans'), else the study's
        ``context.artifact_dir("sievo")``; no file outside a study."""
        path = None
        name = context.study_name
        if name is not None:
            plans = shared_plans(context)
            folder = self.checkpoint_dir or (plans.checkpoint_dir if plans else None)
            folder = Path(folder) if folder is not None else context.artifact_dir("sievo")
            path = checkpoint_file(folder, name) if folder is not None else None
        with self._lock:
            key = str(path)
            if key not in self._sessions:
                self._sessions[key] = SievoSession(context.space, context.dataset, path,
                                                   seed=context.seed)
            return self._sessions[key]

    def _valid(self, context: TrialContext):
        data = context.dataset
        return data.head("valid", self.valid_limit or data.num_examples("valid"))

    def _calibration(self, session: SievoSession, context: TrialContext):
        if not self.bn_recalibration_batches:
            return None
        return session.calibration_batches(context.dataset, self.bn_recalibration_batches,
                                           self.bn_recalibration_batch_size)

    # -- scoring -------------------------------------------------------------------------
    def evaluate(self, arch: Architecture, context: TrialContext) -> EstimateResult:
        start = time.perf_counter()
        session = self.session(context)
        # Outside a trial (study.evaluate) there is no generation to run: plain scoring.
        number = context.trial_number
        plans = shared_plans(context) if number is not None else None
        metrics: dict[str, float] = {}
        spent = Cost()
        if plans is not None and number is not None:
            metrics["generation"] = float(plans.generation_of(number))
            spent = self._run_plan(session, plans, context, number)
        elif number is not None and self.train_steps:
            spent = self._train_candidate(session, arch, context, number)
        x, y = self._valid(context)
        with session.lock:
            acc, flops = session.score(arch, context.backend, x, y,
                                       self._calibration(session, context))
            params = count_params(session.network(arch))
        metrics["inherited_accuracy"] = acc
        if plans is not None and number is not None:
            self._generation_summary(plans, context, number, acc)
        cost = Cost(seconds=time.perf_counter() - start, flops=flops + spent.flops, params=params,
                    epochs=spent.epochs)
        return EstimateResult(value=acc, metrics=metrics, cost=cost)

    def _run_plan(self, session: SievoSession, plans: GenerationPlans, context: TrialContext,
                  number: int) -> Cost:
        """Train the population of trial ``number``'s generation unless that was done
        already."""
        generation = plans.generation_of(number)
        training = plans.training
        with session.lock:
            if session.trained_generation >= generation:
                return Cost()
            population = plans.population(context, generation)
            data = context.dataset
            options = training.optimizer_options()
            flops, seconds, steps = 0.0, 0.0, 0
            if generation == 0 and training.warmup_batches:
                space = context.space
                warm = session.train(lambda rng: space.sample(rng), data, context.backend,
                                     generation=-1, batches=training.warmup_batches, **options)
                flops, seconds, steps = warm.flops, warm.seconds, warm.steps
            info = session.train(population, data, context.backend, generation=generation,
                                 batches=training.batches, **options)
            flops += info.flops
            seconds += info.seconds
            steps += info.steps
            metrics = {"sievo_train_loss": info.mean_loss(last=20), "sievo_train_seconds": seconds,
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
                plans.record_rescores(context, generation, accs)
                metrics["sievo_parents_mean"] = sum(accs) / len(accs)
                metrics["sievo_parents_max"] = max(accs)
            session.save(study=context.study_name)
        context.log_metrics(metrics, step=generation)
        samples = steps * training.batch_size
        return Cost(flops=flops, epochs=samples / max(1, context.dataset.num_examples("train")))

    def _train_candidate(self, session: SievoSession, arch: Architecture, context: TrialContext,
                         number: int) -> Cost:
        """``train_steps`` steps on ``arch`` alone (trial ``number``), then save the store
        (the path of every strategy but ``si-evolution``)."""
        with session.lock:
            info = session.train_candidate(arch, context.dataset, context.backend, trial=number,
                                           steps=self.train_steps, **self.training)
            session.save(study=context.study_name)
        context.log_metrics({"inherited_train_loss": info.mean_loss(last=20)}, step=number)
        samples = info.steps * self.training["batch_size"]
        return Cost(flops=info.flops, epochs=samples / max(1, context.dataset.num_examples("train")))

    def _generation_summary(self, plans: GenerationPlans, context: TrialContext, number: int,
                            acc: float) -> None:
        """After the last trial of a generation (``number``), log the fitness of the
        population that survives selection, the offspring's mean, the best so far and the
        store's size."""
        if not plans.is_last_trial(number):
            return
        generation = plans.generation_of(number)
        first = plans.first_trial(generation)
        sign = plans.sign(context)
        done = {t.number: sign * t.values[0] for t in context.history() if t.values}
        done[number] = sign * acc
        offspring = [v for n, v in done.items() if first <= n <= number]
        plan = plans.plan(context, generation)
        rescores = plans.all_rescores(context, range(1, generation + 1))  # one storage read
        parents = rescores.get(generation) if generation else None
        pool = sorted(offspring + [f for f in (parents or []) if f is not None], reverse=True)
        survivors = [sign * f for f in pool[:plans.population_size]]
        rescored = [f for fits in rescores.values() for f in fits if f is not None]
        best = max(list(done.values()) + rescored)
        session = self.session(context)
        context.log_metrics({
            "sievo_population_mean": sum(survivors) / len(survivors),
            "sievo_population_max": max(survivors) if sign > 0 else min(survivors),
            "sievo_offspring_mean": sign * sum(offspring) / len(offspring),
            "sievo_best_so_far": sign * best,
            "sievo_store_params": float(session.store.num_parameters()),
            "sievo_population_size": float(len(plan.population)),
        }, step=generation)


def weight_store_of(study: Any) -> WeightStore:
    """The shared :class:`WeightStore` of a study that uses the ``inherited`` estimator."""
    return supernet_of(study).stores[0]


def supernet_of(study: Any) -> Supernet:
    """The :class:`Supernet` of a study that uses the ``inherited`` estimator."""
    estimator = study.estimator
    if not isinstance(estimator, InheritedEstimator):
        raise ConfigError(f"study {study.name!r} uses estimator {study.config.estimator!r}; "
                          "the weight store belongs to the 'inherited' estimator")
    return estimator.session(study.context()).supernet
