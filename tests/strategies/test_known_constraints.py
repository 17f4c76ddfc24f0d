"""Constraints an estimator knows before evaluating (``Estimator.known_metrics``): the study
hands them to its strategy (``StrategyServices.known_constraints``), and frugalnas's
strategies then propose only architectures that meet them; without the capability they fall
back on the learned constraint model."""

import math
import random

import numpy as np
import optuna
import pytest

import frugalnas
from frugalnas import ConfigError
from frugalnas.engine.strategy_services import services_of
from frugalnas.ports.strategy import known_constraint_margins
from frugalnas.multiobjective.constraints import sampler_constraint_options
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.spaces.nb201.table import NB201TableEstimator, nb201_data
from frugalnas.strategies.feasible_draws import FeasibleDraws, least_violating, nearest_boundary
from frugalnas.testing import ConformanceError, check_estimator

OFF = {"disable_plugins": ["mlflow", "progress"]}
PIXEL3 = {"latency_ms_pixel3": 10.0}
# pixel3 <= 10 ms and at most 300,000 parameters: about a third of the cells
TWO = {"latency_ms_pixel3": 10.0, "params": 300_000.0}
CHEAP = {"surrogate-evolution": {"quality_every": 0, "n_candidates": 8,
                                 "surrogate_options": {"n_models": 2, "n_estimators": 20}},
         "bananas": {"quality_every": 0, "n_candidates": 20,
                     "surrogate_options": {"n_models": 2, "epochs": 20}}}


def table_study(strategy: str, constraints: dict, seed: int = 0, **kwargs) -> frugalnas.Study:
    return frugalnas.create_study(strategy=strategy, estimator="nb201-table", dataset=None,
                                  seed=seed, constraints=constraints,
                                  strategy_options=CHEAP.get(strategy, {}), **OFF, **kwargs)


def feasible_cells(constraints: dict) -> np.ndarray:
    data = nb201_data()
    ok = np.ones(len(data.valid_accuracy_cifar10), dtype=bool)
    for name, bound in constraints.items():
        column = data.params[:, 0] if name == "params" else \
            data.latency(name.removeprefix("latency_ms_"))
        ok &= column <= bound
    return ok


def test_the_table_knows_its_hardware_columns_as_evaluate_reports_them():
    space, estimator = NB201Space(), NB201TableEstimator()
    context = frugalnas.TrialContext(space=space, backend=None, seed=0)
    for seed in range(5):
        arch = space.sample(random.Random(seed))
        known = estimator.known_metrics(arch, space)
        result = estimator.evaluate(arch, context)
        assert {"latency_ms_pixel3", "latency_ms_raspi4", "params", "flops"} <= set(known)
        assert "valid_accuracy_cifar10" not in known  # the objective is never known beforehand
        for name, value in known.items():
            assert value == pytest.approx(result.objective(name))


def test_margins_follow_the_constraint_names_and_need_every_metric():
    assert known_constraint_margins({"b": 3.0, "a": 1.0}, {"b": 2.0, "a": 5.0}) == (-4.0, 1.0)
    assert known_constraint_margins({"a": 1.0}, {"a": 5.0, "b": 2.0}) is None
    assert known_constraint_margins({"a": math.nan}, {"a": 5.0}) is None


def test_the_study_lends_the_known_constraints_to_its_strategy():
    study = table_study("random", PIXEL3)
    space = study.space
    arch = space.sample(random.Random(1))
    oracle = services_of(study).known_constraints
    latency = nb201_data().latency("pixel3")[space.index(arch)]
    assert oracle(arch) == pytest.approx((latency - 10.0,))
    unconstrained = frugalnas.create_study(estimator="nb201-table", dataset=None, **OFF)
    assert services_of(unconstrained).known_constraints is None


