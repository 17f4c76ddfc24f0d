"""``export`` of language models: a ``gpt`` study on ``text`` data written as TorchScript,
``torch.export``, ONNX (int64 tokens, dynamic batch and sequence axes) and a Hugging Face
GPT-2 folder, each agreeing with the trained module; the report's test metric is the task's
(the loss in nats per token); the GPT-2 folder loads where frugalnas is not installed; what
GPT-2 cannot hold, and the format for image data, are refused in one line before training."""

from __future__ import annotations

import importlib.util
import json
import math
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.nn.functional as F

import frugalnas
from frugalnas import ConfigError
from frugalnas.testing.setups import SMALL_GPT
from ops_support.text_corpus import pseudo_verse

pytest.importorskip("transformers")

OFF = ("mlflow", "progress")
FAST = {"epochs": 1, "max_steps": 4, "batch_size": 16}
FORMATS = ("torchscript", "export", "onnx", "huggingface")
#: GPT-2 can hold the first (every layer alike, 2 heads x 8 = width 16); not the others
ARCHS = ("gpt:w16/h2r2,h2r2", "gpt:w16/h2r2,h1r2", "gpt:w32/h2r4")


def gpt_study(corpus: Path, storage: str | None = None, **dataset_options):
    """A gpt study whose three completed trials are :data:`ARCHS`, in that order (scored by a
    cheap proxy: the export trains each network from scratch anyway)."""
    study = frugalnas.create_study(
        space="gpt", space_options=SMALL_GPT, estimator="decoder_params",
        estimator_options={"batch_size": 4}, dataset="text",
        dataset_options={"path": str(corpus), "context": 16, **dataset_options},
        direction="minimize", seed=0, storage=storage, study_name="tiny-gpt",
        disable_plugins=OFF)
    for text in ARCHS:
        study.optuna_study.enqueue_trial(dict(study.space.parse(text).decisions))
    study.optimize(n_trials=len(ARCHS))
    assert [str(t.architecture) for t in study.completed_trials()] == list(ARCHS)
    return study


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    return pseudo_verse(tmp_path_factory.mktemp("gpt-export") / "corpus")


@pytest.fixture(scope="module")
def study(corpus):
    return gpt_study(corpus)


@pytest.fixture(scope="module")
def exported(study, tmp_path_factory):
    out = tmp_path_factory.mktemp("gpt-export-out") / "best"
    return frugalnas.export_study(study, out, trial=0, train_options=FAST, formats=FORMATS,
                                  progress=False)


def module_of(study, exported, data):
    """The network rebuilt from ``state_dict.pt``."""
    model = study.space.build(exported.architecture, data.num_classes, data.input_shape)
    model.load_state_dict(torch.load(exported.out / "state_dict.pt", weights_only=True))
    return model.eval()


def token_cases(data):
    """Test tokens of several batch sizes and lengths (up to the 16 positions)."""
    x = data.head("test", 8)[0]
    return {"3x16": x[:3], "1x16": x[:1], "5x7": x[:5, :7].contiguous(), "2x1": x[:2, :1]}


