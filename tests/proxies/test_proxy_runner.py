"""ProxyRunner: scores match a direct computation, the cache resumes exactly where a run
stopped (limit, killed process, a line cut short) and only the missing cells are scored."""

import json
import os
import signal
import subprocess
import sys
import textwrap
import time

import pytest
import torch

from frugalnas import hookimpl
from frugalnas.ports.errors import ConfigError
from frugalnas.host.plugins import PluginHost
from frugalnas.proxies import Proxy
from frugalnas.proxies.runner import CACHE_FILE, ProxyRunner, ScoreCache
from frugalnas.spaces.nb201.space import NB201Space

SPACE_OPTIONS = {"N": 1, "C": 4}
PROXIES = ["params", "l2_norm", "meco"]
INDICES = [7, 123, 4567, 9000, 15000]


def data(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g)


def archs():
    space = NB201Space(**SPACE_OPTIONS)
    return [str(space.from_index(i)) for i in INDICES]


def runner(cache_dir, **kw):
    opts = dict(space="nb201", space_options=SPACE_OPTIONS, proxies=PROXIES, data=data(),
                seed=0, cache_dir=cache_dir, workers=1, progress=False, num_classes=10)
    opts.update(kw)
    return ProxyRunner(**opts)


def cache_lines(cache_dir):
    return (cache_dir / CACHE_FILE).read_text().splitlines()


def test_runner_scores_match_a_direct_computation(tmp_path):
    res = runner(tmp_path).run(archs())
    assert res.complete == [True] * 5 and res.scored == 5 and res.cached == 0
    host, space = PluginHost(), NB201Space(**SPACE_OPTIONS)
    x, y = data()
    for i, a in enumerate(archs()):
        torch.manual_seed(0)
        model = space.build(space.parse(a), 10, (3, 8, 8))
        for p in PROXIES:
            assert res.values[p][i] == host.create("proxies", p).score(model, x, y)
    assert len(cache_lines(tmp_path)) == 5 * len(PROXIES)
    assert [r["arch"] for r in res.rows()] == archs()


def test_cache_resumes_where_a_limited_run_stopped(tmp_path):
    first = runner(tmp_path).run(archs(), limit=2)
    assert first.scored == 2 and first.complete == [True, True, False, False, False]
    assert first.missing == archs()[2:]
    assert len(cache_lines(tmp_path)) == 2 * len(PROXIES)
    second = runner(tmp_path).run(archs())  # a new runner, as after a restart
    assert second.scored == 3 and second.cached == 2 and all(second.complete)
    assert len(cache_lines(tmp_path)) == 5 * len(PROXIES)  # nothing scored twice
    fresh = runner(None).run(archs())
    assert second.values == fresh.values
    third = runner(tmp_path).run(archs())
    assert third.scored == 0 and third.cached == 5 and third.values == fresh.values


def test_a_new_proxy_scores_only_what_is_missing(tmp_path):
    runner(tmp_path).run(archs())
    more = runner(tmp_path, proxies=PROXIES + ["naswot"]).run(archs())
    assert more.scored == 5 and all(more.complete)
    names = [json.loads(line)["name"] for line in cache_lines(tmp_path)]
    assert names.count("naswot") == 5 and names.count("meco") == 5


def test_cache_keys_hold_the_seed_batch_and_proxy_options(tmp_path):
    base = runner(tmp_path).run(archs()[:2])
    assert runner(tmp_path, seed=1).run(archs()[:2]).scored == 2
    assert runner(tmp_path, data=data(1)).run(archs()[:2]).scored == 2
    other = runner(tmp_path, proxies=["meco"], proxy_options={"meco": {"samples": 2}})
    assert other.run(archs()[:2]).scored == 2
    assert runner(tmp_path, space_options={"N": 1, "C": 8}).run(archs()[:2]).scored == 2
    assert runner(tmp_path).run(archs()[:2]).values == base.values  # still cached


