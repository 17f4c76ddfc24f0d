"""Latency and peak inference memory of language models: the prefill of T int64 tokens,
measured with ONNX Runtime or torch and cached apart from images; the memory of one forward
pass, exact on a network small enough to count by hand; a gpt study with accuracy and
latency as objectives; the latency predictor refusing language models in one line."""

from __future__ import annotations

import pytest
import torch
from torch import nn

import frugalnas
from frugalnas.backends.single_device import SingleDeviceBackend
from frugalnas.latency import predictor as predictor_module
from frugalnas.latency.cache import cache_key
from frugalnas.latency.estimators import MeasuredLatency, PredictedLatency
from frugalnas.latency.measure import (LatencySetup, MemoryFootprint, example_input, measure,
                                       onnx_bytes, peak_memory)
from frugalnas.latency.predictor import LatencyMeter
from frugalnas.ports.errors import ConfigError
from frugalnas.ports.estimator import TrialContext
from frugalnas.spaces.gpt.space import GPTSpace
from frugalnas.testing.setups import SMALL_GPT
from ops_support.text_corpus import pseudo_verse

OFF = {"disable_plugins": ("mlflow", "progress")}
FAST = {"warmup": 2, "repeats": 5}
T = 16
REFUSED = ("the layer table knows convolutional layers only; use table='kernels' (its "
           "attention, MLP, norm and embedding kernels) for language models")


@pytest.fixture(scope="module")
def space():
    return GPTSpace(**SMALL_GPT)


@pytest.fixture(scope="module")
def small(space):
    return space.uniform(16, 1, 1, 2)


@pytest.fixture(scope="module")
def big(space):
    return space.uniform(32, 2, 2, 4)


def _context(space):
    return TrialContext(space=space, backend=SingleDeviceBackend())


@pytest.mark.parametrize("runtime", ["onnxruntime", "torch"])
def test_a_language_model_is_timed_on_int64_tokens(space, small, runtime):
    net = space.build(small, 256, (T,)).train()
    x = example_input((T,), 2, 256)
    assert x.dtype == torch.int64 and x.shape == (2, T) and 0 <= int(x.min()) <= int(x.max()) < 256
    got = measure(net, (T,), LatencySetup(runtime=runtime, batch_size=2, **FAST), vocab_size=256)
    assert got.median_ms > 0 and got.min_ms <= got.median_ms and got.batch_size == 2
    assert net.training  # the mode is restored
    if runtime == "onnxruntime":
        import onnxruntime as ort

        session = ort.InferenceSession(onnx_bytes(net.eval(), x),
                                       providers=["CPUExecutionProvider"])
        assert session.get_inputs()[0].type == "tensor(int64)"
        logits = session.run(None, {"input": x.numpy()})[0]
        assert logits.shape == (2, T, 256)


def test_two_gpt_networks_measure_and_the_cache_answers_without_measuring(space, small, big,
                                                                          tmp_path,
                                                                          monkeypatch):
    path = str(tmp_path / "latency.sqlite")
    options = {"sequence_length": T, "cache": path, "rounds": 3, **FAST}
    est = MeasuredLatency(**options)
    assert est.tokens and est.input_shape == (T,) and est.num_classes == 256
    # both measured together, in interleaved rounds: drift on a loaded machine meets both
    pair = est.meter.networks(space, [small, big], 256, (T,), tokens=True)
    (fast, hit_fast), (slow, hit_slow) = pair
    assert not hit_fast and not hit_slow and fast.median_ms > 0 and slow.median_ms > 0
    # twice the width, twice the depth: never more than twice as fast (a loose margin)
    assert slow.median_ms > 0.5 * fast.median_ms

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again instead of reading the cache")

    monkeypatch.setattr(predictor_module, "measure_many", no_measuring)
    results = [MeasuredLatency(**options).evaluate(a, _context(space)) for a in (small, big)]
    for result, first in zip(results, (fast, slow)):
        assert result.value == first.median_ms == result.metrics["latency_ms"]
        assert result.metrics["latency_cached"] == 1.0
    # memory is exact and deterministic: the larger network holds more
    lo, hi = (r.metrics["peak_memory_mb"] for r in results)
    assert 0 < lo < hi
    assert results[1].metrics["weight_memory_mb"] > results[0].metrics[
        "weight_memory_mb"]
    assert results[0].cost.params < results[1].cost.params


