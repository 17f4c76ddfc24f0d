"""docs/benchmarks.md and its detail pages under docs/benchmarks/ hold together: every summary
row links to a detail page that exists and quotes its figures verbatim, every benchmark script
a page names exists, and every relative link (anchor included) resolves."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
DOCS = ROOT / "docs"
SUMMARY = DOCS / "benchmarks.md"
DETAIL = DOCS / "benchmarks"
PAGES = [SUMMARY, *sorted(DETAIL.glob("*.md"))]
COLUMNS = ["capability", "current figure", "compared with", "goal", "command", "detail"]
LINK = re.compile(r"\[[^\]]*\]\(([^)\s]+)\)")


def cells(row: str) -> list[str]:
    """The cells of one markdown table row (no cell of these tables holds an escaped pipe)."""
    return [c.strip() for c in row.strip().strip("|").split("|")]


def summary_rows() -> list[dict[str, str]]:
    lines = SUMMARY.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("| capability |"))
    assert cells(lines[start]) == COLUMNS
    rows = []
    for line in lines[start + 2:]:
        if not line.startswith("|"):
            break
        row = cells(line)
        assert len(row) == len(COLUMNS), line
        rows.append(dict(zip(COLUMNS, row)))
    return rows


def prose(text: str) -> str:
    """Text as read: no bold markers, one space for every run of whitespace, case folded."""
    return " ".join(text.replace("**", "").split()).casefold()


def fragments(figure: str) -> list[str]:
    """The quotes of a figure cell: split at '; ' outside brackets, each without its italic
    label (``*what it measures:*``)."""
    parts, depth, start = [], 0, 0
    for i, ch in enumerate(figure):
        depth += ch in "(["
        depth -= ch in ")]"
        if depth == 0 and figure.startswith("; ", i):
            parts.append(figure[start:i])
            start = i + 2
    parts.append(figure[start:])
    return [re.sub(r"^\*[^*]+\*\s*", "", p).strip() for p in parts]


def slug(heading: str) -> str:
    """GitHub's anchor of a heading."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def anchors(path: Path) -> set[str]:
    found, fence = set(), False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fence = not fence
        elif not fence and (m := re.match(r"#{1,6} (.+)", line)):
            found.add(slug(m.group(1)))
    return found


def broken_links(path: Path, within: str = "") -> list[str]:
    bad = []
    for target in LINK.findall(path.read_text()):
        if "://" in target or target.startswith("mailto:") or within not in target:
            continue
        file, _, anchor = target.partition("#")
        dest = (path.parent / file).resolve() if file else path
        if not dest.exists():
            bad.append(f"{target} (no file)")
        elif anchor and dest.suffix == ".md" and anchor not in anchors(dest):
            bad.append(f"{target} (no heading)")
    return bad


ROWS = summary_rows()


def test_the_summary_is_short_and_has_a_row_per_capability():
    assert len(SUMMARY.read_text().splitlines()) < 200
    assert len(ROWS) >= 20
    assert all(row["capability"] and row["detail"] for row in ROWS)


@pytest.mark.parametrize("row", ROWS, ids=[r["capability"] for r in ROWS])
def test_each_row_links_to_a_detail_page_that_quotes_its_figure(row):
    targets = LINK.findall(row["detail"])
    assert len(targets) == 1, row["detail"]
    page = (SUMMARY.parent / targets[0].partition("#")[0]).resolve()
    assert page.parent == DETAIL.resolve() and page.exists(), targets[0]
    if row["current figure"] == "-":
        return
    text = prose(page.read_text())
    missing = [f for f in fragments(row["current figure"]) if prose(f) not in text]
    assert not missing, f"not in {page.name}: {missing}"


def test_every_detail_page_is_in_the_summary():
    linked = {LINK.findall(row["detail"])[0].partition("#")[0] for row in ROWS}
    assert {f"benchmarks/{p.name}" for p in DETAIL.glob("*.md")} == linked


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_benchmark_script_named_exists(page):
    named = re.findall(r"(?:python|bash)\s+(benchmarks/[\w/]+\.(?:py|sh))", page.read_text())
    assert named or page.name == "shipped_results.md"
    assert [n for n in named if not (ROOT / n).is_file()] == []


@pytest.mark.parametrize("page", PAGES, ids=[p.name for p in PAGES])
def test_every_relative_link_resolves(page):
    assert broken_links(page) == []


def test_links_from_the_other_docs_into_the_benchmarks_resolve():
    others = [ROOT / "README.md", *sorted(DOCS.glob("*.md"))]
    bad = {p.name: broken_links(p, within="benchmarks") for p in others}
    assert {name: b for name, b in bad.items() if b} == {}


def test_the_generated_tables_match_the_shipped_results():
    done = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "figures_page.py"), "--check"],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stdout + done.stderr
