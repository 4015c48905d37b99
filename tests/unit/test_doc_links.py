"""The docs name only what exists: every relative link of the README, docs/ and the examples' READMEs resolves to a
file or folder of the repository, and every test that docs/results.md names as a claim's guard is a test file here.
docs/results.md stays one screen."""

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").rglob("*.md")), *sorted((ROOT / "examples").glob("*/README.md"))]
LINK = re.compile(r"\]\(([^)\s]+)\)")


def _targets(page: Path):
    for n, line in enumerate(page.read_text().splitlines(), 1):
        for target in LINK.findall(line):
            if not re.match(r"[a-z]+:", target) and not target.startswith("#"):
                yield n, target.split("#")[0]


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