@pytest.mark.parametrize("strategy", ["random", "regularized-evolution", "local-search"])
def test_strategies_propose_only_known_feasible_cells(strategy):
    study = table_study(strategy, PIXEL3)
    study.optimize(40)
    assert all(t.user_attrs["feasible"] for t in study.trials)
    # the same strategies without constraints do evaluate cells over the bound
    free = frugalnas.create_study(strategy=strategy, estimator="nb201-table", dataset=None,
                                  seed=0, **OFF)
    free.optimize(40)
    ok = feasible_cells(PIXEL3)
    assert not all(ok[free.space.index(t.architecture)] for t in free.trials)


@pytest.mark.slow
@pytest.mark.parametrize("strategy", ["surrogate-evolution", "bananas"])
def test_surrogate_strategies_screen_only_known_feasible_candidates(strategy):
    study = table_study(strategy, PIXEL3)
    study.optimize(25)
    assert all(t.user_attrs["feasible"] for t in study.trials)


@pytest.mark.parametrize("strategy", ["regularized-evolution", "local-search"])
def test_two_constraints_at_once(strategy):
    study = table_study(strategy, TWO, seed=2)
    study.optimize(40)
    ok = feasible_cells(TWO)
    assert all(ok[study.space.index(t.architecture)] for t in study.trials)
    assert all(t.user_attrs["feasible"] for t in study.trials)


def test_proposals_and_the_prescreen_view_are_feasible():
    study = table_study("regularized-evolution", PIXEL3, seed=4)
    study.optimize(25)
    ostudy, sampler = study.optuna_study, study.strategy
    trial = ostudy.ask()
    frozen = ostudy.get_trials(deepcopy=False)[-1]
    archs = sampler.propose(ostudy, frozen, 6)
    ok = feasible_cells(PIXEL3)
    assert len(archs) == 6 and all(ok[study.space.index(a)] for a in archs)
    # a wrapper's feasibility question is answered exactly
    mixed = [study.space.from_index(int(i)) for i in
             (np.flatnonzero(ok)[0], np.flatnonzero(~ok)[0], np.flatnonzero(ok)[1])]
    assert sampler.feasible_candidates(ostudy, frozen, mixed) == [0, 2]
    ostudy.tell(trial, state=optuna.trial.TrialState.FAIL)


@pytest.mark.parametrize("strategy", ["tpe", "nsga2"])
@pytest.mark.parametrize("constraints", [PIXEL3, TWO], ids=["pixel3", "two"])
def test_optuna_samplers_draw_only_known_feasible_cells(strategy, constraints):
    study = table_study(strategy, constraints, seed=1)
    assert isinstance(study.strategy, FeasibleDraws)
    study.optimize(30)
    assert all(t.user_attrs["feasible"] for t in study.trials)
    ok = feasible_cells(constraints)
    assert all(ok[study.space.index(t.architecture)] for t in study.trials)
    # the sampler drew infeasible cells too, and none of them became a trial; once the
    # trials got better towards the boundary, feasible draws were passed over for nearer ones
    sampler = study.strategy
    assert sampler.rejected > 0 and sampler.passed_over > 0
    # every draw became the trial, was passed over, rejected, or repeated an earlier trial
    assert sampler.draws == (30 - sampler.fallbacks + sampler.rejected + sampler.passed_over
                             + sampler.repeated)
    # and no cell was evaluated twice, though the wrapped sampler drew some again
    cells = [str(t.architecture) for t in study.trials]
    assert len(set(cells)) == len(cells)


class OneCellSampler(optuna.samplers.BaseSampler):
    """Proposes the same cell every time: a sampler whose draws only repeat."""

    def infer_relative_search_space(self, study, trial):
        return {}

    def sample_relative(self, study, trial, search_space):
        return {}

    def sample_independent(self, study, trial, param_name, param_distribution):
        return "nor_conv_1x1"