def test_token_and_image_measurements_never_share_a_cache_key(space, small):
    identity = LatencySetup(**FAST).identity()

    def key(item):
        parts, _, shape = item
        return cache_key({**parts, "input_shape": list(shape), **identity})

    image = LatencyMeter.network_item(space, small, 10, (3, 8, 8))
    tokens = LatencyMeter.network_item(space, small, 256, (T,), tokens=True)
    same_shape_as_image = LatencyMeter.network_item(space, small, 256, (T,))
    assert tokens[0]["input"] == "tokens" and "input" not in image[0]
    assert key(tokens) != key(same_shape_as_image)
    # an image's key is what it was before token inputs existed: existing caches stay valid
    assert key(image) == cache_key({"space": "gpt", "arch": str(small), "classes": 10,
                                    "input_shape": [3, 8, 8], **identity})


def test_peak_memory_counts_weights_input_and_the_live_activations():
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).train()
    got = peak_memory(net, (8,), batch_size=2)
    weights = (8 * 16 + 16 + 16 * 4 + 4) * 4
    # the first layer's output (2 x 16 floats) is alive while the ReLU writes its own
    assert got == MemoryFootprint(weights=weights, input=2 * 8 * 4, activations=2 * 2 * 16 * 4)
    assert got.peak == weights + 64 + 256 and net.training
    # tied weights count once; an in-place activation adds nothing
    tied = nn.Sequential(nn.Linear(8, 8, bias=False), nn.ReLU(inplace=True),
                         nn.Linear(8, 8, bias=False))
    tied[2].weight = tied[0].weight
    got = peak_memory(tied, (8,))
    assert got == MemoryFootprint(weights=8 * 8 * 4, input=8 * 4, activations=2 * 8 * 4)
    assert got.metrics()["peak_memory_mb"] == got.peak / 2**20
    # images: buffers count with the weights (batch-norm statistics, int64 batch counter)
    conv = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.BatchNorm2d(4), nn.ReLU())
    got = peak_memory(conv, (3, 8, 8))
    assert got == MemoryFootprint(weights=(4 * 27 + 4 + 4 + 4 + 4 + 4) * 4 + 8,
                                  input=3 * 64 * 4, activations=2 * 4 * 64 * 4)


def test_peak_memory_of_a_language_model_repeats_and_holds_the_logits(space, big):
    net = space.build(big, 256, (T,))
    first = peak_memory(net, (T,), 2, vocab_size=256)
    assert first == peak_memory(net, (T,), 2, vocab_size=256)
    assert first.input == 2 * T * 8                       # int64 tokens
    assert first.activations >= 2 * T * 256 * 4           # the logits are alive at the end
    assert first.weights == sum(p.numel() * 4 for p in net.parameters())


def test_options_for_token_inputs_are_checked():
    def make(**options):
        return MeasuredLatency(cache="", **options)

    assert make(input_shape=[T]).tokens and make(input_shape=[T]).num_classes == 256
    assert not make().tokens and make().input_shape == (3, 32, 32) and make().num_classes == 10
    assert "peak_memory_mb" in make().provides
    assert "peak_memory_mb" not in make(memory=False).provides
    with pytest.raises(ConfigError, match="input_shape \\[3, 8, 8\\] and sequence_length 16"):
        make(input_shape=[3, 8, 8], sequence_length=16)
    with pytest.raises(ConfigError, match="invalid sequence_length 0"):
        make(sequence_length=0)
    with pytest.raises(ConfigError, match="invalid input_shape \\[8, 8\\]"):
        make(input_shape=[8, 8])