# -- the files ---------------------------------------------------------------------------------
def test_a_gpt_study_exports_to_every_format_and_each_file_agrees(study, exported):
    import onnx
    import onnxruntime as ort
    from transformers import AutoModelForCausalLM

    out, report = exported.out, exported.report
    data = study.load_dataset()
    for name in ("state_dict.pt", "model.torchscript.pt", "model.pt2", "model.onnx",
                 "report.json", "huggingface/config.json", "huggingface/model.safetensors",
                 "huggingface/README.md"):
        assert (out / name).is_file(), name
    assert json.loads((out / "report.json").read_text())["test_loss"] == report["test_loss"]

    # the test metric is the task's: the mean cross-entropy in nats per test token
    model = module_of(study, exported, data)
    x, y = data.split("test")
    with torch.no_grad():
        loss = float(F.cross_entropy(model(x).flatten(0, 1), y.flatten()))
    assert report["task"] == "language-modelling" and report["test_metric"] == "test_loss"
    assert "test_accuracy" not in report and "onnx_test_accuracy" not in report
    assert report["test_loss"] == pytest.approx(loss, rel=1e-5)
    assert report["onnx_test_loss"] == pytest.approx(loss, rel=1e-5)
    assert report["test_perplexity"] == pytest.approx(math.exp(loss), rel=1e-4)
    assert report["test_examples"] == len(x) and report["test_tokens"] == x.numel()
    assert exported.test_metric == "test_loss" and exported.test_value == report["test_loss"]
    with pytest.raises(ConfigError, match="its test metric is test_loss"):
        exported.test_accuracy
    assert report["dataset"]["preprocessing"]["tokenizer"] == "bytes"
    assert report["latency"]["torch"]["median_ms"] > 0
    assert report["latency"]["onnxruntime"]["median_ms"] > 0
    for name in FORMATS:
        assert report["checks"][name]["max_abs_diff"] <= 1e-4, name
    assert set(report["files"]["huggingface"]["files"]) >= {"config.json", "model.safetensors"}

    # every file gives the module's logits, for any batch size and sequence length
    scripted = torch.jit.load(str(out / "model.torchscript.pt"))
    program = torch.export.load(str(out / "model.pt2")).module()
    session = ort.InferenceSession(str(out / "model.onnx"), providers=["CPUExecutionProvider"])
    hf = AutoModelForCausalLM.from_pretrained(str(out / "huggingface")).eval()
    for name, tokens in token_cases(data).items():
        assert tokens.dtype == torch.int64
        with torch.no_grad():
            want = model(tokens)
            got = {"torchscript": scripted(tokens), "export": program(tokens),
                   "onnx": torch.from_numpy(session.run(None, {"input": tokens.numpy()})[0]),
                   "huggingface": hf(tokens).logits}
        assert want.shape == (*tokens.shape, 256)
        for fmt, logits in got.items():
            torch.testing.assert_close(logits, want, atol=1e-4, rtol=1e-4,
                                       msg=lambda m: f"{fmt} on {name}: {m}")

    # ONNX: int64 tokens ``input`` (batch x sequence) -> ``logits`` (batch x sequence x vocab)
    graph = onnx.load(str(out / "model.onnx")).graph
    dims = [[d.dim_param or d.dim_value for d in v.type.tensor_type.shape.dim]
            for v in (graph.input[0], graph.output[0])]
    assert [v.name for v in (graph.input[0], graph.output[0])] == ["input", "logits"]
    assert graph.input[0].type.tensor_type.elem_type == onnx.TensorProto.INT64
    assert dims == [["batch", "sequence"], ["batch", "sequence", 256]]

    # the GPT-2 folder: the network's shape, no dropout, an untied head, byte tokens
    config = json.loads((out / "huggingface" / "config.json").read_text())
    assert {k: config[k] for k in ("model_type", "n_embd", "n_layer", "n_head", "n_inner",
                                   "n_positions", "vocab_size", "activation_function",
                                   "layer_norm_epsilon", "tie_word_embeddings")} == {
        "model_type": "gpt2", "n_embd": 16, "n_layer": 2, "n_head": 2, "n_inner": 32,
        "n_positions": 16, "vocab_size": 256, "activation_function": "gelu",
        "layer_norm_epsilon": 1e-5, "tie_word_embeddings": False}
    assert config["resid_pdrop"] == config["embd_pdrop"] == config["attn_pdrop"] == 0
    assert not (out / "huggingface" / "tokenizer.json").exists()
    assert "UTF-8 byte" in (out / "huggingface" / "README.md").read_text()


LOAD_WITHOUT_FRUGALNAS = textwrap.dedent("""
    import sys
    sys.path.append(sys.argv[1])          # the venv's site-packages, without its .pth files
    try:
        import frugalnas
    except ModuleNotFoundError:
        pass
    else:
        raise SystemExit(f"frugalnas is importable from {frugalnas.__file__}")
    import numpy as np
    import torch
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained("huggingface").eval()
    cases = np.load("cases.npz")
    for name in sorted({k.split(":")[0] for k in cases.files}):
        tokens = torch.from_numpy(cases[name + ":tokens"])
        with torch.no_grad():
            got = model(tokens).logits.numpy()
        want = cases[name + ":logits"]
        bound = 1e-4 + 1e-4 * float(np.abs(want).max())
        assert got.shape == want.shape, (name, got.shape, want.shape)
        assert float(np.abs(got - want).max()) <= bound, (name, float(np.abs(got - want).max()))
    print("ok", len(cases.files) // 2)
""")