def test_feasible_draws_replace_a_sampler_that_only_repeats_with_fresh_feasible_cells():
    sampler = FeasibleDraws(OneCellSampler(), NB201Space(), max_draws=4)
    study = frugalnas.create_study(strategy=sampler, estimator="nb201-table", dataset=None,
                                   seed=2, constraints=PIXEL3, **OFF)
    study.optimize(6)
    cells = [str(t.architecture) for t in study.trials]
    assert cells[0] == "nb201:|nor_conv_1x1~0|+|nor_conv_1x1~0|nor_conv_1x1~1|+|" \
        "nor_conv_1x1~0|nor_conv_1x1~1|nor_conv_1x1~2|"
    # after the first trial every draw repeats it: each later trial is a fresh feasible cell
    assert len(set(cells)) == 6 and sampler.fallbacks == 5 and sampler.repeated == 20
    assert all(feasible_cells(PIXEL3)[study.space.index(t.architecture)] for t in study.trials)


def slower_and_worse(study: frugalnas.Study, n: int) -> list[int]:
    """``n`` feasible cells (pixel3 <= 10 ms), each slower than the one before and scoring
    lower by the study's estimator."""
    latency = nb201_data().latency("pixel3")
    ok = np.flatnonzero(feasible_cells(PIXEL3))
    bins = np.array_split(ok[np.argsort(latency[ok])], n)
    cells, last = [], math.inf
    for members in bins:
        scores = {int(c): study.evaluate(study.space.from_index(int(c))).value
                  for c in members[::7]}
        below = [c for c in scores if scores[c] < last - 1.0]
        cells.append(max(below, key=scores.__getitem__))
        last = scores[cells[-1]]
    return cells


def test_feasible_draws_take_the_draw_nearest_the_boundary_only_when_it_pays():
    study = table_study("tpe", PIXEL3, seed=3)
    study.optimize(12)
    ostudy, sampler = study.optuna_study, study.strategy
    latency = nb201_data().latency("pixel3")
    # NB201's accuracy grows with latency: the boundary is active after a few trials
    assert sampler.boundary_is_active(ostudy)
    recent = [latency[study.space.index(t.architecture)] for t in study.trials[-6:]]
    assert np.mean(recent) > np.mean(latency[feasible_cells(PIXEL3)])
    # trials that get worse towards the boundary (six feasible cells, each slower and less
    # accurate than the one before): the rule stays off and nothing is passed over
    worse = table_study("tpe", PIXEL3, seed=3)
    for cell in slower_and_worse(worse, 6):
        worse.optuna_study.enqueue_trial(worse.space.from_index(cell).decisions)
    worse.optimize(6)
    assert not worse.strategy.boundary_is_active(worse.optuna_study)
    worse.optimize(1)
    assert worse.strategy.passed_over == 0
    # several objectives: the first feasible draw, as without the screen
    two = table_study("nsga2", PIXEL3, seed=3, objectives=["value", "params"],
                      directions=["maximize", "minimize"])
    two.optimize(12)
    assert two.strategy.passed_over == 0 and two.strategy.rejected > 0
    # screen=1 takes the first feasible draw whatever the history
    first = FeasibleDraws(optuna.samplers.TPESampler(seed=0), study.space, screen=1)
    assert "screen=1" in repr(first)


def test_feasible_draws_options_reach_the_wrapper_and_are_checked_up_front():
    study = frugalnas.create_study(strategy="tpe", estimator="nb201-table", dataset=None, seed=3,
                                   constraints=PIXEL3, **OFF,
                                   strategy_options={"feasible_screen": 1,
                                                     "feasible_max_draws": 7})
    assert (study.strategy.screen, study.strategy.max_draws) == (1, 7)
    study.optimize(12)
    assert study.strategy.passed_over == 0   # screen=1: the first feasible draw, always
    cells = [str(t.architecture) for t in study.trials]   # and still no repeat
    assert len(set(cells)) == len(cells)
    with pytest.raises(ConfigError, match="invalid feasible_screen 0"):
        frugalnas.create_study(strategy="tpe", strategy_options={"feasible_screen": 0}, **OFF)
    with pytest.raises(ConfigError, match="did you mean 'feasible_screen'"):
        frugalnas.create_study(strategy="nsga2", strategy_options={"feasible_scren": 2}, **OFF)
    with pytest.raises(ConfigError, match="unknown option 'feasible_screen' for strategy 'gp'"):
        frugalnas.create_study(strategy="gp", strategy_options={"feasible_screen": 2}, **OFF)


