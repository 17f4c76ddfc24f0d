"""The pre-screen's proxy scoring: a persistent scorer (one batch, one network per
architecture), scores cached per architecture in memory and on disk, the same values as
scoring each candidate from scratch, and a cache that does not survive a change of batch."""

import os
import time
from pathlib import Path

import pytest
import torch

import frugalnas
from frugalnas import hookimpl
from frugalnas.ports.keys import PRESCREEN_ATTR
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies import Proxy
from frugalnas.proxies.runner import CACHE_FILE
from frugalnas.strategies.prescreen import PrescreenSampler

SMALL = {"N": 1, "C": 8}
#: The pre-screen's proxies build the SMALL networks; the table scores the chosen cells as in
#: the benchmark network.
ANY_NETWORK = {"any_network": True}
GAUSSIAN = {"data": "gaussian", "input_shape": [3, 8, 8], "batch_size": 4}


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny networks: one torch thread is faster than several on a busy machine."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


class LoggedSpread(Proxy):
    """Standard deviation of the untrained network's logits; appends a line to ``log`` each
    time it is computed, so a test counts the real scorings wherever they happen."""

    name = "logged_spread"
    needs_data = True
    needs_labels = False
    passes = 1.0

    def __init__(self, log: str = ""):
        self.log = log

    def compute(self, model, inputs, targets) -> float:
        with open(self.log, "a") as fh:
            fh.write("scored\n")
        with torch.no_grad():
            return float(model(inputs).std())


class LoggedPlugin:
    @hookimpl
    def frugalnas_proxies(self):
        return {"logged_spread": LoggedSpread}


class Recording(PrescreenSampler):
    """The real sampler, also keeping the candidates it scored, trial by trial."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.candidates: list[list[str]] = []

    def _scores(self, archs):
        self.candidates.append([str(a) for a in archs])
        return super()._scores(archs)


def screened_study(log: Path, trials: int = 12, seed: int = 0, **options) -> tuple[
        frugalnas.Study, Recording]:
    host = PluginHost(plugins=[LoggedPlugin()])
    space = host.create("search_spaces", "nb201", **SMALL)
    inner = host.create("strategies", "regularized-evolution", space=space, seed=seed,
                        population_size=6, sample_size=2, n_init=4)
    settings = {"proxy": "logged_spread", "k": 6, **GAUSSIAN,
                "proxy_options": {"log": str(log)}, **options}
    sampler = Recording(inner, space=space, host=host, seed=seed, **settings)
    study = frugalnas.create_study(space="nb201", space_options=SMALL, strategy=sampler,
                                   estimator="nb201-table", dataset=None, host=host,
                                   estimator_options=ANY_NETWORK,
                                   disable_plugins=["mlflow", "progress"])
    study.optimize(trials)
    return study, sampler


def scorings(log: Path) -> int:
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_cached_candidate_is_never_scored_again(tmp_path):
    log = tmp_path / "scored.log"
    study, sampler = screened_study(log)
    proposed = [a for trial in sampler.candidates for a in trial]
    distinct = set(proposed)
    # the evolution proposes some candidates again in later trials: those cost no scoring
    assert len(distinct) < len(proposed)
    assert scorings(log) == len(distinct) == sampler.stats.evaluations
    assert sampler.stats.cache_hits == len(proposed) - len(distinct)
    assert sampler.stats.pids == [os.getpid()]  # workers=0: scored in the study's process
    assert [t.system_attrs[PRESCREEN_ATTR]["prescreen_scored"] for t in study.trials] == [
        len(c) for c in sampler.candidates]


@pytest.mark.slow
def test_cached_scores_equal_scoring_each_candidate_from_scratch(tmp_path):
    log = tmp_path / "scored.log"
    study, sampler = screened_study(log, trials=8, seed=2)
    x, y, num_classes = sampler._fixed_batch()
    proxy = LoggedSpread(log=str(tmp_path / "direct.log"))
    for trial, candidates in zip(study.trials, sampler.candidates):
        direct = {}
        for a in candidates:
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(2)
                model = study.space.build(study.space.parse(a), num_classes, tuple(x.shape[1:]))
            direct[a] = proxy.score(model, x, y)
        best = max(candidates, key=lambda a: direct[a])  # ties: the first, as the sampler
        assert str(trial.architecture) == best
        assert trial.system_attrs[PRESCREEN_ATTR]["proxy_logged_spread"] == direct[best]


@pytest.mark.slow
def test_the_disk_cache_serves_a_later_study_until_the_batch_options_change(tmp_path):
    cache, log = tmp_path / "cache", tmp_path / "scored.log"
    first, s1 = screened_study(log, trials=6, cache_dir=str(cache))
    assert s1.stats.evaluations == scorings(log) > 0
    # the same options and seed: every score comes from the file, the same choices follow
    second, s2 = screened_study(log, trials=6, cache_dir=str(cache))
    assert scorings(log) == s1.stats.evaluations and s2.stats.evaluations == 0
    assert [t.system_attrs[PRESCREEN_ATTR] for t in second.trials] == [
        t.system_attrs[PRESCREEN_ATTR] for t in first.trials]
    assert [str(t.architecture) for t in second.trials] == [str(t.architecture)
                                                            for t in first.trials]
    # another batch size is another batch: nothing cached applies, all is scored again
    _, s3 = screened_study(log, trials=6, cache_dir=str(cache), batch_size=3)
    assert s3.stats.evaluations == s1.stats.evaluations
    assert scorings(log) == 2 * s1.stats.evaluations
    lines = (cache / CACHE_FILE).read_text().splitlines()
    assert len(lines) == 2 * s1.stats.evaluations


@pytest.mark.slow
def test_a_persistent_worker_process_scores_every_trial(tmp_path):
    """workers=1: one spawned process, started on the first trial, scores every candidate of
    every trial with the values the study's own process computes; close() ends it."""
    options = {"space": "nb201", "space_options": SMALL, "estimator": "nb201-table",
               "estimator_options": ANY_NETWORK, "dataset": None,
               "disable_plugins": ["mlflow", "progress"], "seed": 5, "strategy": "prescreen"}
    strategy = {"inner": "regularized-evolution", "proxy": ["synflow", "naswot"], "k": 5,
                **GAUSSIAN, "inner_options": {"population_size": 6, "n_init": 4}}
    remote = frugalnas.create_study(strategy_options={**strategy, "workers": 1}, **options)
    local = frugalnas.create_study(strategy_options=strategy, **options)
    remote.optimize(6)
    local.optimize(6)
    stats = remote.strategy.stats
    assert len(stats.pids) == 1 and stats.pids[0] != os.getpid()
    assert stats.evaluations > 6  # several candidates a trial, all in that one process
    pid = stats.pids[0]
    os.kill(pid, 0)  # still alive between trials
    assert [t.system_attrs[PRESCREEN_ATTR] for t in remote.trials] == [
        t.system_attrs[PRESCREEN_ATTR] for t in local.trials]
    remote.strategy.close()
    with pytest.raises(ProcessLookupError):
        for _ in range(200):
            os.kill(pid, 0)
            time.sleep(0.05)
