"""``frugalnas.compression``: a trained language model in, a smaller one out, in four stages that
each leave their result in the output folder, so that a run that stops resumes where it
stopped:

1. **importance** (``ordered/``): the parent's heads, MLP units, embedding channels and
   layers ranked on calibration batches and its weights reordered
   (:mod:`~frugalnas.compression.importance`);
2. **supernet** (``supernet/``, optional): the reordered parent trained so that its
   sub-networks of the budget's size work on their own
   (:mod:`~frugalnas.compression.supernet`);
3. **search** (``search.db``): a frugalnas study over the ``gpt-subnet`` space of the
   reordered parent (or the trained supernet), under the budget, with any strategy and
   estimator (by default one-shot: the inherited weights' validation loss);
4. **distillation** (``child/``): the best sub-network fine-tuned on a token budget, with the
   parent as the teacher (:mod:`~frugalnas.compression.distill`);
5. **export** (``model/``, ``model.onnx``, ``report.json``): the child in the parent's format
   (a Hugging Face folder, or a frugalnas checkpoint), ONNX, and the parent's and child's
   validation loss and sizes.
"""

from __future__ import annotations

import copy
import itertools
import json
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch

from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.compression.budget import UNITS, Budget, parse_budget
from frugalnas.compression.checkpoint import is_checkpoint, read_checkpoint, save_checkpoint
from frugalnas.compression.distill import DistillConfig, distill
from frugalnas.compression.estimator import PARAMS, latency_ms
from frugalnas.compression.importance import METHODS, measure, reorder
from frugalnas.compression.parent import Parent, load_parent
from frugalnas.compression.space import Shape, SubnetSpace, inference_mib, shrink
from frugalnas.compression.supernet import BandSampler, SupernetConfig, train_supernet
from frugalnas.datasets.text import TextSource
from frugalnas.engine.study import Study, create_study
from frugalnas.engine.training import seed_everything, split_metric
from frugalnas.export.formats import example_batch, write_onnx
from frugalnas.host.kinds import BACKENDS
from frugalnas.host.plugins import PluginHost
from frugalnas.latency.measure import LatencySetup
from frugalnas.nn.transformer import ElasticGPT
from frugalnas.ports.backend import Backend
from frugalnas.ports.errors import ConfigError, check_choice, check_range
from frugalnas.ports.work_progress import progress_shown

#: Which way a search's value is better.
DIRECTIONS = ("minimize", "maximize")
STAGES = ("importance", "supernet", "search", "distillation", "export")
#: How the chosen candidate's latency is confirmed under a latency budget.
CONFIRM_SETUP = LatencySetup(runtime="onnxruntime", warmup=10, repeats=50, rounds=3)


@dataclass(frozen=True)
class CompressConfig:
    """Everything a compression may be told besides the model, the text and the budget."""

    importance: str = "activation"
    calibration_batches: int = 8
    batch_size: int = 16
    context: int | None = None
    trials: int = 40
    strategy: str = "tpe"
    estimator: str = "inherited-loss"
    estimator_options: dict[str, Any] | None = None
    valid_examples: int = 64
    multi_objective: bool = False
    direction: str = "minimize"
    min_depth: int = 1
    steps: int = 8
    supernet: SupernetConfig = field(default_factory=SupernetConfig)
    distill: DistillConfig = field(default_factory=DistillConfig)
    backend: str = "single-device"
    seed: int = 0
    onnx: bool = True
    progress: bool | None = None
    tracking: bool = True
    tracking_uri: str | None = None

    def __post_init__(self) -> None:
        check_choice("importance", self.importance, METHODS)
        check_choice("direction", self.direction, DIRECTIONS)
        if self.estimator == "inherited-loss" and self.direction != "minimize":
            raise ConfigError("estimator 'inherited-loss' scores a loss: its direction is "
                              "'minimize'")
        for what in ("calibration_batches", "batch_size", "trials", "valid_examples",
                     "min_depth", "steps"):
            check_range(what, getattr(self, what), 1)
        if self.context is not None:
            check_range("context", self.context, 1)