def test_a_line_cut_short_by_a_kill_is_skipped_and_rescored(tmp_path):
    full = runner(tmp_path).run(archs())
    lines = cache_lines(tmp_path)
    # the process died while writing the last record: keep half of that line
    (tmp_path / CACHE_FILE).write_text("\n".join(lines[:-1]) + "\n" + lines[-1][:20])
    cache = ScoreCache(tmp_path / CACHE_FILE)
    assert cache.skipped == 1 and len(cache.entries) == len(lines) - 1
    again = runner(tmp_path).run(archs())
    assert again.scored == 1 and again.values == full.values
    reread = ScoreCache(tmp_path / CACHE_FILE)  # the next record started on a fresh line
    assert reread.skipped == 1 and len(reread.entries) == len(lines)


class _Fails(Proxy):
    """fails: raises on every network (a test double)."""
    name = "fails"
    needs_data = False
    needs_labels = False

    def compute(self, model, inputs, targets):
        raise RuntimeError("boom")


class _FailsPlugin:
    @hookimpl
    def frugalnas_proxies(self):
        return {"fails": _Fails}


def test_errors_are_reported_and_not_cached(tmp_path):
    host = PluginHost([_FailsPlugin()], autoload=False)
    res = runner(tmp_path, host=host, proxies=["params", "fails"]).run(archs()[:2])
    assert res.complete == [False, False] and len(res.errors) == 2
    assert "boom" in res.errors[0][2]
    names = [json.loads(line)["name"] for line in cache_lines(tmp_path)]
    assert names == ["params", "params"]


def test_bad_arguments_are_config_errors():
    with pytest.raises(ConfigError, match="data"):
        ProxyRunner(proxies=["params"], data=None)
    with pytest.raises(ConfigError, match="labels"):
        ProxyRunner(proxies=["snip"], data=(torch.zeros(2, 3, 8, 8), None))
    with pytest.raises(ConfigError, match="proxy names"):
        ProxyRunner(proxies="params", data=data())


KILLED_RUN = textwrap.dedent("""
    import sys, torch
    from frugalnas.proxies.runner import ProxyRunner
    from frugalnas.spaces.nb201.space import NB201Space
    if __name__ == "__main__":
        g = torch.Generator().manual_seed(0)
        data = (torch.randn(8, 3, 8, 8, generator=g), torch.randint(0, 10, (8,), generator=g))
        space = NB201Space(N=1, C=4)
        archs = [str(space.from_index(i)) for i in range(16)]
        ProxyRunner(space="nb201", space_options={"N": 1, "C": 4}, proxies=%r, data=data,
                    seed=0, cache_dir=sys.argv[1], workers=int(sys.argv[2]), progress=False,
                    num_classes=10).run(archs)
""")


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
def test_a_killed_run_resumes_scoring_only_the_missing_cells(tmp_path, workers):
    script = tmp_path / "run.py"
    script.write_text(KILLED_RUN % (PROXIES,))
    cache_dir = tmp_path / "cache"
    proc = subprocess.Popen([sys.executable, str(script), str(cache_dir), str(workers)],
                            start_new_session=True)
    deadline = time.monotonic() + 300
    try:
        while time.monotonic() < deadline:  # wait for a few cells, then kill the whole group
            path = cache_dir / CACHE_FILE
            if path.exists() and len(path.read_text().splitlines()) >= 3 * len(PROXIES):
                break
            if proc.poll() is not None:
                pytest.fail("the run ended before it could be killed")
            time.sleep(0.05)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        proc.wait(timeout=60)
    done = ScoreCache(cache_dir / CACHE_FILE)
    cells = {k[1] for k in done.entries}
    assert 3 <= len(cells) < 16
    space = NB201Space(N=1, C=4)
    all_archs = [str(space.from_index(i)) for i in range(16)]
    before = {k: v["value"] for k, v in done.entries.items()}
    complete = sum(all(any(k[1] == a and k[2].startswith(p + ":") for k in done.entries)
                       for p in PROXIES) for a in all_archs)
    resumed = runner(cache_dir).run(all_archs)
    assert all(resumed.complete) and resumed.cached == complete
    assert resumed.scored == 16 - complete
    after = ScoreCache(cache_dir / CACHE_FILE).entries
    assert all(after[k]["value"] == v for k, v in before.items())  # nothing rescored
    fresh = runner(None).run(all_archs)
    for p in PROXIES:  # workers use other thread counts: equal up to reduction order
        assert resumed.values[p] == pytest.approx(fresh.values[p], rel=1e-4)


