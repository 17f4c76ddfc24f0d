"""The leaderboard (``frugalnas report``): ranking, rows, HTML and the terminal table."""

from __future__ import annotations

import io

import pytest

import frugalnas
from frugalnas.export import leaderboard_html, leaderboard_rows, leaderboard_table, pareto_fronts

SMALL = {"N": 1, "C": 4}
#: The table scores the cells of SMALL as in the benchmark network; the leaderboard builds the
#: small networks to count their sizes.
ANY_NETWORK = {"any_network": True}
OFF = ["mlflow", "progress"]


def table_study(objectives=("value",), directions=("maximize",), n=8):
    study = frugalnas.create_study(space="nb201", estimator="nb201-table", space_options=SMALL,
                                   estimator_options=ANY_NETWORK,
                                   objectives=list(objectives), directions=list(directions),
                                   disable_plugins=OFF, seed=1)
    study.optimize(n_trials=n)
    return study


def test_pareto_fronts():
    points = [(1, 5), (2, 4), (2, 6), (0, 0), (3, 3), (1, 1)]
    # maximise the first, minimise the second
    assert pareto_fronts(points, ["maximize", "minimize"]) == [3, 2, 3, 1, 1, 1]
    assert pareto_fronts(points, ["maximize", "maximize"]) == [2, 2, 1, 4, 1, 3]
    assert pareto_fronts([], ["maximize"]) == []


def test_rows_of_a_single_objective_study():
    study = table_study(n=6)
    rows = leaderboard_rows(study)
    done = study.completed_trials()
    assert [r["rank"] for r in rows] == list(range(1, 7))
    values = [r["values"]["value"] for r in rows]
    assert values == sorted(values, reverse=True) and rows[0]["trial"] == study.best_trial.number
    by_number = {t.number: t for t in done}
    for row in rows:
        assert row["architecture"] == str(by_number[row["trial"]].architecture)
        assert row["front"] is None and row["params"] > 0 and row["flops"] > 0
        assert set(row["cost"]) >= {"seconds", "params"} and "valid_accuracy_cifar10" in row["metrics"]
    # sizes are those of the network built at the dataset's shape (digits: 1x8x8, 10 classes)
    best = study.space.build(study.best_trial.architecture, 10, (1, 8, 8))
    assert rows[0]["params"] == sum(p.numel() for p in best.parameters())
    assert [r["trial"] for r in leaderboard_rows(study, limit=2, sizes=False)] == \
        [r["trial"] for r in rows[:2]]
    assert leaderboard_rows(study, limit=1, sizes=False)[0]["params"] is None


def test_rows_of_a_two_objective_study_follow_the_pareto_fronts():
    study = table_study(("value", "params"), ("maximize", "minimize"), n=12)
    rows = leaderboard_rows(study, sizes=False)
    fronts = [r["front"] for r in rows]
    assert fronts == sorted(fronts) and fronts[0] == 1
    assert {r["trial"] for r in rows if r["front"] == 1} == {t.number for t in study.best_trials}
    first = [r["values"]["value"] for r in rows if r["front"] == 1]
    assert first == sorted(first, reverse=True)


def test_html_escapes_links_and_marks_the_front():
    rows = [{"rank": 1, "trial": 4, "architecture": "space:<a&b>", "values": {"acc": 93.25},
             "front": 1, "params": 1_200_000, "flops": 3.4e9, "cost": {"seconds": 12.5,
                                                                      "flops": 2e12}},
            {"rank": 2, "trial": 7, "architecture": "space:c", "values": {"acc": 91.0},
             "front": 2, "params": None, "flops": None, "cost": {}}]
    html = leaderboard_html(rows, {"acc": "maximize"}, {4: "http://ui/#/runs/r1?a=1&b=2"},
                            title="study <x>")
    assert "space:&lt;a&amp;b&gt;" in html and "<a&b>" not in html
    assert '<a href="http://ui/#/runs/r1?a=1&amp;b=2">4</a>' in html
    assert "study &lt;x&gt;" in html and "acc \u2191" in html
    assert '<tr class="pareto">' in html and html.count("<tr") == 3
    assert "1.2M" in html and "3.4G" in html and "12.5 s" in html and "2T" in html
    assert ">7</td>" in html  # no link for a trial without one
    plain = leaderboard_html(rows, ["acc"])
    assert "href" not in plain and "acc</th>" in plain


def test_rich_table_shows_architectures_in_full():
    from rich.console import Console

    study = table_study(n=3)
    rows = leaderboard_rows(study)
    buf = io.StringIO()
    Console(file=buf, width=250).print(leaderboard_table(rows, {"value": "maximize"}, title="t"))
    text = buf.getvalue()
    for row in rows:
        assert row["architecture"] in text
    assert "value ↑" in text and "params" in text and "FLOPs" in text


@pytest.mark.slow
def test_report_command_writes_html(tmp_path):
    from ops_support.cli_driver import cli_cases

    storage = f"sqlite:///{tmp_path / 's.db'}"
    study = frugalnas.create_study(space="nb201", estimator="nb201-table", space_options=SMALL,
                                   estimator_options=ANY_NETWORK,
                                   storage=storage, study_name="board", disable_plugins=OFF)
    study.optimize(n_trials=4)
    html = tmp_path / "out" / "board.html"
    # both command lines in one interpreter (ops_support.cli_driver)
    proc, bad = cli_cases([
        ["report", "--storage", storage, "--study-name", "board", "--html", str(html),
         "--limit", "3"],
        ["report", "--storage", storage, "--study-name", "boards"]], tmp_path, timeout=600)
    assert proc["rc"] in (0, None), proc["err"]
    assert "study board: 3 of 4 completed trial(s), best first" in proc["out"]
    assert str(study.best_trial.architecture) in proc["out"]
    assert html.read_text().count("<tr") == 4
    assert bad["rc"] == 2 and "no study named 'boards'" in bad["err"] and "board" in bad["err"]