@dataclass(frozen=True)
class CompressionResult:
    """What a compression made: the child's shape, where it was written, the parent's and the
    child's validation loss (nats per token), non-embedding parameters, ONNX Runtime latency
    (ms; batch 1, one block of tokens, one thread) and inference memory (MiB: float32 weights
    and the key/value cache of one block), the seconds of each stage."""

    out: Path
    model: Path
    shape: Shape
    parent_loss: float
    child_loss: float
    parent_params: int
    child_params: int
    seconds: dict[str, float]
    onnx: Path | None = None
    latency_ms: dict[str, float] = field(default_factory=dict)
    memory_mib: dict[str, float] = field(default_factory=dict)

    def summary(self) -> str:
        ratio = self.child_params / self.parent_params
        return (f"{self.shape}: {self.child_params:,} non-embedding parameters "
                f"({ratio:.1%} of the parent's {self.parent_params:,}); validation loss "
                f"{self.child_loss:.4f} nats/token (parent {self.parent_loss:.4f}); "
                f"written to {self.model}")


def compress(model: str | Path, data: str | Path, *, budget: str | Budget = "params=0.5",
             out: str | Path = "compressed", **options: Any) -> CompressionResult:
    """Compress the trained language model in ``model`` (a frugalnas checkpoint folder, or a
    Hugging Face ``save_pretrained`` folder of a GPT-2 or Llama-family model) on the UTF-8
    text of ``data`` (a file, a folder or a glob) to the ``budget`` (``"params=0.5"``: half
    the parent's non-embedding parameters), writing to ``out``. Every other keyword is a
    :class:`CompressConfig` field (``supernet`` and ``distill`` also take a mapping of
    :class:`SupernetConfig` and :class:`DistillConfig` fields). A run on the same ``out``
    resumes."""
    config = _config(options)
    budget = parse_budget(budget) if isinstance(budget, str) else budget
    run = _Run(Path(out).expanduser(), config,
               PluginHost(disable_plugins=() if config.tracking else ("mlflow",)))
    run.out.mkdir(parents=True, exist_ok=True)
    seed_everything(config.seed)
    parent, text = _ordered_parent(model, data, run)
    target = _target(parent, budget, text, run)
    weights = _supernet(parent, target, text, run)
    shape, study = _search(parent, weights, target, text, run)
    child = _child(parent, weights, shape, text, study.backend, run)
    result = _export(parent, child, shape, text, target, run)
    _review(study, result)
    return result


def _review(study: Study, result: CompressionResult) -> None:
    """The parent's and the child's figures on the search's study, for the plugins that
    follow it (MLflow logs them on the study's run)."""
    metrics = {"parent_valid_loss": result.parent_loss, "child_valid_loss": result.child_loss,
               "parent_non_embedding_params": float(result.parent_params),
               "child_non_embedding_params": float(result.child_params),
               **{f"{who}_latency_ms": ms for who, ms in result.latency_ms.items()},
               **{f"{who}_memory_mib": mib for who, mib in result.memory_mib.items()}}
    study.runner.start()
    try:
        study.log_metrics(metrics, step=0)
    finally:
        study.finish()


@dataclass
class _Run:
    """One compression's folder, options, plugin host (the supernet's backend and the
    search's study come from it), stage timings and progress lines."""

    out: Path
    config: CompressConfig
    host: PluginHost
    seconds: dict[str, float] = field(default_factory=lambda: dict.fromkeys(STAGES, 0.0))

    def say(self, text: str) -> None:
        """One line of progress on stderr, when progress is shown."""
        if progress_shown(self.config.progress):
            print(f"compress: {text}", file=sys.stderr, flush=True)