def test_the_kernel_table_predicts_language_models_from_their_transformer_kernels(
        space, small, big, tmp_path):
    from frugalnas.latency.kernels import network_kernels

    kinds = [k.kind for k in network_kernels(space.build(big, 256, (T,)), (T,), tokens=True)]
    assert kinds == ["GPTEmbedding", "LayerNorm", "DenseAttention", "LayerNorm", "DenseMLP",
                     "LayerNorm", "DenseAttention", "LayerNorm", "DenseMLP", "GPTOutput"]
    estimator = PredictedLatency(sequence_length=T, calibration=4, cache=str(tmp_path / "c"),
                                 rounds=1, **FAST)
    estimator.check_space(space)
    predicted = {name: estimator.evaluate(arch, _context(space)).value
                 for name, arch in (("small", small), ("big", big))}
    assert 0 < predicted["small"] < predicted["big"]
    table = estimator.predictor(space)
    assert all(k.tokens == (k.kind == "GPTEmbedding") for k in table.kernels(big))


def test_the_latency_predictor_refuses_inputs_its_space_does_not_take(tmp_path):
    with pytest.raises(ConfigError) as refused:
        PredictedLatency(cache="", sequence_length=T, table="layers")
    assert str(refused.value) == REFUSED
    # on the gpt space without a sequence length, before the first trial: alone or combined
    for estimator, options in [("latency-predictor", {"cache": str(tmp_path / "c")}),
                               ("combined", {"members": {"params": {}, "latency-predictor": {
                                   "cache": str(tmp_path / "c")}}})]:
        with pytest.raises(ConfigError, match="space 'gpt' builds language models: give the "
                                              "latency predictor sequence_length=T") as refused:
            frugalnas.create_study(space="gpt", space_options=SMALL_GPT, estimator=estimator,
                                   estimator_options=options, dataset=None, **OFF)
        assert "\n" not in str(refused.value)
    with pytest.raises(ConfigError, match="sequence_length times language models; space "
                                          "'nb201'"):
        frugalnas.create_study(space="nb201", estimator="latency-predictor",
                               estimator_options={"sequence_length": T, "cache": ""},
                               dataset=None, **OFF)


@pytest.fixture
def corpus(tmp_path):
    """Four small documents of seeded pseudo-verse."""
    return pseudo_verse(tmp_path / "corpus", works=4, lines=120, vocabulary=10)


def test_a_gpt_study_minimises_loss_and_measured_latency_under_a_memory_budget(corpus,
                                                                               tmp_path):
    latency = {"sequence_length": T, "cache": str(tmp_path / "latency.sqlite"), **FAST}
    study = frugalnas.create_study(
        space="gpt", space_options=SMALL_GPT, dataset="text",
        dataset_options={"path": str(corpus), "context": T}, estimator="combined",
        estimator_options={"members": {"train": {"max_steps": 3, "batch_size": 8},
                                       "measured-latency": latency}},
        objectives=["value", "latency_ms"], directions=["minimize", "minimize"],
        constraints={"peak_memory_mb": 64}, seed=0, **OFF)
    study.optimize(n_trials=2)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 2
    for trial in done:
        metrics = trial.user_attrs["metrics"]
        assert trial.values[0] > 0 and trial.values[1] == metrics["latency_ms"] > 0
        assert 0 < metrics["peak_memory_mb"] < 64


@pytest.mark.parametrize("runtime", ["onnxruntime", "torch"])
def test_the_latency_per_generated_token_is_timed_with_a_key_value_cache(space, big, runtime,
                                                                        tmp_path):
    estimator = MeasuredLatency(sequence_length=T, decode=True, runtime=runtime,
                                cache=str(tmp_path / "c.sqlite"), memory=False, **FAST)
    assert {"decode_ms", "decode_ms_iqr"} <= set(estimator.provides)
    result = estimator.evaluate(big, _context(space))
    assert 0 < result.metrics["decode_ms"]
    again = MeasuredLatency(sequence_length=T, decode=True, runtime=runtime,
                            cache=str(tmp_path / "c.sqlite"), memory=False, **FAST)
    # the per-token time comes from the cache too, apart from the prefill's
    assert again.evaluate(big, _context(space)).metrics["decode_ms"] == result.metrics["decode_ms"]
    with pytest.raises(ConfigError, match="decode times generated tokens: it needs "
                                          "sequence_length"):
        MeasuredLatency(decode=True)
