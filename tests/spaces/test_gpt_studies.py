"""Studies over the ``gpt`` space on ``text`` data: trained from scratch, through a supernet,
scored by proxies, from the command line; real text files, real torch training."""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest

import frugalnas
from frugalnas.ports.errors import ConfigError
from frugalnas.testing.setups import SMALL_GPT
from ops_support.text_corpus import pseudo_verse

OFF = {"disable_plugins": ("mlflow", "progress")}
@pytest.fixture
def corpus(tmp_path):
    """Six small documents of seeded pseudo-verse (about 6 KB each)."""
    return pseudo_verse(tmp_path / "corpus")


def _study(corpus, estimator, options, **kwargs):
    return frugalnas.create_study(
        space="gpt", space_options=SMALL_GPT, estimator=estimator, estimator_options=options,
        dataset="text", dataset_options={"path": str(corpus), "context": 16},
        direction="minimize", seed=0, **OFF, **kwargs)


def test_a_study_trains_language_models_and_minimises_the_validation_loss(corpus):
    study = _study(corpus, "train", {"max_steps": 30, "batch_size": 16, "optimizer": "adam",
                                     "lr": 0.003})
    study.optimize(n_trials=3)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 3
    for trial in done:
        # an untrained network guesses about uniformly over 256 bytes: ln 256 = 5.55 nats
        assert 0 < trial.values[0] < math.log(256) - 0.5
        # byte tokens: bits per byte is the loss in bits
        bits = trial.frozen.user_attrs["metrics"]["valid_bits_per_byte"]
        assert bits == pytest.approx(trial.values[0] / math.log(2))


def test_a_supernet_with_the_sandwich_rule_scores_every_network_of_the_space(corpus):
    study = _study(corpus, "supernet", {"epochs": 2, "batch_size": 16, "sandwich": 2,
                                        "lr": 0.05})
    study.optimize(n_trials=4)
    values = [t.values[0] for t in study.trials if t.state.name == "COMPLETE"]
    assert len(values) == 4 and all(0 < v < math.log(256) for v in values)


def test_the_decoder_parameter_proxy_scores_and_image_proxies_are_refused(corpus):
    study = _study(corpus, "decoder_params", {"batch_size": 4})
    study.optimize(n_trials=3)
    assert all(t.state.name == "COMPLETE" and t.values[0] > 0 for t in study.trials)
    # the leaderboard counts each language model's size on tokens, as the study saw it
    from frugalnas.leaderboard import leaderboard_rows

    rows = leaderboard_rows(study)
    assert all(row["params"] > row["values"]["value"] > 0 and row["flops"] > 0 for row in rows)
    # refused before the first trial, in one line
    with pytest.raises(ConfigError, match="not meant for language-modelling data") as info:
        _study(corpus, "synflow", {"batch_size": 4})
    assert "\n" not in str(info.value) and "decoder_params" in str(info.value)


@pytest.mark.slow
def test_the_command_line_searches_the_gpt_space_on_the_shipped_text():
    env = {**os.environ, "FRUGALNAS_PROGRESS": "0", "PYTHONWARNINGS": "ignore"}
    run = subprocess.run(
        [sys.executable, "-m", "frugalnas.cli.main", "run", "-q", "-p", "no:mlflow",
         "--space", "gpt", "--dataset", "text", "--estimator", "train", "--direction",
         "minimize", "--n-trials", "2", "-o", "space.widths=[32]", "-o", "space.max_depth=2",
         "-o", "space.context=32", "-o", "dataset.context=32",
         "-o", "estimator.max_steps=10", "-o", "estimator.batch_size=8"],
        capture_output=True, text=True, timeout=600, env=env)
    assert run.returncode == 0, run.stderr[-3000:]


def test_reports_every_k_steps_reach_the_pruner_and_scoring_reads_a_prefix(corpus):
    """An epoch of a language model can be thousands of steps: the pruner hears every k."""
    study = _study(corpus, "train", {"max_steps": 30, "batch_size": 8, "optimizer": "adam",
                                     "lr": 0.003, "report_every_steps": 10,
                                     "valid_examples": 32}, pruner="median")
    study.optimize(n_trials=2)
    for trial in study.trials:
        assert sorted(trial.intermediate_values) == [10, 20, 30]
        assert trial.intermediate_values[30] == pytest.approx(trial.values[0])
    with pytest.raises(ConfigError, match="report_every_steps"):
        _study(corpus, "train", {"report_every_steps": 0})


def tiny_lm(trial):
    """A define-by-run language model of the elastic modules (docs/transformers.md)."""
    from frugalnas.nn.transformer import ElasticGPT

    width = trial.suggest_categorical("width", [16, 32])
    depth = trial.suggest_int("depth", 1, 2)
    heads = trial.suggest_categorical("heads", [1, 2])
    return ElasticGPT(trial.num_classes, width, depth, heads, 8, 2 * width,
                      trial.input_shape[0], positions="rotary").export()


def test_a_define_by_run_language_model_is_searched_on_text(corpus):
    study = frugalnas.create_study(
        space=tiny_lm, dataset="text", dataset_options={"path": str(corpus), "context": 16},
        estimator="train", estimator_options={"max_steps": 20, "batch_size": 16,
                                              "optimizer": "adam", "lr": 3e-3},
        direction="minimize", seed=0, **OFF)
    study.optimize(n_trials=3)
    done = [t for t in study.trials if t.state.name == "COMPLETE"]
    assert len(done) == 3 and all(0 < t.values[0] < math.log(256) for t in done)
    assert all(str(t.architecture).startswith("tiny_lm:width=") for t in done)