def _config(options: dict[str, Any]) -> CompressConfig:
    fields = CompressConfig.__dataclass_fields__
    unknown = sorted(set(options) - set(fields))
    if unknown:
        raise ConfigError(f"unknown compress option(s) {', '.join(unknown)}; valid: "
                          f"{', '.join(fields)}")
    for name, kind in (("supernet", SupernetConfig), ("distill", DistillConfig)):
        given = options.get(name)
        if isinstance(given, dict):
            known = kind.__dataclass_fields__
            bad = sorted(set(given) - set(known))
            if bad:
                raise ConfigError(f"unknown {name} option(s) {', '.join(bad)}; valid: "
                                  f"{', '.join(known)}")
            options = {**options, name: kind(**given)}
    return CompressConfig(**options)


# -- 1. importance ---------------------------------------------------------------------------
def _ordered_parent(model: str | Path, data: str | Path,
                    run: _Run) -> tuple[Parent, TextSource]:
    """The reordered parent (from ``ordered/`` when a run made it before) and the text as it
    reads it."""
    config, ordered = run.config, run.out / "ordered"
    if is_checkpoint(ordered):
        network, about = read_checkpoint(ordered)
        run.say(f"importance: reusing {ordered}")
        run.seconds["importance"] = float(about.get("seconds", 0.0))
        parent = Parent.from_about(network, about)
        return parent, TextSource.open(**parent.text)
    start = time.perf_counter()
    parent = load_parent(model, data, config.context, config.seed)
    text = TextSource.open(**parent.text)
    batches = list(itertools.islice(text.batches("train", config.batch_size, seed=config.seed),
                                    config.calibration_batches))
    run.say(f"importance: ranking {parent.describe()} on {len(batches)} batches "
            f"({config.importance})")
    importance = measure(parent.model, [x for x, _ in batches], config.importance,
                         [y for _, y in batches])
    reorder(parent.model, importance)
    run.seconds["importance"] = time.perf_counter() - start
    save_checkpoint(parent.model, ordered, parent.about(importance=config.importance,
                                                        seconds=run.seconds["importance"]))
    return parent, text


# -- 2. supernet -------------------------------------------------------------------------------
@dataclass(frozen=True)
class _Target:
    """What the search aims at: the budget, the parent's measure of it, the bound, and the
    non-embedding parameter counts the search starts from (the anchors' sizes)."""

    budget: Budget
    measured: float
    bound: float
    sizes: tuple[float, ...]

    def measure(self, space: SubnetSpace) -> Callable[[Shape], float]:
        """What ``sizes`` measure: inference memory under a memory budget, non-embedding
        parameters otherwise."""
        if self.budget.kind == "memory":
            return lambda shape: inference_mib(space.parent(), shape.subnet())
        return space.size

    def unit(self) -> str:
        return UNITS["memory" if self.budget.kind == "memory" else "params"]


def _target(parent: Parent, budget: Budget, text: TextSource, run: _Run) -> _Target:
    params = parent.model.non_embedding_params()
    if budget.kind == "latency":
        measured = _parent_latency(parent, text, run)
        bound = budget.bound(measured)
        # the same share of the parameters and half of it (latency does not shrink as fast
        # as the parameters)
        return _Target(budget, measured, bound,
                       (params * bound / measured, params * bound / measured / 2))
    measured = params if budget.kind == "params" else inference_mib(parent.model)
    bound = budget.bound(measured)
    return _Target(budget, measured, bound, (bound,))


@dataclass(frozen=True)
class _Weights:
    """The weights the search scores and the child starts from: the reordered parent's, or
    the trained supernet's, and the checkpoint folder holding them."""

    folder: Path
    model: ElasticGPT


