"""The resumable job loop the benchmark scripts share: run independent jobs (in a process pool
when ``workers > 1``, in this process otherwise), append each finished result to a JSON-lines
cache as soon as it arrives, and print one progress line per result on stderr. A rerun reads the
cache back (:func:`read_cache`) and leaves out the jobs it already holds, so an interrupted
benchmark resumes where it stopped."""

from __future__ import annotations

import json
import sys
import time
from collections.abc import Callable, Iterable
from multiprocessing import Pool
from pathlib import Path
from typing import Any


def read_cache(path: Path | None) -> list[dict[str, Any]]:
    """Every record of the JSON-lines file ``path`` in file order (none when it is not given or
    does not exist yet)."""
    if path is None or not path.exists():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]


def run_cached(jobs: Iterable[Any], worker: Callable[[Any], dict[str, Any]], *, workers: int,
               cache: Path | None, describe: Callable[[dict[str, Any]], str]) -> list[dict[str, Any]]:
    """Run ``worker(job)`` for every job and return the results in the order they finished.
    Each result is appended to ``cache`` (when given) before the next one is awaited, and
    ``describe(result)`` is printed on stderr. ``worker`` must be a module-level function when
    ``workers > 1`` (the pool pickles it)."""
    if workers < 1:
        raise ValueError(f"invalid workers {workers!r}; expected an integer >= 1")
    jobs = list(jobs)
    done: list[dict[str, Any]] = []
    start = time.perf_counter()
    if jobs:
        if workers == 1:
            results: Iterable[dict[str, Any]] = map(worker, jobs)
            _consume(results, done, cache, describe)
        else:
            with Pool(workers) as pool:
                _consume(pool.imap_unordered(worker, jobs, chunksize=1), done, cache, describe)
    print(f"({len(jobs)} runs in {time.perf_counter() - start:.0f}s wall, {workers} worker(s))",
          file=sys.stderr)
    return done


def _consume(results: Iterable[dict[str, Any]], done: list[dict[str, Any]], cache: Path | None,
             describe: Callable[[dict[str, Any]], str]) -> None:
    for res in results:
        done.append(res)
        if cache is not None:
            with cache.open("a") as fh:
                fh.write(json.dumps(res) + "\n")
        print(f"  {describe(res)}", file=sys.stderr, flush=True)
