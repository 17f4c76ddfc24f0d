"""benchmarks/cached_runs.py: the resumable job loop shared by the benchmark scripts."""

import json
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))

from cached_runs import read_cache, run_cached  # noqa: E402


def square(job: int) -> dict:
    return {"job": job, "square": job * job}


@pytest.mark.parametrize("workers", [1, 2])
def test_results_are_appended_to_the_cache_and_read_back(tmp_path, capsys, workers):
    cache = tmp_path / "runs.jsonl"
    assert read_cache(cache) == [] and read_cache(None) == []
    done = run_cached([1, 2, 3], square, workers=workers, cache=cache,
                      describe=lambda r: f"job {r['job']}")
    assert sorted(r["square"] for r in done) == [1, 4, 9]
    lines = cache.read_text().splitlines()
    assert sorted(json.loads(x)["job"] for x in lines) == [1, 2, 3]
    assert sorted(r["job"] for r in read_cache(cache)) == [1, 2, 3]
    err = capsys.readouterr().err
    assert all(f"job {j}" in err for j in (1, 2, 3)) and "3 runs in" in err
    # A resumed benchmark appends only what is new.
    run_cached([4], square, workers=workers, cache=cache, describe=str)
    assert [r["job"] for r in read_cache(cache)][-1] == 4 and len(read_cache(cache)) == 4


def test_no_cache_and_bad_workers():
    assert run_cached([], square, workers=1, cache=None, describe=str) == []
    with pytest.raises(ValueError, match="invalid workers 0; expected an integer >= 1"):
        run_cached([1], square, workers=0, cache=None, describe=str)
