"""A strategy reads only what changed in the storage since its last proposal: its proposals are
those of a sampler that reads the whole storage afresh, on in-memory and sqlite storages, with
two workers interleaving on one sqlite file, and after a reload."""

import optuna
import pytest

import frugalnas
from frugalnas.ports import optuna_compat
from frugalnas.distribution.quota_storage import QuotaStorage, make_storage
from frugalnas.spaces.nb201.space import NB201Space
from frugalnas.spaces.nb201.table import nb201_table
from frugalnas.strategies.history import History, SeenKeys, read_history
from frugalnas.strategies.local_search import LocalSearchSampler
from frugalnas.strategies.random import RandomArchSampler
from frugalnas.strategies.regularized import RegularizedEvolutionSampler

SPACE = NB201Space()
SAMPLERS = {
    "random": lambda: RandomArchSampler(SPACE, seed=3),
    "regularized-evolution": lambda: RegularizedEvolutionSampler(SPACE, seed=3,
                                                                 population_size=8, sample_size=3),
    "local-search": lambda: LocalSearchSampler(SPACE, seed=3, n_init=4),
}


def _value(trial: optuna.Trial) -> float:
    arch = SPACE.suggest(trial)
    return float(nb201_table()[SPACE.index(arch), 0])


def _frozen(study: optuna.Study, trial: optuna.Trial):
    return optuna_compat.storage_of(study).get_trial(optuna_compat.trial_id(trial))


def _check_against_full_read(name, study, trial, sampler):
    """The incremental sampler's 3 proposals for ``trial`` are a fresh sampler's (which reads
    every trial of the storage), and so is its history."""
    frozen = _frozen(study, trial)
    fresh = SAMPLERS[name]()
    assert sampler.propose(study, frozen, 3) == fresh.propose(study, frozen, 3)
    mine = read_history(study, SPACE, frozen.number, finished=sampler._finished)
    full = read_history(study, SPACE, frozen.number)
    assert (mine.numbers, mine.values, mine.archs) == (full.numbers, full.values, full.archs)
    assert set(mine.seen) == set(full.seen) and len(mine.seen) == len(full.seen)


@pytest.mark.slow
@pytest.mark.parametrize("storage", ["memory", "sqlite", "worker"])
@pytest.mark.parametrize("name", list(SAMPLERS))
def test_incremental_proposals_equal_a_full_read_with_two_interleaved_workers(tmp_path, name,
                                                                             storage):
    url = None if storage == "memory" else f"sqlite:///{tmp_path / 's.db'}"

    def opened(url):  # a worker's storage: frugalnas's quota wrapper over a bare RDBStorage
        if storage != "worker":
            return url
        return QuotaStorage(make_storage(url), url, 10_000, repeats=True)

    samplers = [SAMPLERS[name](), SAMPLERS[name]()]
    first = optuna.create_study(storage=opened(url), study_name="s", direction="maximize",
                                sampler=samplers[0])
    # In memory, two study objects share one storage object; on sqlite, the file.
    shared = optuna_compat.storage_of(first) if url is None else opened(url)
    studies = [first, optuna.load_study(study_name="s", storage=shared, sampler=samplers[1])]
    open_trials: list[tuple[int, optuna.Trial]] = []
    for step in range(110 if storage == "memory" else 60):
        w = step % 2
        trial = studies[w].ask()
        _check_against_full_read(name, studies[w], trial, samplers[w])
        value = _value(trial)
        open_trials.append((w, trial))
        # Finish out of order: every third step leaves its trial running a while longer, and
        # one trial stays running throughout.
        if step % 3 != 2 and len(open_trials) > 1:
            w_done, done = open_trials.pop(0 if step % 2 else -1)
            if done.number != 1:
                studies[w_done].tell(done, float(nb201_table()[SPACE.index(
                    SPACE.from_params(done.params)), 0]))
            else:
                open_trials.append((w_done, done))
        if step % 11 == 10:  # a failed trial's architecture is seen too
            w_done, done = open_trials.pop()
            if done.number != 1:
                studies[w_done].tell(done, state=optuna.trial.TrialState.FAIL)
            else:
                open_trials.append((w_done, done))
        assert value == value
    keys = [SPACE.from_params(t.params).key for t in first.get_trials() if t.params]
    assert len(keys) == len(set(keys))  # no architecture proposed twice


@pytest.mark.slow
@pytest.mark.parametrize("name", ["regularized-evolution", "local-search"])
def test_a_reloaded_study_continues_like_an_uninterrupted_one(tmp_path, name):
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    options = {"regularized-evolution": {"population_size": 8, "sample_size": 3},
               "local-search": {"n_init": 4}}[name]
    common = dict(space="nb201", strategy=name, estimator="nb201-table", seed=5,
                  strategy_options=options, disable_plugins=["mlflow"], storage=storage)
    whole = frugalnas.create_study(study_name="whole", **common)
    whole.optimize(70)
    part = frugalnas.create_study(study_name="part", **common)
    part.optimize(40)
    del part
    resumed = frugalnas.load_study(study_name="part", storage=storage)
    resumed.optimize(30)
    archs = [str(t.architecture) for t in resumed.trials]
    assert archs == [str(t.architecture) for t in whole.trials]
    assert len(set(archs)) == 70


def test_seen_keys_extend_a_shared_base_without_changing_it():
    base = SeenKeys({"a", "b"})
    seen = SeenKeys({"c"}, base=base)
    seen.add("d")
    seen.add("a")
    blocked = seen | {"e"}
    assert {"a", "b", "c", "d", "e"} == set(blocked) and len(blocked) == 5
    assert "e" not in seen and set(base) == {"a", "b"} and len(seen) == 4
    assert History(seen={"x"}).seen == {"x"}


def test_a_history_shares_its_lists_with_the_record_of_the_study():
    study = optuna.create_study(direction="maximize", sampler=SAMPLERS["random"]())
    study.optimize(_value, n_trials=5)
    finished: dict = {}
    one = read_history(study, SPACE, exclude=-1, finished=finished)
    study.optimize(_value, n_trials=3)
    two = read_history(study, SPACE, exclude=-1, finished=finished)
    assert two.archs is one.archs and len(two) == 8 and two.log == [t.number for t in
                                                                    study.trials]


@pytest.mark.parametrize("strategy", ["random", "regularized-evolution"])
def test_a_sampler_reads_its_own_proposals_back_without_keeping_them(strategy):
    study = frugalnas.create_study(strategy=strategy, estimator="nb201-table", dataset=None,
                                   seed=3, disable_plugins=["mlflow", "progress"])
    study.optimize(30)
    sampler = study.strategy
    # Every finished trial's text was taken back out of the proposals the sampler kept.
    trial = study.optuna_study.ask()
    hist = read_history(study.optuna_study, study.space, exclude=trial.number,
                        parsed=sampler._parsed, finished=sampler._finished)
    assert sampler._parsed == {}
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE]
    assert len(done) == 30
    assert [str(a) for a in hist.archs] == [str(t.architecture) for t in done]