def test_nearest_boundary_scales_each_constraint_by_its_own_margins():
    a, b, c = (NB201Space().sample(random.Random(s)) for s in range(3))
    # each margin in units of its constraint's largest (50 and 1): the tightest scaled
    # margins are a -0.1, b -0.002, c -0.9; b's is nearest 0
    assert nearest_boundary([(a, (-5.0, -1.0)), (b, (-0.1, -0.2)), (c, (-50.0, -0.9))]) is b
    assert nearest_boundary([(a, (-5.0,)), (c, (-50.0,))]) is a


def test_least_violating_counts_violations_before_their_size():
    a, b, c = (NB201Space().sample(random.Random(s)) for s in range(3))
    # b violates one constraint by a lot, a and c both by a little; c least in all
    assert least_violating([(a, (1.0, 0.5)), (b, (0.0, 90.0)), (c, (0.5, 0.5))]) is b
    assert least_violating([(a, (1.0, 0.5)), (c, (0.5, 0.5))]) is c


def test_optuna_tpe_keeps_its_own_constraint_handling_when_nothing_is_known():
    study = frugalnas.create_study(strategy="tpe", estimator="latency-blind", dataset=None,
                                   seed=1, constraints=PIXEL3, plugins=[ThirdParty()], **OFF)
    study.optimize(30)
    assert study.best_trial.user_attrs["feasible"]
    # TPE reads the recorded constraints: it tries infeasible cells
    assert not all(t.user_attrs["feasible"] for t in study.trials)
    assert study.strategy.draws == 0
    # ... exactly as optuna's own sampler does with the same constraints
    bare = frugalnas.create_study(
        strategy=optuna.samplers.TPESampler(seed=1, **sampler_constraint_options(PIXEL3)),
        estimator="latency-blind", dataset=None, seed=1, constraints=PIXEL3,
        plugins=[ThirdParty()], **OFF)
    bare.optimize(30)
    assert [str(t.architecture) for t in study.trials] == [str(t.architecture) for t in bare.trials]


def test_optuna_samplers_are_unwrapped_without_constraints():
    study = frugalnas.create_study(strategy="tpe", estimator="nb201-table", dataset=None, **OFF)
    assert isinstance(study.strategy, optuna.samplers.TPESampler)


class LatencyBlind(frugalnas.Estimator):
    """The table's look-up without the capability: latency only after evaluating."""

    name = "latency-blind"
    needs_dataset = False
    provides = ("latency_ms_pixel3",)

    def evaluate(self, arch, context):
        index = NB201Space().index(arch)
        data = nb201_data()
        return frugalnas.EstimateResult(
            value=float(data.valid_accuracy_cifar10[index]),
            metrics={"latency_ms_pixel3": float(data.latency("pixel3")[index])},
            cost=frugalnas.Cost(seconds=0.001))


def conv_count(arch) -> float:
    return float(sum("conv" in str(op) for op in arch.decisions.values()))


class ConvCounter(frugalnas.Estimator):
    """A third-party estimator that knows one metric, its cell's number of convolutions,
    before evaluating."""

    name = "conv-counter"
    needs_dataset = False
    provides = ("convs",)

    def known_metrics(self, arch, space):
        return {"convs": conv_count(arch)}

    def evaluate(self, arch, context):
        index = NB201Space().index(arch)
        return frugalnas.EstimateResult(
            value=float(nb201_data().valid_accuracy_cifar10[index]),
            metrics={"convs": conv_count(arch)}, cost=frugalnas.Cost(seconds=0.001))


class ThirdParty:
    __name__ = "third-party-estimators"

    @frugalnas.hookimpl
    def frugalnas_estimators(self):
        return {"latency-blind": LatencyBlind, "conv-counter": ConvCounter}


