"""``export_study``: from a study's trial to a deployable network.

The architecture of the chosen trial is trained from scratch on the training + validation
examples of the study's dataset, with the study's backend (single-device, virtual-node,
out-of-core, or any plugin's), seed and training hyperparameters; its test metric (the
dataset task's: accuracy for image classes, the loss in nats per token for a language model)
is measured once, on the test split that the search never saw. The network is written as a
state dict, a TorchScript file, a ``torch.export`` program and an ONNX file (and, for a
language model on request, a Hugging Face GPT-2 folder; each loaded back and checked against
the module), with ``report.json``; with the study's MLflow tracking on, it is logged as an
MLflow model linked to the trial's run (and registered on request).
"""

from __future__ import annotations

import json
import math
import os
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
from torch import nn

from frugalnas.ports.architecture import Architecture
from frugalnas.ports.backend import StepLoss
from frugalnas.ports.cost import count_flops, count_params
from frugalnas.ports.data import Dataset
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.exported import ExportedNetwork
from frugalnas.leaderboard import fmt_number
from frugalnas.ports.latency import measure_latency
from frugalnas.ports.trial_architecture import architecture_of
from frugalnas.engine.training import TrainConfig, seed_everything, train
from frugalnas.ports.work_progress import progress_shown
from frugalnas.export import formats as fmt
from frugalnas.export.formats import ExportError
from frugalnas.export.huggingface import check_huggingface, write_huggingface
from frugalnas.export.options import DEFAULT_FORMATS
from frugalnas.export.report import export_report, file_record, is_image_classification
from frugalnas.export.select import select_trials

#: Epochs of the final training when neither ``epochs`` nor a train option says otherwise.
DEFAULT_EPOCHS = 10.0
#: Training hyperparameters taken from the study's estimator options when it has them.
INHERITED = ("batch_size", "lr", "momentum", "weight_decay", "optimizer")
TRAIN_OPTIONS = tuple(f.name for f in fields(TrainConfig))
#: Threads for the latency measurements (batch of 1, CPU).
LATENCY_THREADS = 1


@dataclass
class ExportedModel:
    """One exported trial: the trained module (CPU, eval mode), its folder, files and report."""

    trial: int
    rank: int
    architecture: Architecture
    out: Path
    model: nn.Module
    report: dict[str, Any]
    files: dict[str, Path] = field(default_factory=dict)

    @property
    def test_metric(self) -> str:
        """The name of the test metric in the report: ``test_accuracy`` (%) for image
        classes, ``test_loss`` (nats per token) for a language model."""
        return str(self.report.get("test_metric", "test_accuracy"))

    @property
    def test_value(self) -> float:
        """The test metric's value (:attr:`test_metric`)."""
        return float(self.report[self.test_metric])

    @property
    def test_accuracy(self) -> float:
        if "test_accuracy" not in self.report:
            raise ConfigError(f"trial {self.trial} was exported for "
                              f"{self.report.get('task')} data: its test metric is "
                              f"{self.test_metric} (ExportedModel.test_value), not an accuracy")
        return float(self.report["test_accuracy"])

    @property
    def model_uri(self) -> str | None:
        """The MLflow model URI (``models:/m-...``), when the model was logged."""
        return (self.report.get("mlflow") or {}).get("model_uri")


class _Progress:
    """A backend seen through a progress bar: every ``train_step`` advances it."""

    def __init__(self, inner: Any, bar: Any):
        self._inner, self._bar = inner, bar

    def train_step(self, *args: Any, **kwargs: Any) -> StepLoss:
        loss = self._inner.train_step(*args, **kwargs)
        self._bar.update(1)
        if self._bar.n % 10 == 0 or self._bar.n == self._bar.total:  # (reading waits)
            self._bar.set_postfix_str(f"loss={float(loss):.3g}", refresh=False)
        return loss

    def __getattr__(self, name: str) -> Any:
        return getattr(self._inner, name)