def test_the_huggingface_folder_loads_and_runs_without_frugalnas(study, exported, tmp_path):
    data = study.load_dataset()
    arrays = {}
    with torch.no_grad():
        for name, tokens in token_cases(data).items():
            arrays[f"{name}:tokens"] = tokens.numpy()
            arrays[f"{name}:logits"] = exported.model(tokens).numpy()
    np.savez(tmp_path / "cases.npz", **arrays)
    (tmp_path / "huggingface").symlink_to(exported.out / "huggingface")
    site_packages = str(Path(torch.__file__).resolve().parents[1])
    # -I: no PYTHONPATH, no user site, no current folder; -S: no site-packages .pth files
    # (where an editable install of frugalnas hooks itself in).
    done = subprocess.run([sys.executable, "-I", "-S", "-c", LOAD_WITHOUT_FRUGALNAS,
                           site_packages], cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)
    assert done.returncode == 0 and done.stdout.split()[-2:] == ["ok", "4"], \
        done.stdout[-1000:] + done.stderr[-3000:]


# -- refusals, in one line, before any training -------------------------------------------------
def test_what_gpt2_cannot_hold_is_refused_before_training(study, tmp_path, monkeypatch):
    from frugalnas.export import exporter

    def no_training(*args, **kwargs):
        raise AssertionError("trained before refusing")

    monkeypatch.setattr(exporter, "_train", no_training)
    cases = [(1, "layer 1 has 1 head, layer 0 has 2: a GPT-2 folder needs every layer alike"),
             (2, "heads x head_dim = 2 x 8 = 16 != width 32")]
    for trial, fragment in cases:
        with pytest.raises(ConfigError) as err:
            frugalnas.export_study(study, tmp_path / f"t{trial}", trial=trial,
                                   formats=("onnx", "huggingface"), progress=False)
        message = str(err.value)
        assert fragment in message and "\n" not in message, message
        assert f"trial {trial} ({ARCHS[trial]}) cannot be written in the huggingface format" \
            in message
        assert not (tmp_path / f"t{trial}").exists()
    # with several trials, every one is checked before the first is trained
    with pytest.raises(ConfigError, match=r"^trial [12] \(gpt:.* cannot be written in the"):
        frugalnas.export_study(study, tmp_path / "top", top=3, formats=("huggingface",),
                               progress=False)
    assert not (tmp_path / "top").exists()


def test_the_huggingface_format_needs_transformers_and_language_modelling_data(
        study, tmp_path, monkeypatch):
    image_study = frugalnas.create_study(space="nb201", estimator="params",
                                         space_options={"N": 1, "C": 4}, dataset="digits",
                                         direction="minimize", disable_plugins=OFF, seed=0)
    image_study.optimize(n_trials=1)
    with pytest.raises(ConfigError) as err:
        frugalnas.export_study(image_study, tmp_path / "images", formats=["huggingface"],
                               progress=False)
    assert "the huggingface export format writes GPT-2 language models; dataset 'digits' is " \
        "image-classification data" in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "images").exists()

    find_spec = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec",
                        lambda name, *a: None if name == "transformers" else find_spec(name, *a))
    with pytest.raises(ConfigError) as err:
        frugalnas.export_study(study, tmp_path / "no-hf", trial=0, formats=["huggingface"],
                               progress=False)
    assert 'needs the transformers package, which is not installed; pip install ' \
        '"frugalnas[hf]"' in str(err.value) and "\n" not in str(err.value)
    assert not (tmp_path / "no-hf").exists()


@pytest.mark.parametrize("options, fragment", [
    ({"positions": "rotary"}, "rotary positions: a GPT-2 folder needs learned positions"),
    ({"norm": "rmsnorm"}, "is RMSNorm: a GPT-2 folder needs LayerNorm"),
    ({"kv_heads": 1}, "grouped-query attention (1 key/value heads for 2 query heads)"),
    ({"causal": False}, "attends both ways"),
])
def test_networks_that_are_no_gpt2_are_refused(options, fragment):
    from frugalnas.export.huggingface import gpt2_shape
    from frugalnas.nn.transformer import ElasticGPT

    model = ElasticGPT(256, 16, 2, 2, 8, 32, 16, **options).export()
    with pytest.raises(ConfigError) as err:
        gpt2_shape(model)
    assert fragment in str(err.value) and "\n" not in str(err.value)
    assert gpt2_shape(ElasticGPT(256, 16, 2, 2, 8, 32, 16, activation="gelu_tanh").export()
                      ).activation_function == "gelu_new"


