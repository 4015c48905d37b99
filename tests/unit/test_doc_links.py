"""The docs name only what exists: every relative link of the README, docs/ and the examples' READMEs resolves to a
file or folder of the repository, and every test that docs/results.md names as a claim's guard is a test file here.
docs/results.md stays one screen. Every page states the current truth: no heading outside docs/history/ names a round
or an issue (the dated text moves there unchanged), and no page of docs/ outside it runs past 300 lines."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")
HISTORY = ROOT / "docs" / "history"
CURRENT = [page for page in PAGES if HISTORY not in page.parents]
DATED_HEADING = re.compile(r"^#+ .*\b(round|issue) \d+", re.I)
MAX_PAGE_LINES = 300


def _targets(page: Path):
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for target in LINK.findall(line):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                yield n, target.split("#")[0]


def _headings(page: Path):
    """Each Markdown heading of the page with its line number; a `#` line inside a fenced code block is not one."""
    fenced = False
    for n, line in enumerate(page.read_text().splitlines(), 1):
        if line.lstrip().startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith("#"):
            yield n, line


def test_every_relative_link_of_the_docs_resolves():
    broken = [
        f"{page.relative_to(ROOT)}:{n}: {target}"
        for page in PAGES
        for n, target in _targets(page)
        if not (page.parent / target).exists()
    ]
    assert not broken, "\n".join(broken)


def test_results_fits_one_screen_and_names_only_tests_that_exist():
    text = (ROOT / "docs" / "results.md").read_text()
    assert len(text.splitlines()) <= 60
    named = set(re.findall(r"`(tests/[\w/]+\.py)`", text))
    assert len(named) >= 8 and all((ROOT / t).is_file() for t in named), sorted(
        t for t in named if not (ROOT / t).is_file()
    )
    assert "docs/results.md" in (ROOT / "README.md").read_text()


def test_no_heading_outside_docs_history_names_a_round_or_an_issue():
    dated = [
        f"{page.relative_to(ROOT)}:{n}: {line}"
        for page in CURRENT
        for n, line in _headings(page)
        if DATED_HEADING.match(line)
    ]
    assert not dated, "move the dated text to docs/history/, unchanged, or retitle:\n" + "\n".join(dated)


def test_every_docs_page_outside_history_fits_300_lines():
    lines = {page: len(page.read_text().splitlines()) for page in CURRENT if (ROOT / "docs") in page.parents}
    too_long = [f"{page.relative_to(ROOT)}: {n} lines" for page, n in lines.items() if n > MAX_PAGE_LINES]
    assert not too_long, "move the dated detail to docs/history/:\n" + "\n".join(too_long)