def _supernet(parent: Parent, target: _Target, text: TextSource, run: _Run) -> _Weights:
    config, folder = run.config.supernet, run.out / "supernet"
    if config.tokens == 0:
        return _Weights(run.out / "ordered", parent.model)
    if is_checkpoint(folder):
        network, about = read_checkpoint(folder)
        if about.get("supernet") == asdict(config):
            run.say(f"supernet: reusing {folder}")
            run.seconds["supernet"] = float(about.get("seconds", 0.0))
            return _Weights(folder, network)
        shutil.rmtree(folder)
    # the search and the child were made on other weights
    (run.out / "search.db").unlink(missing_ok=True)
    shutil.rmtree(run.out / "child", ignore_errors=True)
    start = time.perf_counter()
    space = SubnetSpace(str(run.out / "ordered"), **_space_options(parent, run.config))
    sampler = BandSampler(space, min(target.sizes) / 2, max(target.sizes), run.config.seed,
                          target.measure(space), target.unit())
    backend = run.host.create(BACKENDS, run.config.backend)
    supernet = copy.deepcopy(parent.model)
    backend.prepare(supernet)   # moved in place: the sub-networks run on its modules
    teacher = parent.model.to(backend.device)
    steps = config.steps(int(text.input_shape[0]))
    run.say(f"supernet: {steps} steps ({config.tokens:,} tokens), {config.samples} "
            f"sub-network(s) per step of between {sampler.describe()}")

    def progress(done: int, loss: float) -> None:
        run.say(f"supernet: step {done}/{steps}, loss {loss:.4f}")

    train_supernet(supernet, teacher, sampler, text, backend, config, seed=run.config.seed,
                   every=(max(1, steps // 10), progress))
    supernet = supernet.to("cpu").eval()
    parent.model.to("cpu")
    run.seconds["supernet"] = time.perf_counter() - start
    save_checkpoint(supernet, folder, {**parent.about(), "supernet": asdict(config),
                                       "seconds": run.seconds["supernet"]})
    return _Weights(folder, supernet)


# -- 3. search ---------------------------------------------------------------------------------
def _search(parent: Parent, weights: _Weights, target: _Target, text: TextSource,
            run: _Run) -> tuple[Shape, Study]:
    config, budget, bound = run.config, target.budget, target.bound
    with _quiet_optuna():
        study = _study(parent, weights, target, run)
    if not study.trials:
        space = study.space
        assert isinstance(space, SubnetSpace)
        # the sizes' anchors taken in turn, so that a short search tries each size
        size_of = target.measure(space)
        anchors = [a for group in itertools.zip_longest(*(space.anchors(z, measure=size_of)
                                                          for z in target.sizes))
                   for a in group if a is not None]
        for arch in list(dict.fromkeys(anchors))[:config.trials]:
            study.optuna_study.enqueue_trial(dict(arch.decisions))
    done = len(study.completed_trials())
    started = [t for t in study.trials if t.frozen.state != optuna.trial.TrialState.WAITING]
    left = max(0, config.trials - len(started))
    under = budget.describe(target.measured)
    run.say(f"search: {left} trial(s) under {under}, {done} done before")
    if left:
        with _quiet_optuna():
            study.optimize(n_trials=left)
    run.seconds["search"] = sum(t.frozen.duration.total_seconds() for t in study.trials
                                if t.frozen.duration is not None)
    feasible = study.feasible_trials()
    if not feasible:
        raise ConfigError(f"no sub-network under {under} completed in {len(study.trials)} "
                          "trials; raise the budget or the number of trials")
    space = study.space
    assert isinstance(space, SubnetSpace)
    sign = 1.0 if config.direction == "minimize" else -1.0
    ranked = sorted(feasible, key=lambda t: (sign * t.values[0], t.number))
    best = ranked[0] if budget.kind == "params" else _confirmed(ranked, space, text, bound, run)
    assert best.architecture is not None
    shape = space.shape(best.architecture)
    scored = "nats/token inherited" if config.estimator == "inherited-loss" else \
        f"by {config.estimator}"
    run.say(f"search: best {shape} (trial {best.number}, {best.values[0]:.4g} {scored})")
    return shape, study


def _confirmed(ranked: list[Any], space: SubnetSpace, text: TextSource, bound: float,
               run: _Run) -> Any:
    """The best trial whose latency, measured again more carefully (three rounds of 50
    calls), still meets ``bound``: a search measures each candidate briefly, and a candidate
    close to the bound may have met it by chance."""
    for trial in ranked:
        network = space.build(trial.architecture, text.num_classes, text.input_shape)
        ms = latency_ms(network, int(text.input_shape[0]), space.config.vocab_size,
                        CONFIRM_SETUP)
        if ms <= bound:
            return trial
        run.say(f"search: trial {trial.number} takes {ms:.3g} ms when measured again, above "
                f"{bound:.3g} ms; the next best")
    raise ConfigError(f"no sub-network meets {bound:.3g} ms when measured again; raise the "
                      "budget or the number of trials")


def _parent_latency(parent: Parent, text: TextSource, run: _Run) -> float:
    """The parent's latency, measured once per output folder (a resumed search keeps the
    bound it started with)."""
    file = run.out / "parent_latency.json"
    if file.is_file():
        return float(json.loads(file.read_text())["latency_ms"])
    ms = _latency(parent.model, text)
    file.write_text(json.dumps({"latency_ms": ms}) + "\n", encoding="utf-8")
    return ms


def _latency(model: ElasticGPT, text: TextSource) -> float:
    """``model``'s latency, measured as the chosen candidate's is confirmed."""
    return latency_ms(model.export().eval(), int(text.input_shape[0]), model.config.vocab_size,
                      CONFIRM_SETUP)


def _space_options(parent: Parent, config: CompressConfig) -> dict[str, Any]:
    """The ``gpt-subnet`` space's options besides its parent."""
    return {"tied_width": parent.tied_width, "min_depth": config.min_depth,
            "steps": config.steps}


def _study(parent: Parent, weights: _Weights, target: _Target, run: _Run) -> Study:
    """The search's study in ``out/search.db`` (reopened when it exists)."""
    config, out, multi = run.config, run.out, run.config.multi_objective
    budget = target.budget
    estimator, estimator_options = _estimator(config, budget)
    return create_study(
        space="gpt-subnet", strategy=config.strategy, estimator=estimator,
        directions=[config.direction, "minimize"] if multi else config.direction,
        objectives=["value", PARAMS] if multi else ["value"],
        storage=f"sqlite:///{out / 'search.db'}", study_name="compress", load_if_exists=True,
        space_options={"parent": str(weights.folder), **_space_options(parent, config)},
        estimator_options=estimator_options, dataset="text",
        dataset_options=parent.text_options(), backend=config.backend,
        constraints={budget.metric: target.bound}, seed=config.seed, host=run.host,
        **_tracking(config, out))


def _tracking(config: CompressConfig, out: Path) -> dict[str, Any]:
    """MLflow tracking of the search (one run per trial) in ``out/mlflow.db`` unless another
    tracking URI is given, or none."""
    if not config.tracking:
        return {"disable_plugins": ["mlflow"]}
    uri = config.tracking_uri or f"sqlite:///{out / 'mlflow.db'}"
    return {"plugin_options": {"mlflow": {"tracking_uri": uri}}}


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """No log line per trial (the progress lines say what the search does)."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def _estimator(config: CompressConfig, budget: Budget) -> tuple[str, dict[str, Any]]:
    """The study's estimator and its options: ``inherited-loss``, or another estimator (its
    value better in ``config.direction``: a loss, or a proxy to maximise) combined with
    ``inherited-loss`` for the metrics the budget bounds (the other gives the value)."""
    own = {"valid_examples": config.valid_examples, "latency": budget.kind == "latency"}
    given = dict(config.estimator_options or {})
    if config.estimator == "inherited-loss":
        return "inherited-loss", {**own, **given}
    return "combined", {"members": {config.estimator: given, "inherited-loss": own}}


# -- 4. distillation -----------------------------------------------------------------------
def _child(parent: Parent, weights: _Weights, shape: Shape, text: TextSource,
           backend: Backend, run: _Run) -> ElasticGPT:
    config, folder = run.config, run.out / "child"
    if is_checkpoint(folder):
        child, about = read_checkpoint(folder)
        if about.get("shape") == asdict(shape):
            run.say(f"distillation: reusing {folder}")
            run.seconds["distillation"] = float(about.get("seconds", 0.0))
            return child
        shutil.rmtree(folder)   # the search found another shape since
    start = time.perf_counter()
    child = shrink(weights.model, shape)
    trained = backend.prepare(child)   # the same parameters, on the backend's device
    teacher = parent.model.to(backend.device)
    steps = config.distill.steps(int(text.input_shape[0]))
    run.say(f"distillation: {steps} steps ({config.distill.tokens:,} tokens, "
            f"loss {config.distill.loss})")

    def progress(done: int, loss: float) -> None:
        run.say(f"distillation: step {done}/{steps}, loss {loss:.4f}")

    distill(trained, teacher, text, backend, config.distill, seed=config.seed,
            every=(max(1, steps // 10), progress))
    child = child.to("cpu").eval()
    parent.model.to("cpu")
    run.seconds["distillation"] = time.perf_counter() - start
    save_checkpoint(child, folder, {**parent.about(), "shape": asdict(shape),
                                    "seconds": run.seconds["distillation"],
                                    "distill": asdict(config.distill)})
    return child


# -- 5. export -------------------------------------------------------------------------------
def _export(parent: Parent, child: ElasticGPT, shape: Shape, text: TextSource,
            target: _Target, run: _Run) -> CompressionResult:
    start, config, out, seconds = time.perf_counter(), run.config, run.out, run.seconds
    backend = SingleDeviceBackend()
    losses = {name: split_metric(net.eval(), backend, text, limit=config.valid_examples)
              for name, net in (("parent", parent.model), ("child", child))}
    model_dir, tokens = out / "model", text.head("valid", 4)[0]
    written_diff = parent.write(child, model_dir, tokens)
    run.say(f"export: {model_dir} (read back: logits within {written_diff:.2g})")
    onnx = _onnx(child, tokens, out) if config.onnx else None
    latency = {"parent": _parent_latency(parent, text, run), "child": _latency(child, text)}
    run.say(f"export: ONNX Runtime latency, batch 1, {text.input_shape[0]} tokens: parent "
            f"{latency['parent']:.3g} ms, child {latency['child']:.3g} ms")
    seconds["export"] = time.perf_counter() - start
    memory = {"parent": inference_mib(parent.model), "child": inference_mib(child)}
    result = CompressionResult(out, model_dir, shape, losses["parent"], losses["child"],
                               parent.model.non_embedding_params(),
                               child.non_embedding_params(), seconds, onnx, latency, memory)
    # the bound the search ran under; the child as measured now
    budget, bound = target.budget, target.bound
    child_value = {"params": float(result.child_params), "latency": latency["child"],
                   "memory": memory["child"]}[budget.kind]
    report = {**asdict(result), "out": str(out), "model": str(model_dir),
              "onnx": None if onnx is None else str(onnx), "parent": parent.describe(),
              "budget": str(budget), "bound": bound, "meets_budget": child_value <= bound,
              "written_max_abs_diff": written_diff, "config": asdict(config)}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n",
                                     encoding="utf-8")
    return result


def _onnx(model: ElasticGPT, batch: torch.Tensor, folder: Path) -> Path:
    """``folder/model.onnx`` of ``model``, checked against it on the tokens ``batch``."""
    dense = model.export().eval()
    with torch.no_grad():
        reference = dense(batch)
    written = write_onnx(dense, None, example_batch(batch), batch, reference, folder,
                         tokens=True, max_sequence=model.context)
    return written.path
