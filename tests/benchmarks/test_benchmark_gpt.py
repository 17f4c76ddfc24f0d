"""The language-model benchmarks' own logic: which networks the reference trains, how its
figures are computed, and one network trained with the reference's recipe on the corpus."""

from __future__ import annotations

import pytest

import gpt_reference as reference
import gpt_supernet_ranking as ranking


def test_the_reference_networks_are_seeded_distinct_and_hold_nanogpts_shape():
    chosen = reference.networks(60)
    assert chosen == reference.networks(60)
    assert len(set(chosen)) == 60 and chosen[0] == reference.NANOGPT
    assert reference.networks(10) == chosen[:10]   # a longer list extends a shorter one


def test_the_summary_reads_the_seed_to_seed_tau_and_the_spread():
    rows = [{"arch": f"a{i}", "seed": s, "valid_loss": 2.0 + 0.1 * i + 0.01 * s * (-1) ** i,
             "seconds": 1.0} for i in range(5) for s in (0, 1)]
    rows.append({"arch": "alone", "seed": 0, "valid_loss": 9.0, "seconds": 1.0})
    summary = reference.summary(rows, [0, 1])
    assert summary["networks"] == 5   # the network without both seeds is left out
    assert summary["seed_tau"] == pytest.approx(1.0)
    assert summary["loss_min"] == pytest.approx(2.005) and summary["loss_max"] < 9


def test_taus_overall_and_within_bins_of_equal_size():
    archs = [f"a{i}" for i in range(8)]
    params = {a: i // 4 for i, a in enumerate(archs)}   # two bins of four
    truth = {a: float(i) for i, a in enumerate(archs)}
    reversed_within = {a: float((i // 4) * 10 - i % 4) for i, a in enumerate(archs)}
    result = ranking.taus(truth, reversed_within, params, bins=2)
    assert result["within_bins"] == pytest.approx(-1.0)
    assert 0 < result["overall"] < 1


@pytest.mark.slow
def test_one_network_trains_with_the_recipe_on_the_corpus():
    if not reference.CORPUS.resolve().exists():
        pytest.skip(f"the Shakespeare corpus is not at {reference.CORPUS.resolve()}")
    plan = {"steps": 5, "batch": 4, "lr": 1e-3, "context": reference.CONTEXT,
            "eval_tokens": 4096, "optimizer": "adam", "weight_decay": 0.0}
    row = reference.train_one("gpt:w64/h1r2", 0, plan)
    assert row["valid_loss"] < 5.6 and row["decoder_params"] < row["params"]
