"""ProxyRunner: score many architectures with many proxies, in worker processes, with an
on-disk cache so that a long measurement resumes where it stopped.

    runner = ProxyRunner(space="nb201", proxies=["synflow", "zico"], data=(x, y), seed=0,
                         cache_dir=".proxy_cache", workers=2)
    result = runner.run(architectures)        # a progress bar; cached scores are reused
    result.values["zico"]                     # one value per architecture, in order

**Cache.** One JSON-lines file, ``<cache_dir>/proxy_scores.jsonl``, append-only: one line
per (space, architecture, proxy, data, seed) with the value and the seconds it took. The
key names the space and its options, the architecture's text form, the proxy and its
parameters, a SHA-256 digest of the batch (inputs and labels) and the seed, so a changed
option, batch or seed is never confused with a cached one. Only the parent process
writes, one whole line per ``write`` under an advisory lock (several runners may share a
cache); a line cut short by a killed process is skipped when the file is read, and the
next write starts on a fresh line. Scores that raise are reported and not cached (a rerun
retries them).

**Shipping a cache.** :meth:`ProxyRunner.pack` writes the scores of the runner's space,
batch and seed to one gzip-compressed JSON-lines file (sorted, no time stamp: the same
scores give the same bytes) that can be committed with a repository; a runner given it as
``restore_from`` counts its scores as cached and appends only new ones to its own
``cache_dir``. So a measurement longer than one machine's life continues elsewhere.

**Workers.** ``workers=1`` scores in the calling process. More workers are processes
(``spawn``), each building the same plugin host (``PluginHost.spec()``) and scoring whole
architectures (one network, every missing proxy); with CUDA devices present the workers
are spread over them (``devices``), otherwise each uses ``threads`` CPU threads (default:
the cores divided among the workers). A network is built with ``torch.manual_seed(seed)``
and every proxy seeds itself, so a score does not depend on the worker that computed it
(up to floating-point reduction order across thread counts).

**Shared passes.** The proxies of one network are scored with one
:class:`~frugalnas.proxies.shared.SharedPasses`, so work they have in common (one
re-initialised forward for az_expressivity/az_progressivity and for swap/swap_reg, the input
Jacobians for jacob_cov/epe_nas) is done once; the values are bitwise those of each proxy
alone (the proxies' fast paths too, :mod:`frugalnas.proxies.shared`), so the cache does
not record whether a value was shared. The seconds cached for a
proxy are what it cost in that run: the first proxy of a sharing pair carries the shared
pass, the second only its own remainder.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import math
import os
import time
import weakref
from collections.abc import Callable, Iterable, Sequence
from concurrent.futures import FIRST_COMPLETED, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import torch

from frugalnas.host.plugins import PluginHost
from frugalnas.ports.errors import ConfigError, check_range
from frugalnas.proxies.base import score_with
from frugalnas.proxies.shared import SharedPasses

CACHE_FILE = "proxy_scores.jsonl"

#: A batch made on demand: ``() -> (inputs, targets, num_classes)``.
BatchLoader = Callable[[], tuple[torch.Tensor, torch.Tensor | None, int | None]]


def _json_key(obj: Any) -> str:
    return json.dumps(obj, sort_keys=True, default=str, separators=(",", ":"))


def data_digest(inputs: torch.Tensor, targets: torch.Tensor | None) -> str:
    """A short SHA-256 of a batch (shape, dtype and bytes of inputs and labels)."""
    h = hashlib.sha256()
    for t in (inputs, targets):
        if t is None:
            h.update(b"none")
            continue
        t = t.detach().cpu().contiguous()
        h.update(f"{tuple(t.shape)}{t.dtype}".encode())
        h.update(t.numpy().tobytes())
    return h.hexdigest()[:16]


class ScoreCache:
    """The append-only JSON-lines cache of proxy scores (see the module docstring).

    ``restore_from``: read-only caches loaded first (JSON lines, gzip-compressed when the
    name ends in ``.gz``), such as one shipped in a repository (:meth:`pack`); what they
    hold is not scored again, and new scores go to ``path`` only."""

    def __init__(self, path: str | os.PathLike | None,
                 restore_from: Sequence[str | os.PathLike] = ()):
        self.path = Path(path) if path is not None else None  # None: in memory only
        self.entries: dict[tuple, dict] = {}
        self.skipped = 0  # unreadable lines (a write cut short)
        self.restored = 0  # entries read from ``restore_from``
        for extra in restore_from:
            extra = Path(extra)
            if extra.exists() and (self.path is None
                                   or extra.resolve() != self.path.resolve()):
                before = len(self.entries)
                self._load(extra)
                self.restored += len(self.entries) - before
        if self.path is not None and self.path.exists():
            self._load(self.path)

    @staticmethod
    def key(record: dict) -> tuple:
        return (record["space"], record["arch"], record["proxy"], record["data"],
                int(record["seed"]))

    def _load(self, path: Path) -> None:
        opener = gzip.open if path.suffix == ".gz" else open
        with opener(path, "rt", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                line = line.strip()
                if not line:
                    continue
                try:
                    record = json.loads(line)
                    self.entries[self.key(record)] = record
                except (ValueError, KeyError, TypeError):
                    self.skipped += 1

    def get(self, key: tuple) -> dict | None:
        return self.entries.get(key)

    def pack(self, dest: str | os.PathLike, keep: Any = None) -> int:
        """Write the entries (those for which ``keep(record)`` is true, if given) to
        ``dest`` as gzip-compressed JSON lines, sorted by key, with no time stamp in the
        gzip header (the same entries give the same bytes), through a temporary file and a
        rename. Returns the number of lines written. The result can be committed and
        given back as ``restore_from``."""
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        records = [r for _, r in sorted(self.entries.items(), key=lambda kv: _json_key(kv[0]))
                   if keep is None or keep(r)]
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
        tmp = dest.with_name(dest.name + ".tmp")
        with open(tmp, "wb") as raw, gzip.GzipFile(fileobj=raw, mode="wb", mtime=0,
                                                   filename="") as fh:
            fh.write(text.encode("utf-8"))
        os.replace(tmp, dest)
        return len(records)

    def append(self, records: Sequence[dict]) -> None:
        """Write ``records`` (one line each, in one ``write``) and remember them."""
        if not records:
            return
        if self.path is None:
            for r in records:
                self.entries[self.key(r)] = r
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        text = "".join(json.dumps(r, sort_keys=True) + "\n" for r in records)
        with self.path.open("a+b") as fh:
            _lock(fh)
            try:
                fh.seek(0, os.SEEK_END)
                if fh.tell() > 0:  # a previous writer was killed mid-line: start a new line
                    fh.seek(-1, os.SEEK_END)
                    if fh.read(1) != b"\n":
                        text = "\n" + text
                fh.seek(0, os.SEEK_END)
                fh.write(text.encode("utf-8"))
                fh.flush()
                os.fsync(fh.fileno())
            finally:
                _unlock(fh)
        for r in records:
            self.entries[self.key(r)] = r


def _lock(fh) -> None:
    try:
        import fcntl

        fcntl.flock(fh.fileno(), fcntl.LOCK_EX)
    except (ImportError, OSError):  # no advisory locks here: single writer assumed
        pass


def _unlock(fh) -> None:
    try:
        import fcntl

        fcntl.flock(fh.fileno(), fcntl.LOCK_UN)
    except (ImportError, OSError):
        pass


@dataclass
class RunResult:
    """What :meth:`ProxyRunner.run` returns. ``architectures``: the text form of every
    architecture asked for, in order; ``values[proxy]`` and ``seconds[proxy]``: one entry
    per architecture (``nan`` where it is missing); ``complete``: whether every proxy has a
    value for that architecture; ``scored``/``cached``: architectures scored in this run /
    found complete in the cache; ``errors``: ``(architecture, proxy, message)``;
    ``busy_seconds``: what scoring this run's architectures cost where they were scored
    (building each network and every proxy, not the waiting), ``busy_cpu_seconds`` the same
    in CPU time of the scoring process; ``pids``: the processes that scored them."""

    architectures: list[str]
    proxies: list[str]
    values: dict[str, list[float]]
    seconds: dict[str, list[float]]
    complete: list[bool]
    scored: int = 0
    cached: int = 0
    errors: list[tuple[str, str, str]] = field(default_factory=list)
    busy_seconds: float = 0.0
    pids: list[int] = field(default_factory=list)
    busy_cpu_seconds: float = 0.0

    def rows(self) -> list[dict[str, Any]]:
        """``{"arch": ..., "values": {...}, "seconds": {...}}`` of each complete architecture."""
        return [{"arch": a, "values": {p: self.values[p][i] for p in self.proxies},
                 "seconds": {p: self.seconds[p][i] for p in self.proxies}}
                for i, a in enumerate(self.architectures) if self.complete[i]]

    @property
    def missing(self) -> list[str]:
        return [a for a, ok in zip(self.architectures, self.complete) if not ok]


class ProxyRunner:
    """Scores architectures of a search space with registered proxies on one fixed batch.

    ``space``: a registered name (with ``space_options``) or a ``SearchSpace`` object;
    ``proxies``: names, each created with ``proxy_options.get(name, {})``; ``data``: the
    batch ``(inputs, targets)`` (``targets`` may be ``None`` when no proxy needs labels), or
    a function returning ``(inputs, targets, num_classes)``, called once, the first time an
    architecture is not in the cache; ``data_key``: the batch's part of the cache key (default:
    a digest of the batch, which then has to be loaded first); give one that names how the
    batch is made (dataset, options, size, seed) and a run whose scores are all cached never
    loads it; ``seed``: the network initialisation seed; ``cache_dir``: where the cache
    lives (``None``: in memory, for the runner's life); ``workers``: processes (1: in this
    process, unless ``spawn``); ``spawn``: score in worker processes even with one worker
    (its own torch threads, the caller's process untouched); ``devices``: torch
    device names for the workers (default: every CUDA device if there is one, else the CPU);
    ``threads``: CPU threads per worker; ``progress``: a tqdm bar on stderr; ``share``:
    let the proxies of one network share their common passes (``SharedPasses``; the same
    values, less work; ``False`` only to measure what the sharing saves);
    ``restore_from``: read-only caches (``.jsonl`` or ``.jsonl.gz``, e.g. one shipped with a
    repository, see :meth:`ScoreCache.pack`) whose scores count as cached.

    The workers are persistent: started on the first architecture to score, they keep the
    space, the proxies and the batch (sent once) and serve every later :meth:`run` until
    :meth:`close` (or the runner is collected); with one worker in this process the same
    holds for this process. ``evaluations`` and ``busy_seconds`` count every architecture
    scored over the runner's life."""

    def __init__(self, host: Any = None, space: Any = "nb201", proxies: Sequence[str] = (),
                 data: tuple[torch.Tensor, torch.Tensor | None] | BatchLoader | None = None,
                 seed: int = 0,
                 cache_dir: str | os.PathLike | None = None, workers: int = 1,
                 space_options: dict[str, Any] | None = None,
                 proxy_options: dict[str, dict[str, Any]] | None = None,
                 num_classes: int | None = None, devices: Sequence[str] | None = None,
                 threads: int | None = None, progress: bool = True, share: bool = True,
                 restore_from: Sequence[str | os.PathLike] = (), data_key: str | None = None,
                 spawn: bool = False):
        if data is None:
            raise ConfigError("ProxyRunner needs the batch to score on: data=(inputs, targets)")
        if not proxies or isinstance(proxies, str):
            raise ConfigError(f"invalid runner proxies {proxies!r}; give a list of proxy names")
        check_range("workers", workers, 1)
        self.host = host if host is not None else PluginHost()
        self.space_options = dict(space_options or {})
        if isinstance(space, str):
            self.space_name = space
            self.space = self.host.create("search_spaces", space, **self.space_options)
            self.space_key = f"{space}:{_json_key(self.space_options)}"
        else:
            self.space = space
            self.space_name = None
            self.space_key = f"{space.name}:{_json_key(vars(space))}"
        self.proxy_names = list(proxies)
        self.proxy_options = {n: dict((proxy_options or {}).get(n, {})) for n in self.proxy_names}
        self.proxies = {n: self.host.create("proxies", n, **self.proxy_options[n])
                        for n in self.proxy_names}
        self.proxy_keys = {n: f"{n}:{_json_key(p.get_params())}" for n, p in self.proxies.items()}
        self.inputs: torch.Tensor | None = None
        self.targets: torch.Tensor | None = None
        self.num_classes = 10
        self._loader: BatchLoader | None = None
        self.data_key = data_key
        if callable(data):
            self._loader = data
            self._given_classes = num_classes
        else:
            self._set_batch(data[0], data[1], num_classes)
        self.seed = int(seed)
        self.cache = ScoreCache(Path(cache_dir) / CACHE_FILE if cache_dir is not None else None,
                                restore_from)
        self.workers = int(workers)
        self.spawn = bool(spawn)
        if devices is None:
            n = torch.cuda.device_count() if torch.cuda.is_available() else 0
            devices = [f"cuda:{i}" for i in range(n)] or ["cpu"]
        self.devices = list(devices)
        if threads is None:
            threads = max(1, (os.cpu_count() or 1) // self.workers)
        self.threads = int(threads)
        self.progress = progress
        self.share = bool(share)
        self.evaluations = 0
        self.busy_seconds = 0.0
        self._local: _Scorer | None = None
        self._pool: ProcessPoolExecutor | None = None
        self._stop_pool: weakref.finalize | None = None

    def _set_batch(self, inputs: torch.Tensor, targets: torch.Tensor | None,
                   num_classes: int | None) -> None:
        if targets is None and any(p.needs_labels for p in self.proxies.values()):
            raise ConfigError("a proxy needs labels: pass data=(inputs, targets)")
        self.inputs = inputs.detach().cpu()
        self.targets = None if targets is None else targets.detach().cpu()
        if num_classes is None:
            num_classes = int(self.targets.max()) + 1 if self.targets is not None else 10
        self.num_classes = max(int(num_classes), 2)
        if self.data_key is None:
            self.data_key = data_digest(self.inputs, self.targets)

    def _load_batch(self) -> None:
        """Load a batch given as a function (once)."""
        if self._loader is not None:
            loader, self._loader = self._loader, None
            inputs, targets, num_classes = loader()
            self._set_batch(inputs, targets,
                            num_classes if num_classes is not None else self._given_classes)

    def close(self) -> None:
        """Stop the worker processes (a later :meth:`run` starts new ones)."""
        if self._stop_pool is not None:
            self._stop_pool()
        self._pool, self._stop_pool = None, None

    def __enter__(self) -> Self:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def pack(self, dest: str | os.PathLike) -> int:
        """Write this runner's cached scores (its space, batch and seed; every proxy) to
        ``dest`` as gzip JSON lines (:meth:`ScoreCache.pack`), to ship and restore."""
        if self.cache.path is None:
            raise ConfigError("this runner has no cache to pack (cache_dir=None)")
        self._load_batch()
        return self.cache.pack(dest, lambda r: (r["space"], r["data"], int(r["seed"])) == (
            self.space_key, self.data_key, self.seed))

    # -- keys -------------------------------------------------------------------------------
    def _key(self, arch: str, proxy: str) -> tuple:
        return (self.space_key, arch, self.proxy_keys[proxy], self.data_key, self.seed)

    def _record(self, arch: str, proxy: str, value: float, seconds: float) -> dict:
        return {"space": self.space_key, "arch": arch, "proxy": self.proxy_keys[proxy],
                "name": proxy, "data": self.data_key, "seed": self.seed, "value": value,
                "seconds": seconds}

    # -- running ----------------------------------------------------------------------------
    def run(self, architectures: Iterable[Any], limit: int | None = None,
            budget: float | None = None) -> RunResult:
        """Score every architecture (objects of the space or their text form) with every
        proxy, reusing the cache. ``limit``: score at most this many architectures that need
        scoring, then stop; ``budget``: stop starting new ones after this many seconds. The
        cache keeps everything scored, so the same call later resumes."""
        archs = [a if isinstance(a, str) else str(a) for a in architectures]
        if self.data_key is None:
            self._load_batch()
        todo: list[tuple[str, list[str]]] = []
        found: dict[tuple[str, str], tuple[float, float]] = {}
        for a in dict.fromkeys(archs):
            missing = []
            for p in self.proxy_names:
                hit = self.cache.get(self._key(a, p))
                if hit is None:
                    missing.append(p)
                else:
                    found[(a, p)] = (float(hit["value"]), float(hit.get("seconds", math.nan)))
            if missing:
                todo.append((a, missing))
        cached = len(dict.fromkeys(archs)) - len(todo)
        if limit is not None:
            todo = todo[: max(0, int(limit))]
        errors: list[tuple[str, str, str]] = []
        bar = self._bar(len(dict.fromkeys(archs)), cached) if todo else None
        scored, busy, busy_cpu, pids = 0, 0.0, 0.0, []
        start = time.perf_counter()

        def take(arch: str, result: Scored) -> None:
            nonlocal scored, busy, busy_cpu
            records = []
            busy += result.seconds
            busy_cpu += result.cpu_seconds
            self.busy_seconds += result.seconds
            if result.pid not in pids:
                pids.append(result.pid)
            for p, (value, seconds, error) in result.outcomes.items():
                if error is not None or value is None or not math.isfinite(value):
                    errors.append((arch, p, error or f"non-finite value {value!r}"))
                    continue
                found[(arch, p)] = (value, seconds)
                records.append(self._record(arch, p, value, seconds))
            self.cache.append(records)
            scored += 1
            self.evaluations += 1
            if bar is not None:
                bar.update(1)
                bar.set_postfix_str(f"scored={scored} errors={len(errors)}")

        if todo:
            self._load_batch()
        try:
            if todo and self.workers <= 1 and not self.spawn:
                if self._local is None:
                    self._local = _Scorer(self._worker_config(self.devices[0]),
                                          self.host)
                with torch.random.fork_rng(devices=[]):  # the caller's RNG untouched
                    for arch, missing in todo:
                        if budget is not None and time.perf_counter() - start > budget:
                            break
                        take(arch, self._local.score(arch, missing))
            elif todo:
                self._run_pool(todo, take, budget, start)
        finally:
            if bar is not None:
                bar.close()
        values = {p: [] for p in self.proxy_names}
        seconds = {p: [] for p in self.proxy_names}
        complete = []
        for a in archs:
            ok = True
            for p in self.proxy_names:
                v, s = found.get((a, p), (math.nan, math.nan))
                ok = ok and (a, p) in found
                values[p].append(v)
                seconds[p].append(s)
            complete.append(ok)
        return RunResult(archs, list(self.proxy_names), values, seconds, complete, scored,
                         cached, errors, busy, pids, busy_cpu)

    def _bar(self, total: int, initial: int):
        if not self.progress:
            return None
        import sys

        from tqdm.auto import tqdm

        return tqdm(total=total, initial=initial, desc="proxies", unit="arch", file=sys.stderr,
                    dynamic_ncols=True, smoothing=0.05)

    def _worker_config(self, device: str) -> dict[str, Any]:
        return {"host": self.host.spec(), "space_name": self.space_name,
                "space_options": self.space_options,
                "space": None if self.space_name is not None else self.space,
                "proxies": self.proxy_names, "proxy_options": self.proxy_options,
                "inputs": self.inputs, "targets": self.targets, "num_classes": self.num_classes,
                "seed": self.seed, "device": device, "threads": self.threads,
                "share": self.share}

    def _ensure_pool(self) -> ProcessPoolExecutor:
        import multiprocessing as mp

        if self._pool is None:
            ctx = mp.get_context("spawn")
            queue = ctx.Queue()
            for i in range(self.workers):
                queue.put(self.devices[i % len(self.devices)])
            self._pool = ProcessPoolExecutor(self.workers, mp_context=ctx,
                                             initializer=_init_worker,
                                             initargs=(self._worker_config(""), queue))
            # the pool, not the runner: a collected runner stops its workers
            self._stop_pool = weakref.finalize(self, self._pool.shutdown, wait=True,
                                               cancel_futures=True)
        return self._pool

    def _run_pool(self, todo, take, budget, start) -> None:
        pool = self._ensure_pool()
        pending = list(reversed(todo))
        running: dict[Any, str] = {}
        try:
            while pending or running:
                while pending and len(running) < 2 * self.workers and not (
                        budget is not None and time.perf_counter() - start > budget):
                    arch, missing = pending.pop()
                    running[pool.submit(_score_one, arch, missing)] = arch
                if not running:
                    break
                done, _ = wait(running, return_when=FIRST_COMPLETED)
                for fut in done:
                    take(running.pop(fut), fut.result())
        except BaseException as exc:
            for fut in running:
                fut.cancel()
            if isinstance(exc, BrokenProcessPool):  # a worker died: the next run starts anew
                self.close()
            raise


# -- worker side ---------------------------------------------------------------------------
#: A worker process's scorer (built once by the pool's initializer).
_STATE: dict[str, Any] = {}

Outcome = tuple[float | None, float, str | None]  # value, seconds, error


@dataclass(frozen=True)
class Scored:
    """One architecture's scores: ``{proxy: (value, seconds, error)}``, the seconds of the
    whole (network built and every proxy; wall and CPU time of the scoring process) and the
    process that scored it."""

    outcomes: dict[str, Outcome]
    seconds: float
    pid: int
    cpu_seconds: float = 0.0


class _Scorer:
    """What a worker keeps between architectures: the space, the proxies and the batch on
    its device."""

    def __init__(self, config: dict[str, Any], host: Any = None):
        host = host if host is not None else PluginHost(**config["host"])
        self.config = config
        self.space = config["space"] if config["space"] is not None else host.create(
            "search_spaces", config["space_name"], **config["space_options"])
        self.device = torch.device(config["device"])
        self.proxies = {n: host.create("proxies", n, **config["proxy_options"].get(n, {}))
                        for n in config["proxies"]}
        self.inputs = config["inputs"].to(self.device)
        self.targets = None if config["targets"] is None else config["targets"].to(self.device)

    def score(self, arch_text: str, proxies: list[str]) -> Scored:
        """Build the network of ``arch_text`` (seeded) and score it with each proxy, the
        proxies sharing their common passes through one ``SharedPasses`` (unless the runner
        was made with ``share=False``)."""
        begin, cpu = time.perf_counter(), time.process_time()
        cfg, device = self.config, self.device
        x, y = self.inputs, self.targets
        out: dict[str, Outcome] = {}
        try:
            arch = self.space.parse(arch_text)
            torch.manual_seed(int(cfg["seed"]))
            model = self.space.build(arch, int(cfg["num_classes"]), tuple(x.shape[1:])).to(device)
        except Exception as exc:  # noqa: BLE001 - report, do not stop the run
            out = {p: (None, math.nan, f"build failed: {type(exc).__name__}: {exc}")
                   for p in proxies}
            return Scored(out, time.perf_counter() - begin, os.getpid(),
                          time.process_time() - cpu)
        shared = SharedPasses(model, x, y) if cfg.get("share", True) else None
        for p in proxies:
            start = time.perf_counter()
            try:
                value = score_with(self.proxies[p], model, x, y, shared)
                if device.type == "cuda":
                    torch.cuda.synchronize(device)
                out[p] = (value, time.perf_counter() - start, None)
            except Exception as exc:  # noqa: BLE001
                out[p] = (None, time.perf_counter() - start, f"{type(exc).__name__}: {exc}")
        return Scored(out, time.perf_counter() - begin, os.getpid(), time.process_time() - cpu)


def _init_worker(config: dict[str, Any], queue: Any) -> None:
    config = dict(config)
    config["device"] = queue.get()
    torch.set_num_threads(int(config["threads"]))
    _STATE["scorer"] = _Scorer(config)


def _score_one(arch_text: str, proxies: list[str]) -> Scored:
    return _STATE["scorer"].score(arch_text, proxies)