@pytest.mark.parametrize("strategy", ["regularized-evolution", "local-search"])
def test_without_the_capability_the_learned_model_still_runs(strategy):
    study = frugalnas.create_study(strategy=strategy, estimator="latency-blind", dataset=None,
                                   seed=0, constraints=PIXEL3, plugins=[ThirdParty()], **OFF)
    assert services_of(study).known_constraints(study.space.sample(random.Random(0))) is None
    study.optimize(40)
    feasible = [t.user_attrs["feasible"] for t in study.trials]
    assert len(feasible) == 40 and not all(feasible) and any(feasible[20:])
    assert study.best_trial.user_attrs["feasible"]


@pytest.mark.parametrize("strategy", ["random", "regularized-evolution", "local-search"])
def test_a_third_party_estimator_declares_known_metrics_through_the_same_port(strategy):
    study = frugalnas.create_study(strategy=strategy, estimator="conv-counter", dataset=None,
                                   seed=0, constraints={"convs": 1.0}, plugins=[ThirdParty()],
                                   **OFF)
    study.optimize(30)
    assert all(t.user_attrs["feasible"] for t in study.trials)
    assert all(conv_count(t.architecture) <= 1 for t in study.trials)


def test_the_conformance_check_compares_known_and_evaluated_metrics():
    space = NB201Space(N=1, C=4)
    assert "check_known_metrics" in check_estimator(NB201TableEstimator(), space,
                                                    checks=["check_known_metrics"])
    assert check_estimator(LatencyBlind(), space, checks=["check_known_metrics"]) == []

    class Lying(ConvCounter):
        def known_metrics(self, arch, space):
            return {"convs": conv_count(arch) + 1.0}

    with pytest.raises(ConformanceError, match="known_metrics.*evaluate\\(\\) reports"):
        check_estimator(Lying(), space, checks=["check_known_metrics"])

    class Unreported(ConvCounter):
        def known_metrics(self, arch, space):
            return {"depth": 3.0}

    with pytest.raises(ConformanceError, match="does not report"):
        check_estimator(Unreported(), space, checks=["check_known_metrics"])


def test_local_search_starts_wider_when_the_constraints_are_known():
    known = table_study("local-search", PIXEL3)
    known.optimize(1)
    blind = table_study("local-search", PIXEL3, estimator_options={"known_hardware": False})
    blind.optimize(1)
    given = frugalnas.create_study(strategy="local-search", strategy_options={"n_init": 3},
                                   estimator="nb201-table", dataset=None, constraints=PIXEL3,
                                   **OFF)
    given.optimize(1)
    assert (known.strategy.n_init, blind.strategy.n_init, given.strategy.n_init) == (20, 5, 3)


def test_evolution_grows_its_population_when_the_constraints_are_known():
    """Regularized evolution: 40 and 10 with known constraints, 20 and 5 otherwise; options
    given are kept, and a sample larger than the default population is refused before the
    first trial. Surrogate-evolution: the same sizes, an initial design of 40 or 10, and 100 or
    20 candidates a proposal; BANANAS: an initial design of 40 or 10."""
    known = table_study("regularized-evolution", PIXEL3)
    known.optimize(1)
    blind = table_study("regularized-evolution", PIXEL3,
                        estimator_options={"known_hardware": False})
    blind.optimize(1)
    given = frugalnas.create_study(strategy="regularized-evolution",
                                   strategy_options={"population_size": 30, "sample_size": 3},
                                   estimator="nb201-table", dataset=None, constraints=PIXEL3,
                                   **OFF)
    given.optimize(1)
    sizes = [(s.strategy._population, s.strategy._sample, s.strategy.n_init)
             for s in (known, blind, given)]
    assert sizes == [(40, 10, 40), (20, 5, 20), (30, 3, 30)]
    surrogate = [table_study("surrogate-evolution", PIXEL3, estimator_options=options)
                 for options in ({}, {"known_hardware": False})]
    for study in surrogate:
        study.optimize(1)
    assert [(s.strategy._population, s.strategy._sample, s.strategy.n_init)
            for s in surrogate] == [(40, 10, 40), (20, 5, 10)]
    defaults = [frugalnas.create_study(strategy="surrogate-evolution", estimator="nb201-table",
                                       dataset=None, constraints=PIXEL3, **OFF,
                                       estimator_options=options,
                                       strategy_options={"quality_every": 0})
                for options in ({}, {"known_hardware": False})]
    for study in defaults:
        study.strategy.bind(services_of(study))
    assert [s.strategy._candidates for s in defaults] == [100, 20]
    bananas = [table_study("bananas", PIXEL3, estimator_options=options)
               for options in ({}, {"known_hardware": False})]
    for study in bananas:
        study.optimize(1)
    assert [s.strategy.n_init for s in bananas] == [40, 10]
    with pytest.raises(frugalnas.ConfigError, match="sample_size"):
        frugalnas.create_study(strategy="regularized-evolution",
                               strategy_options={"sample_size": 25}, estimator="nb201-table",
                               dataset=None, **OFF)


