"""benchmarks/proxy_speed.py: the selected ensemble's reference and fast paths, side by side."""

import pytest

from proxy_speed import selected_speed


@pytest.mark.slow
def test_selected_speed_prints_one_line_per_measurement_and_returns_the_ratio(capsys):
    ratio = selected_speed(cells=2)
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2 and ratio > 0
    assert lines[0].startswith("selected: ") and lines[0].endswith(
        "cells/s after (2 NB201 cells, N=5 C=16, 1 thread), same scores")
    assert lines[1] == f"selected cells/s: {ratio:.2f} x before"