def test_a_packed_cache_restores_into_an_empty_cache_dir_and_resumes(tmp_path):
    runner(tmp_path / "a").run(archs(), limit=2)
    runner(tmp_path / "a", seed=1).run(archs()[:1])  # another protocol in the same cache
    shipped = tmp_path / "shipped" / "proxy_scores.jsonl.gz"
    assert runner(tmp_path / "a").pack(shipped) == 2 * len(PROXIES)  # only this protocol's
    packed = shipped.read_bytes()
    runner(tmp_path / "a").pack(shipped)
    assert shipped.read_bytes() == packed  # the same scores give the same bytes
    restored = runner(tmp_path / "b", restore_from=[shipped])
    assert restored.cache.restored == 2 * len(PROXIES)
    res = restored.run(archs())
    assert res.cached == 2 and res.scored == 3 and all(res.complete)
    assert len(cache_lines(tmp_path / "b")) == 3 * len(PROXIES)  # new scores only, locally
    assert res.values == runner(None).run(archs()).values
    again = runner(tmp_path / "b", restore_from=[shipped]).run(archs())
    assert again.scored == 0 and again.values == res.values


def _benchmark():
    import importlib.util
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "benchmarks" / "proxies_nb201.py"
    spec = importlib.util.spec_from_file_location("proxies_nb201_bench", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_shipped_measurement_resumes_without_rescoring(tmp_path):
    """The committed folder benchmarks/results/proxies_nb201 holds the batch and the packed
    cache; a runner set up as the benchmark sets it up, on a fresh cache, finds every
    shipped cell complete."""
    import gzip
    import random

    bench = _benchmark()
    shipped = bench.SHIPPED_DIR
    if not (shipped / bench.SHIPPED_CACHE).exists():
        pytest.skip("no shipped measurement in this checkout")
    x, y = bench.fixed_batch("mnist5k", 64, 0, shipped)
    with gzip.open(shipped / bench.SHIPPED_CACHE, "rt") as fh:
        records = [json.loads(line) for line in fh]
    names = sorted({r["name"] for r in records})
    per_arch: dict = {}
    for r in records:
        per_arch.setdefault(r["arch"], set()).add(r["name"])
    complete = {a for a, got in per_arch.items() if got == set(names)}
    space = NB201Space(N=5, C=16)
    archs_ = [str(space.from_index(i)) for i in random.Random(0).sample(range(15625), 1000)]
    r = ProxyRunner(space="nb201", space_options={"N": 5, "C": 16}, proxies=names,
                    data=(x, y), seed=0, cache_dir=None, workers=1, progress=False,
                    num_classes=10)
    assert {rec["data"] for rec in records} == {r.data_key}  # the shipped batch's digest
    r = ProxyRunner(space="nb201", space_options={"N": 5, "C": 16}, proxies=names,
                    data=(x, y), seed=0, cache_dir=tmp_path, workers=1, progress=False,
                    num_classes=10, restore_from=[shipped / bench.SHIPPED_CACHE])
    res = r.run(archs_, limit=0)
    assert res.scored == 0 and res.cached == len(complete) > 0
    assert set(archs_[:len(complete)]) == complete  # a prefix of the seeded order


def test_paired_difference_of_the_benchmark_cancels_what_two_rows_share():
    import numpy as np

    bench = _benchmark()
    rng = np.random.default_rng(0)
    acc = rng.normal(size=60)
    noisy = acc + rng.normal(scale=1.0, size=60)
    boots = rng.integers(0, 60, size=(200, 60))
    same = bench.paired_difference(noisy, noisy, acc, boots)
    assert same["rho"] == same["tau"] == 0.0 and same["rho_ci"] == same["tau_ci"] == [0.0, 0.0]
    better = bench.paired_difference(acc, noisy, acc, boots)  # the accuracy itself is perfect
    single = bench.correlation_ci(noisy, acc, boots)
    assert better["rho"] == pytest.approx(1 - single["rho"])
    assert better["tau"] == pytest.approx(1 - single["tau"])
    assert 0 < better["tau_ci"][0] < better["tau"] < better["tau_ci"][1]