BRIDGE_OPTIONS = {"local-search": {"n_init": 1},
                  "regularized-evolution": {"population_size": 10, "sample_size": 3}}


@pytest.mark.parametrize("bridge", [True, False])
@pytest.mark.parametrize("strategy", list(BRIDGE_OPTIONS))
def test_search_steps_over_infeasible_cells_to_feasible_ones(strategy, bridge):
    """With known constraints, local search's neighbourhood and evolution's mutations also
    reach the feasible cells two edits away through an infeasible one (``bridge_infeasible``);
    off, every proposal after the initial design is a one-edit neighbour of an evaluated
    cell."""
    space = NB201Space()
    raspi4 = {"latency_ms_raspi4": 25.0}
    study = frugalnas.create_study(strategy=strategy, estimator="nb201-table", dataset=None,
                                   seed=2, constraints=raspi4, **OFF,
                                   strategy_options={**BRIDGE_OPTIONS[strategy],
                                                     "bridge_infeasible": bridge})
    study.optimize(60)
    feasible = feasible_cells(raspi4)
    cells = [space.index(t.architecture) for t in study.trials]
    assert all(feasible[c] for c in cells)
    n_init = study.strategy.n_init
    bridged = 0
    for k, cell in enumerate(cells[n_init:], start=n_init):
        earlier = set(cells[:k])
        around = {space.index(n) for n in space.neighbours(space.from_index(cell))}
        if around & earlier:
            continue
        bridged += 1
        middles = [m for m in around if not feasible[m]
                   and {space.index(n) for n in space.neighbours(space.from_index(m))} & earlier]
        assert middles, f"proposal {k} is neither one nor two edits (via an infeasible cell) away"
    assert (bridged > 0) == bridge


def test_surrogate_evolution_takes_the_best_candidates_nearest_an_active_boundary():
    """With known constraints, once the trials get better towards the boundary, the child
    evaluated is the one nearest the boundary among the ``screen_size`` best by acquisition;
    ``screen_size=1`` keeps the best by acquisition alone."""
    latency = nb201_data().latency("pixel3")
    gaps = {}
    for screen in (1, 10):
        study = frugalnas.create_study(
            strategy="surrogate-evolution", estimator="nb201-table", dataset=None, seed=0,
            constraints=PIXEL3, strategy_options={**CHEAP["surrogate-evolution"],
                                                  "n_candidates": 30, "screen_size": screen},
            **OFF)
        study.optimize(n_trials=60)
        late = sorted(study.trials, key=lambda t: t.number)[40:]
        margins = [10.0 - latency[study.space.index(t.architecture)] for t in late]
        assert min(margins) >= 0  # every one feasible
        gaps[screen] = float(np.mean(margins))
    assert gaps[10] < 0.5 * gaps[1], gaps


def test_feasible_draws_never_repeat_a_cell_across_optuna_threads():
    study = table_study("tpe", PIXEL3, seed=4)
    study.optimize(40, n_jobs=2)
    cells = [str(t.architecture) for t in study.trials]
    assert len(cells) == 40 and len(set(cells)) == 40
    assert all(feasible_cells(PIXEL3)[study.space.index(t.architecture)] for t in study.trials)