def planned_steps(n_train: int, cfg: TrainConfig) -> int:
    """The steps :func:`frugalnas.engine.training.train` runs for ``n_train`` examples."""
    total = max(1, math.ceil(cfg.epochs * math.ceil(n_train / cfg.batch_size)))
    return min(total, cfg.max_steps) if cfg.max_steps is not None else total


def train_config(study: Any, epochs: float | None, options: Mapping[str, Any] | None) -> TrainConfig:
    """The final training's settings: the study estimator's ``batch_size``, ``lr``,
    ``momentum``, ``weight_decay`` and ``optimizer`` where it has them, ``epochs`` (default
    :data:`DEFAULT_EPOCHS`), then ``options`` (any :class:`TrainConfig` field)."""
    options = dict(options or {})
    unknown = sorted(set(options) - set(TRAIN_OPTIONS))
    if unknown:
        raise ConfigError(f"unknown training option {unknown[0]!r} for export; valid: "
                          f"{', '.join(TRAIN_OPTIONS)}")
    if epochs is not None and "epochs" in options:
        raise ConfigError("give the epochs once: epochs= or train_options['epochs']")
    settings = {k: v for k, v in study.config.estimator_options.items() if k in INHERITED}
    settings["epochs"] = DEFAULT_EPOCHS if epochs is None else epochs
    settings.update(options)
    return TrainConfig(**settings)


def _load_dataset(study: Any, dataset: str | None, dataset_options: Mapping[str, Any] | None,
                  seed: int) -> tuple[Dataset, str, dict[str, Any]]:
    if dataset is None and dataset_options is None:
        if study.config.dataset is None:
            raise ConfigError(
                f"study {study.name!r} has no dataset (estimator {study.config.estimator!r} "
                "needs none); give the dataset to train the exported network on: dataset= "
                f"(registered: {', '.join(study.host.registry('datasets').names())})")
        return study.load_dataset(), study.config.dataset, dict(study.config.dataset_options)
    name = dataset or study.config.dataset
    if name is None:
        raise ConfigError("dataset_options without a dataset; give dataset= as well")
    options = dict(study.config.dataset_options if dataset is None else {})
    options.update(dataset_options or {})
    return study.host.create("datasets", name, seed=seed, **options), name, options