# -- BPE tokens and the command line --------------------------------------------------------------
@pytest.mark.slow
def test_a_bpe_model_carries_its_tokenizer_and_the_command_line_exports_it(tmp_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    corpus = pseudo_verse(tmp_path / "corpus")
    storage = f"sqlite:///{tmp_path / 'optuna.db'}"
    study = gpt_study(corpus, storage, tokenizer="bpe", vocab_size=300,
                      tokenizer_dir=str(tmp_path / "tokenizer"))
    out = tmp_path / "exported"
    env = {**os.environ, "FRUGALNAS_PROGRESS": "0"}
    done = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "export", "--storage", storage,
         "--study-name", "tiny-gpt", "--out", str(out), "--trial", "0", "--epochs", "1",
         "-o", "train.max_steps=4", "--format", "huggingface", "--format", "onnx",
         "--no-latency", "-q", "-p", "no:mlflow"], cwd=tmp_path, capture_output=True,
        text=True, timeout=600, env=env)
    assert done.returncode == 0, done.stderr[-3000:]
    assert "trial 0 (rank 1)" in done.stdout and "test loss" in done.stdout
    assert "nats/token" in done.stdout and "(ONNX: " in done.stdout
    assert sorted(p.name for p in out.iterdir()) == ["huggingface", "model.onnx", "report.json",
                                                     "state_dict.pt"]
    folder = out / "huggingface"
    assert {"tokenizer.json", "tokenizer_config.json", "config.json",
            "model.safetensors"} <= {p.name for p in folder.iterdir()}
    report = json.loads((out / "report.json").read_text())
    assert report["checks"]["huggingface"]["tokens"] == "bpe"
    assert report["dataset"]["preprocessing"]["tokenizer"] == "bpe"

    # the folder's tokenizer gives the dataset's tokens, and the model the module's logits
    data = study.load_dataset()
    text = "thou art the king of night"
    tokenizer = AutoTokenizer.from_pretrained(str(folder))
    assert tokenizer.encode(text) == data.encode(text).tolist()
    assert tokenizer.decode(tokenizer.encode(text)) == text
    model = study.space.build(study.space.parse(ARCHS[0]), data.num_classes, data.input_shape)
    model.load_state_dict(torch.load(out / "state_dict.pt", weights_only=True))
    hf = AutoModelForCausalLM.from_pretrained(str(folder)).eval()
    tokens = torch.as_tensor(data.encode(text))[None]
    with torch.no_grad():
        torch.testing.assert_close(hf(tokens).logits, model.eval()(tokens), atol=1e-4,
                                   rtol=1e-4)
    assert hf.config.vocab_size == data.num_classes == 300

    # refused from the command line: one line, exit status 2, nothing written
    bad = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "export", "--storage", storage,
         "--study-name", "tiny-gpt", "--out", str(tmp_path / "bad"), "--trial", "2",
         "--format", "huggingface", "-q", "-p", "no:mlflow"], cwd=tmp_path,
        capture_output=True, text=True, timeout=600, env=env)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1, bad.stderr
    assert "heads x head_dim = 2 x 8 = 16 != width 32" in bad.stderr
    assert not (tmp_path / "bad").exists()


@pytest.mark.slow
def test_a_tracked_gpt_export_logs_an_mlflow_model_of_token_inputs(corpus, tmp_path):
    import mlflow
    import mlflow.pytorch
    from mlflow import MlflowClient

    from frugalnas.testing import fresh_mlflow_uri

    uri = fresh_mlflow_uri(tmp_path / "mlflow.db")
    study = frugalnas.create_study(
        space="gpt", space_options=SMALL_GPT, estimator="decoder_params",
        estimator_options={"batch_size": 4}, dataset="text",
        dataset_options={"path": str(corpus), "context": 16}, direction="minimize", seed=0,
        plugin_options={"mlflow": {"tracking_uri": uri}}, disable_plugins=["progress"])
    study.optimize(n_trials=1)
    result = frugalnas.export_study(study, tmp_path / "out", train_options=FAST,
                                    formats=("onnx",), latency=False, progress=False)
    info = result.report["mlflow"]
    logged = MlflowClient(tracking_uri=uri).get_logged_model(info["model_id"])
    assert {m.key for m in logged.metrics or []} >= {"test_loss"}
    previous = mlflow.get_tracking_uri()
    mlflow.set_tracking_uri(uri)
    try:
        loaded = mlflow.pytorch.load_model(info["model_uri"])
        pyfunc = mlflow.pyfunc.load_model(info["model_uri"])
    finally:
        mlflow.set_tracking_uri(previous)
    tokens = study.load_dataset().head("test", 3)[0]
    with torch.no_grad():
        torch.testing.assert_close(loaded(tokens), result.model(tokens))
    assert "int64" in str(pyfunc.metadata.signature.inputs)
