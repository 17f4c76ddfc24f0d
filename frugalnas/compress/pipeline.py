"""``frugalnas.compress``: a trained language model in, a smaller one out, in four stages that
each leave their result in the output folder, so that a run that stops resumes where it
stopped:

1. **importance** (``ordered/``): the parent's heads, MLP units, embedding channels and
   layers ranked on calibration batches and its weights reordered
   (:mod:`~frugalnas.compress.importance`);
2. **search** (``search.db``): a frugalnas study over the ``gpt-subnet`` space of the
   reordered parent, under the budget, with any strategy and estimator (by default one-shot:
   the inherited weights' validation loss);
3. **distillation** (``child/``): the best sub-network fine-tuned on a token budget
   (:mod:`~frugalnas.compress.distill`);
4. **export** (``model/``, ``model.onnx``, ``report.json``): the child in the parent's format
   (a Hugging Face folder, or a frugalnas checkpoint), ONNX, and the parent's and child's
   validation loss and sizes.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
import shutil
import time
import sys
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import optuna
import torch

from frugalnas.compress.budget import Budget, parse_budget
from frugalnas.compress.checkpoint import is_checkpoint, read_checkpoint, save_checkpoint
from frugalnas.compress.distill import DistillConfig, distill
from frugalnas.compress.estimator import PARAMS
from frugalnas.compress.importance import METHODS, measure, reorder
from frugalnas.compress.parent import Parent, load_parent
from frugalnas.compress.space import Shape, SubnetSpace, shrink
from frugalnas.datasets.text import TextSource
from frugalnas.engine.study import Study, create_study
from frugalnas.export.formats import example_batch, onnx_file_latency, write_onnx
from frugalnas.engine.training import seed_everything, split_metric
from frugalnas.nn.transformer import ElasticGPT
from frugalnas.ports.errors import ConfigError, check_choice, check_range
from frugalnas.ports.work_progress import progress_shown
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.host.kinds import BACKENDS
from frugalnas.host.plugins import PluginHost

STAGES = ("importance", "search", "distillation", "export")


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
    valid_examples: int = 64
    multi_objective: bool = False
    min_depth: int = 1
    steps: int = 8
    distill: DistillConfig = field(default_factory=DistillConfig)
    backend: str = "single-device"
    seed: int = 0
    onnx: bool = True
    progress: bool | None = None

    def __post_init__(self) -> None:
        check_choice("importance", self.importance, METHODS)
        for what in ("calibration_batches", "batch_size", "trials", "valid_examples",
                     "min_depth", "steps"):
            check_range(what, getattr(self, what), 1)
        if self.context is not None:
            check_range("context", self.context, 1)


@dataclass(frozen=True)
class CompressionResult:
    """What a compression made: the child's shape, where it was written, the parent's and the
    child's validation loss (nats per token) and non-embedding parameters, the seconds of
    each stage (0 for a stage a resumed run found done)."""

    out: Path
    model: Path
    shape: Shape
    parent_loss: float
    child_loss: float
    parent_params: int
    child_params: int
    seconds: dict[str, float]
    onnx: Path | None = None

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
    :class:`CompressConfig` field (``distill`` also takes a mapping of
    :class:`DistillConfig` fields). A run on the same ``out`` resumes."""
    config = _config(options)
    budget = parse_budget(budget) if isinstance(budget, str) else budget
    run = _Run(Path(out).expanduser(), config)
    run.out.mkdir(parents=True, exist_ok=True)
    seed_everything(config.seed)
    parent = _ordered_parent(model, data, run)
    text = TextSource.open(**parent.text)
    shape = _search(parent, budget, run)
    child = _child(parent, shape, text, run)
    return _export(parent, child, shape, text, run)


@dataclass
class _Run:
    """One compression's folder, options, stage timings and progress lines."""

    out: Path
    config: CompressConfig
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
    given = options.get("distill")
    if isinstance(given, dict):
        options = {**options, "distill": DistillConfig(**given)}
    return CompressConfig(**options)


# -- 1. importance ---------------------------------------------------------------------------
def _ordered_parent(model: str | Path, data: str | Path, run: _Run) -> Parent:
    config, ordered = run.config, run.out / "ordered"
    if is_checkpoint(ordered):
        network, about = read_checkpoint(ordered)
        run.say(f"importance: reusing {ordered}")
        run.seconds["importance"] = float(about.get("seconds", 0.0))
        return Parent.from_about(network, about)
    start = time.perf_counter()
    parent = load_parent(model, data, config.context, config.seed)
    text = TextSource.open(**parent.text)
    batches = list(text.batches("train", config.batch_size, seed=config.seed))
    batches = batches[:config.calibration_batches]
    run.say(f"importance: ranking {parent.describe()} on {len(batches)} batches "
        f"({config.importance})")
    importance = measure(parent.model, [x for x, _ in batches], config.importance,
                         [y for _, y in batches])
    reorder(parent.model, importance)
    run.seconds["importance"] = time.perf_counter() - start
    save_checkpoint(parent.model, ordered, parent.about(importance=config.importance,
                                                        seconds=run.seconds["importance"]))
    return parent