def export_study(study: Any, out: str | os.PathLike[str], *, trial: int | None = None,
                 top: int | None = None, pareto: int | None = None,
                 constraint: str | None = None, epochs: float | None = None,
                 train_options: Mapping[str, Any] | None = None,
                 backend_options: Mapping[str, Any] | None = None,
                 formats: Sequence[str] = DEFAULT_FORMATS, seed: int | None = None,
                 dataset: str | None = None, dataset_options: Mapping[str, Any] | None = None,
                 register: str | None = None, tracking: bool | None = None,
                 tracking_uri: str | None = None, latency: bool = True,
                 check_batch: int = 64, progress: bool | None = None,
                 ) -> ExportedModel | list[ExportedModel]:
    """Train the chosen trial(s) of ``study`` from scratch and write deployable files to ``out``.

    Which trial: the best (default, one objective); ``trial=N``; the ``top=K`` best (each into
    ``out/rank<R>-trial<N>/``, with ``out/index.json``); with two objectives ``pareto=I`` (the
    I-th Pareto trial, best first by the first objective) or ``constraint="params<=50000"``
    (the best trial by the other objective among those meeting it; any objective, estimator
    metric or ``cost_*`` field can be constrained).

    Training: ``epochs`` (default 10) on the dataset's training + validation examples with the
    study's backend (``backend_options`` override its options, e.g. ``{"nproc": 2}``), the
    study's seed (or ``seed``), and the batch size, learning rate, momentum, weight decay and
    optimizer of the study's estimator options where it has them; ``train_options`` set any
    of them (and ``max_steps``). The test split is read once, for the task's test metric
    (``test_accuracy`` in % for image classes, ``test_loss`` in nats per token for a language
    model).

    Files in the folder: ``state_dict.pt``, the ``formats`` (``model.torchscript.pt``,
    ``model.pt2``, ``model.onnx``; ``huggingface/``, a GPT-2 folder of a language model, on
    request; each checked against the module on ``check_batch`` test examples) and
    ``report.json``. With the study's MLflow tracking on (``tracking=None``: when
    its ``mlflow`` plugin is loaded; ``tracking_uri`` overrides its URI) the model is logged
    as an MLflow model linked to the trial's run, and ``register=NAME`` registers it.

    Returns the :class:`ExportedModel` (a list of them with ``top`` > 1)."""
    chosen_formats = fmt.check_formats(formats)
    tracking = _tracking(study, tracking, register)
    picks = select_trials(study, trial=trial, top=top, pareto=pareto, constraint=constraint)
    selection = ("trial" if trial is not None else f"top {top}" if top is not None
                 else f"pareto {pareto}" if pareto is not None
                 else f"constraint {constraint}" if constraint is not None else "best")
    seed = study.config.seed if seed is None else int(seed)
    cfg = train_config(study, epochs, train_options)
    # the study's split (its seed), so the test examples are the ones search never saw
    data, data_name, data_options = _load_dataset(study, dataset, dataset_options,
                                                  study.config.seed)
    if not data.has_test:
        raise ConfigError(f"dataset {data_name!r} of study {study.name!r} has no test split to "
                          "measure the exported network on; recreate it with a test split "
                          "(dataset_options test_fraction > 0; cifar: the test_batch file)")
    _check_networks(study, picks, data, data_name, chosen_formats)
    own_backend = bool(backend_options)
    backend = study.host.create("backends", study.config.backend,
                                **{**study.config.backend_options, **(backend_options or {})}) \
        if own_backend else study.backend
    plan = _Plan(data=data, data_name=data_name, data_options=data_options, backend=backend,
                 backend_options={**study.config.backend_options, **(backend_options or {})},
                 cfg=cfg, seed=seed, formats=chosen_formats, selection=selection,
                 tracking=tracking, tracking_uri=tracking_uri, register=register,
                 latency=latency, check_batch=check_batch, progress=progress_shown(progress))
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    several = top is not None and top > 1
    results = []
    try:
        for rank, frozen in enumerate(picks, start=1):
            folder = out / f"rank{rank}-trial{frozen.number}" if several else out
            folder.mkdir(parents=True, exist_ok=True)
            results.append(_export_one(study, frozen, rank, folder, plan))
    finally:
        backend.release()
        if own_backend:
            backend.close()
    if several:
        index = [{"rank": r.rank, "trial": r.trial, "folder": r.out.name,
                  "architecture": str(r.architecture), r.test_metric: r.test_value,
                  "model_uri": r.model_uri} for r in results]
        (out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
        return results
    return results[0]


def _check_networks(study: Any, picks: Sequence[Any], data: Dataset, data_name: str,
                    formats: tuple[str, ...]) -> None:
    """Before any training: a one-line ConfigError for a format the chosen trials' networks
    or the data cannot take (``huggingface``: ``transformers`` installed, language-modelling
    data, a network GPT-2 can hold)."""
    if "huggingface" in formats:
        check_huggingface(study, picks, data, data_name)


def _tracking(study: Any, tracking: bool | None, register: str | None) -> bool:
    """Whether the export logs its models (``None``: when a plugin of the study does); a
    ConfigError for tracking or a registered name that the study's plugins cannot serve."""
    if tracking is None:
        tracking = logs_models(study)
    elif tracking and not logs_models(study):
        raise ConfigError(f"tracking=True, but study {study.name!r} runs without the mlflow "
                          "plugin (blocked with -p no:mlflow / --no-tracking) or another "
                          "plugin that logs models (frugalnas_model_exported)")
    if register is not None:
        if not isinstance(register, str) or not register.strip():
            raise ConfigError(f"invalid registered model name {register!r}")
        if not tracking:
            raise ConfigError(f"register={register!r} needs MLflow tracking; study "
                              f"{study.name!r} runs without the mlflow plugin")
    return tracking


@dataclass(frozen=True)
class _Plan:
    """What every exported trial of one ``export_study`` call shares."""

    data: Dataset
    data_name: str
    data_options: dict[str, Any]
    backend: Any
    backend_options: dict[str, Any]
    cfg: TrainConfig
    seed: int
    formats: tuple[str, ...]
    selection: str
    tracking: bool
    tracking_uri: str | None
    register: str | None
    latency: bool
    check_batch: int
    progress: bool


@dataclass
class _Trained:
    """A network trained from scratch for export, on the CPU in evaluation mode."""

    model: nn.Module
    state: dict[str, torch.Tensor]
    params: int
    flops: int
    steps: int
    epochs: float
    losses: list[float]
    loop_seconds: float
    seconds: float
    peak_memory: Any
    backend_metrics: dict[str, float]
    backend_artifacts: dict[str, Any]


@dataclass
class _Written:
    """The deployable files of one network and how each was checked."""

    files: dict[str, Path] = field(default_factory=dict)
    checks: dict[str, Any] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    example: Any = None
    onnx_score: float | None = None


def _export_one(study: Any, frozen: Any, rank: int, out: Path, plan: _Plan) -> ExportedModel:
    started = time.perf_counter()
    arch = architecture_of(frozen, study.space)
    trained = _train(study, frozen.number, arch, plan)
    score, test_examples, test_items = _test_score(trained.model, plan.data)
    written = _write_files(trained, frozen.number, out, plan,
                           {"study": study.name, "trial": frozen.number, "architecture": str(arch)})
    latency = _latency(trained.model, plan, written) if plan.latency else None
    report = export_report(study, frozen, rank, arch, plan, trained, written, latency,
                           score, test_examples, test_items)
    if plan.tracking:
        _log_model(study, frozen.number, arch, out, plan, trained, written, report)
    report["seconds"]["total"] = time.perf_counter() - started
    files = written.files
    report["files"] = {k: file_record(p, out) for k, p in files.items()}
    (out / "report.json").write_text(json.dumps(report, indent=2, default=str) + "\n")
    files["report"] = out / "report.json"
    return ExportedModel(frozen.number, rank, arch, out, trained.model, report, files)


def _train(study: Any, number: int, arch: Architecture, plan: _Plan) -> _Trained:
    """Train ``arch`` from scratch on train + validation; the module returned is a fresh
    network holding the trained weights, on the CPU."""
    from tqdm.auto import tqdm

    started = time.perf_counter()
    data, cfg, backend = plan.data, plan.cfg, plan.backend
    final_data = data.train_and_valid()
    seed_everything(plan.seed)
    model = study.space.build(arch, data.num_classes, data.input_shape)
    params = count_params(model)
    flops = count_flops(model, data.head("train", 1)[0])
    model = backend.prepare(model)
    backend.reset_peak_memory()
    steps = planned_steps(final_data.num_examples("train"), cfg)
    if plan.progress:
        print(f"export trial {number}: training {arch} ({fmt_number(params)} params) from "
              f"scratch on {plan.data_name} train+valid ({final_data.num_examples('train')} "
              f"examples, {cfg.epochs:g} epoch(s), {steps} steps, backend "
              f"{study.config.backend!r}); the search scored it with estimator "
              f"{study.config.estimator!r}", file=sys.stderr, flush=True)
    with tqdm(total=steps, desc=f"export trial {number}", unit="step", file=sys.stderr,
              dynamic_ncols=True, disable=not plan.progress) as bar:
        report = train(model, final_data, _Progress(backend, bar), cfg, seed=plan.seed)
    peak = backend.peak_memory()
    backend_metrics, backend_artifacts = backend.trial_outputs()
    state = {k: v.detach().cpu().clone() for k, v in model.state_dict().items()}
    with torch.random.fork_rng(devices=[]):
        clean = study.space.build(arch, data.num_classes, data.input_shape)
    clean.load_state_dict(state)
    return _Trained(clean.cpu().eval(), state, params, flops, report.steps, report.epochs,
                    list(report.losses), report.seconds, time.perf_counter() - started, peak,
                    dict(backend_metrics), dict(backend_artifacts))


def _accuracy(model: nn.Module, x: torch.Tensor, y: torch.Tensor) -> float:
    """Top-1 accuracy (%) of ``model`` on ``x``, in batches of 512."""
    with torch.no_grad():
        logits = torch.cat([model(x[i:i + 512]) for i in range(0, len(x), 512)])
    return float((logits.argmax(1) == y).float().mean() * 100.0)


def _test_score(predict: Any, data: Any) -> tuple[float, int, int]:
    """The task's metric of ``predict`` (a module, or a function of a batch) on the test
    split, the number of test examples and of the items the metric averages (examples for
    image classes, tokens for a language model). Image classes: the whole split at once (in
    batches of 512), as the accuracy has always been computed; any other task: its sums over
    the split's evaluation batches (bounded memory)."""
    if is_image_classification(data):
        x, y = data.split("test")
        if isinstance(predict, nn.Module):
            return _accuracy(predict, x, y), len(x), len(x)
        logits = predict(x)
        return float((logits.argmax(1) == y).float().mean() * 100.0), len(x), len(x)
    total, count, examples = 0.0, 0, 0
    with torch.no_grad():
        for x, y in data.eval_batches("test"):
            batch_total, batch_count = data.task.totals(predict(x), y)
            total, count, examples = total + batch_total, count + batch_count, examples + len(x)
    if count == 0:
        raise ConfigError(f"dataset {data.name!r} has no test examples to score")
    return float(data.task.combine(total, count)), examples, count


def _write_files(trained: _Trained, number: int, out: Path, plan: _Plan,
                 about: dict[str, Any]) -> _Written:
    """The state dict, the backend's artifacts and each deployable format, checked against
    the module on a batch of test examples (``check_batch`` of them: images, or blocks of
    tokens for a language model)."""
    written = _Written()
    torch.save(trained.state, out / "state_dict.pt")
    written.files["state_dict"] = out / "state_dict.pt"
    for name, content in trained.backend_artifacts.items():
        path = out / f"backend_{Path(name).name}"
        path.write_bytes(content.encode() if isinstance(content, str) else content)
        written.files[f"backend:{name}"] = path
    model, data = trained.model, plan.data
    tokens = not is_image_classification(data) and not data.head("test", 1)[0].is_floating_point()
    # the exported programs take sequences up to the data's context (the model's positions
    # cover at least that much: the space checked it when it built the network)
    max_sequence = int(data.input_shape[0]) if tokens else None
    written.example = fmt.example_batch(data.head("test", 2)[0])
    batch = data.head("test", max(1, int(plan.check_batch)))[0].contiguous()
    with torch.no_grad():
        reference = model(batch)
    program, program_seconds = _program(model, written.example, plan.formats, number, tokens,
                                        max_sequence)
    for name in plan.formats:
        if name == "torchscript":
            res = fmt.write_torchscript(model, written.example, batch, reference, out)
        elif name == "export":
            res = fmt.write_export(program, batch, reference, out, program_seconds)
        elif name == "onnx":
            res = fmt.write_onnx(model, program, written.example, batch, reference, out,
                                 tokens, max_sequence)
            session = fmt.onnx_session(res.path)
            written.onnx_score = _test_score(lambda x: fmt.onnx_predict(session, x), data)[0]
        elif name == "huggingface":
            res = write_huggingface(model, data, batch, reference, out, about)
        else:  # pragma: no cover - check_formats admits only the formats above
            raise ConfigError(f"unknown export format {name!r}")
        written.files[name] = res.path
        written.checks[name] = {"file": res.path.name, "max_abs_diff": res.max_abs_diff,
                                "batch": len(batch), **res.details}
        written.seconds[name] = res.seconds
    return written


def _program(model: nn.Module, example: Any, formats: tuple[str, ...], number: int,
             tokens: bool = False, max_sequence: int | None = None) -> tuple[Any, float]:
    """The ``torch.export`` program the ``export`` and ``onnx`` formats start from (``None``
    when only ONNX is asked for and capture fails: ONNX then exports on its own)."""
    if "export" not in formats and "onnx" not in formats:
        return None, 0.0
    t0 = time.perf_counter()
    try:
        program = fmt.export_program(model, example, tokens, max_sequence)
    except Exception as exc:
        if "export" in formats:
            raise ExportError(f"torch.export could not capture the network of trial "
                              f"{number}: {type(exc).__name__}: {exc}") from exc
        program = None
    return program, time.perf_counter() - t0


def _latency(model: nn.Module, plan: _Plan, written: _Written) -> dict[str, Any]:
    """Batch-1 latency on this machine with torch, and with ONNX Runtime for an ONNX file
    (random images, or for any other task copies of a test example: a language model reads
    one block of ``context`` test tokens). One thread: batch-1 latency of a small network is
    per-call overhead, and on a busy machine several threads mostly measure the wait for
    each other."""
    example = None if is_image_classification(plan.data) else written.example[0]
    stats = measure_latency(model, plan.data.input_shape, 1, "cpu", min_run_time=0.2,
                            num_threads=LATENCY_THREADS, example=example)
    found: dict[str, Any] = {"torch": stats.to_dict()}
    if "onnx" in written.files:
        found["onnxruntime"] = fmt.onnx_file_latency(
            written.files["onnx"], tuple(plan.data.input_shape), threads=LATENCY_THREADS,
            example=example)
    return found


def _log_model(study: Any, number: int, arch: Architecture, out: Path, plan: _Plan,
               trained: _Trained, written: _Written, report: dict[str, Any]) -> None:
    """Hand the network to the plugins that log models, with the draft report and the ONNX
    file; their records go into ``report``."""
    pre = out / "report.json"
    pre.write_text(json.dumps(report, indent=2, default=str) + "\n")
    extra = [pre] + ([written.files["onnx"]] if "onnx" in written.files else [])
    metrics = {report["test_metric"]: report[report["test_metric"]],
               "export_params": float(trained.params), "export_flops": float(trained.flops)}
    if report["latency"]:
        metrics["export_latency_ms"] = report["latency"]["torch"]["median_ms"]
    t0 = time.perf_counter()
    exported = ExportedNetwork(
        trial=number, architecture=str(arch), model=trained.model, example=written.example,
        metrics=metrics, params={"study": study.name, "trial": number,
                                 "space": study.space.name, "epochs": plan.cfg.epochs,
                                 "dataset": plan.data_name},
        files=tuple(extra), register=plan.register, tracking_uri=plan.tracking_uri)
    report.update(model_exported(study, exported))
    report["seconds"]["mlflow"] = time.perf_counter() - t0


def logs_models(study: Any) -> bool:
    """Whether a plugin of the study logs exported models (``frugalnas_model_exported``:
    the ``mlflow`` plugin, unless it is blocked)."""
    return study.host.implements("frugalnas_model_exported")


def model_exported(study: Any, exported: ExportedNetwork) -> dict[str, Any]:
    """Hand ``exported`` to every plugin that logs models; their records by plugin name
    (``{"mlflow": {"model_uri": ...}}``), for ``report.json``. A plugin that fails fails the
    export."""
    return study.host.answers("frugalnas_model_exported", study=study, exported=exported)


def trial_links(study: Any, base_url: str) -> dict[int, str] | None:
    """Trial number -> URL of its record in a tracking plugin's UI at ``base_url``
    (``frugalnas_trial_links``); ``None`` when no plugin of the study links trials."""
    if not study.host.implements("frugalnas_trial_links"):
        return None
    links: dict[int, str] = {}
    for answer in study.host.answers("frugalnas_trial_links", study=study,
                                     base_url=base_url).values():
        links.update(answer)
    return links