# -- 2. search ---------------------------------------------------------------------------------
def _search(parent: Parent, budget: Budget, run: _Run) -> Shape:
    config = run.config
    bound = budget.bound(parent.model.non_embedding_params())
    with _quiet_optuna():
        study = _study(parent, bound, run)
    done = len(study.completed_trials())
    if not study.trials:
        space = study.space
        assert isinstance(space, SubnetSpace)
        for arch in space.anchors(bound)[:config.trials]:
            study.optuna_study.enqueue_trial(dict(arch.decisions))
    started = [t for t in study.trials if t.frozen.state != optuna.trial.TrialState.WAITING]
    left = max(0, config.trials - len(started))
    run.say(f"search: {left} trial(s) under {budget} ({bound:,} non-embedding parameters), "
            f"{done} done before")
    if left:
        with _quiet_optuna():
            study.optimize(n_trials=left)
    run.seconds["search"] = sum(t.frozen.duration.total_seconds() for t in study.trials
                                if t.frozen.duration is not None)
    feasible = study.feasible_trials()
    if not feasible:
        raise ConfigError(f"no sub-network under {budget} ({bound:,} non-embedding parameters) "
                          f"completed in {len(study.trials)} trials; raise the budget or the "
                          "number of trials")
    best = min(feasible, key=lambda t: (t.values[0], t.number))
    space = study.space
    assert isinstance(space, SubnetSpace) and best.architecture is not None
    shape = space.shape(best.architecture)
    run.say(f"search: best {shape} (trial {best.number}, {best.values[0]:.4f} nats/token "
            "inherited)")
    return shape


def _study(parent: Parent, bound: int, run: _Run) -> Study:
    """The search's study in ``out/search.db`` (reopened when it exists)."""
    config, out, multi = run.config, run.out, run.config.multi_objective
    return create_study(
        space="gpt-subnet", strategy=config.strategy, estimator=config.estimator,
        directions=["minimize", "minimize"] if multi else "minimize",
        objectives=["value", PARAMS] if multi else ["value"],
        storage=f"sqlite:///{out / 'search.db'}", study_name="compress", load_if_exists=True,
        space_options={"parent": str(out / "ordered"), "tied_width": parent.tied_width,
                       "min_depth": config.min_depth, "steps": config.steps},
        estimator_options=_estimator_options(config), dataset="text",
        dataset_options=parent.text_options(), backend=config.backend,
        constraints={PARAMS: float(bound)}, seed=config.seed)


@contextmanager
def _quiet_optuna() -> Iterator[None]:
    """No log line per trial (the progress lines say what the search does)."""
    verbosity = optuna.logging.get_verbosity()
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    try:
        yield
    finally:
        optuna.logging.set_verbosity(verbosity)


def _estimator_options(config: CompressConfig) -> dict[str, Any]:
    if config.estimator == "inherited-loss":
        return {"valid_examples": config.valid_examples}
    return {}


# -- 3. distillation -----------------------------------------------------------------------
def _child(parent: Parent, shape: Shape, text: TextSource, run: _Run) -> ElasticGPT:
    config, folder = run.config, run.out / "child"
    if is_checkpoint(folder):
        child, about = read_checkpoint(folder)
        if about.get("shape") == asdict(shape):
            run.say(f"distillation: reusing {folder}")
            run.seconds["distillation"] = float(about.get("seconds", 0.0))
            return child
        shutil.rmtree(folder)   # the search found another shape since
    start = time.perf_counter()
    backend = PluginHost().create(BACKENDS, config.backend)
    child = shrink(parent.model, shape)
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


# -- 4. export -------------------------------------------------------------------------------
def _export(parent: Parent, child: ElasticGPT, shape: Shape, text: TextSource,
            run: _Run) -> CompressionResult:
    start, config, out, seconds = time.perf_counter(), run.config, run.out, run.seconds
    backend = SingleDeviceBackend()
    losses = {name: split_metric(net.eval(), backend, text, limit=config.valid_examples)
              for name, net in (("parent", parent.model), ("child", child))}
    model_dir = out / "model"
    written_diff = parent.write(child, model_dir, text.head("valid", 4)[0])
    run.say(f"export: {model_dir} (read back: logits within {written_diff:.2g})")
    latency: dict[str, Any] = {}
    onnx = None
    if config.onnx:
        for name, net in (("parent", parent.model), ("child", child)):
            folder = out if name == "child" else out / "parent_onnx"
            file, latency[name] = _onnx(net, text, folder)
            onnx = file if name == "child" else onnx
        run.say(f"export: {onnx}; ONNX Runtime latency, batch 1, {text.input_shape[0]} tokens:"
                f" parent {latency['parent']['median_ms']:.3g} ms, child "
                f"{latency['child']['median_ms']:.3g} ms")
    seconds["export"] = time.perf_counter() - start
    result = CompressionResult(out, model_dir, shape, losses["parent"], losses["child"],
                               parent.model.non_embedding_params(),
                               child.non_embedding_params(), seconds, onnx)
    report = {**asdict(result), "out": str(out), "model": str(model_dir),
              "onnx": None if onnx is None else str(onnx), "parent": parent.describe(),
              "latency_ms": latency, "written_max_abs_diff": written_diff,
              "config": asdict(config)}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n",
                                     encoding="utf-8")
    return result


def _onnx(model: ElasticGPT, text: TextSource, folder: Path) -> tuple[Path, dict[str, Any]]:
    """``folder/model.onnx`` of ``model`` (checked against it) and its ONNX Runtime latency
    on one block of validation tokens (one thread)."""
    folder.mkdir(parents=True, exist_ok=True)
    dense = model.export().eval()
    batch = text.head("valid", 4)[0]
    with torch.no_grad():
        reference = dense(batch)
    written = write_onnx(dense, None, example_batch(batch), batch, reference, folder,
                         tokens=True, max_sequence=model.context)
    latency = onnx_file_latency(written.path, tuple(text.input_shape), threads=1,
                                example=batch[0])
    return written.path, latency
