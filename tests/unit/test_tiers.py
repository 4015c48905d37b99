"""Every test under tests/ray names its tier: `integration` (make test) or `long` (make test-all only), never both
and never neither; a test that named none would silently fall into make test and cost every change its minutes.
The tiers' runner (tests/tiers.py) prints each tier's wall time and slowest tests from the durations file."""

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
TIERS = {"integration", "long"}
# A pytest plugin for the collecting process: each collected test's marker names, as JSON.
PLUGIN = """
import json, os

def pytest_collection_finish(session):
    with open(os.environ["TIER_MARKS_OUT"], "w") as f:
        json.dump({item.nodeid: sorted({m.name for m in item.iter_markers()}) for item in session.items}, f)
"""


def _marks(tmp_path, *paths) -> dict[str, list[str]]:
    (tmp_path / "tier_marks_plugin.py").write_text(PLUGIN)
    out = tmp_path / "marks.json"
    env = {"PYTHONPATH": str(tmp_path), "TIER_MARKS_OUT": str(out)}
    done = subprocess.run(
        [sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "tier_marks_plugin", "-p", "no:cacheprovider"]
        + [str(ROOT / p) for p in paths],
        cwd=ROOT,
        env={**{k: v for k, v in os.environ.items() if k != "PYTHONPATH"}, **env},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return json.loads(out.read_text())


@pytest.mark.slow  # collects tests/ray in a subprocess: ~20 s
def test_every_ray_test_names_one_tier(tmp_path):
    marks = _marks(tmp_path, "tests/ray")
    assert len(marks) > 20, marks  # the whole tier was collected
    wrong = {test: sorted(set(names) & TIERS) for test, names in marks.items() if len(set(names) & TIERS) != 1}
    assert not wrong, f"each test under tests/ray needs exactly one of @pytest.mark.integration or .long: {wrong}"
    # `slow` has one meaning: a unit test over ~3 s (make test-fast leaves it out)
    assert not [t for t, names in marks.items() if "slow" in names]
    counts = {tier: sum(tier in names for names in marks.values()) for tier in TIERS}
    assert counts["integration"] > 0 and counts["long"] > 0, counts


def test_the_runner_sums_each_tests_phases_and_ranks_them(tmp_path):
    sys.path.insert(0, str(ROOT / "tests"))
    try:
        from tiers import summary
    finally:
        sys.path.remove(str(ROOT / "tests"))
    (tmp_path / "unit.tsv").write_text(
        "2.0\tsetup\tpassed\ttests/unit/a.py::t1\n"
        "3.0\tcall\tpassed\ttests/unit/a.py::t1\n"
        "4.0\tcall\tfailed\ttests/unit/b.py::t2\n"
        "# wall\t9.4\texit 1\n"
    )
    text = summary(tmp_path, ["unit"])
    lines = text.splitlines()
    head = next(i for i, line in enumerate(lines) if line.startswith("unit: "))
    assert lines[head].startswith("unit: 9 s wall (exit 1)")
    assert lines[head + 1].split() == ["5.0", "s", "tests/unit/a.py::t1"]  # setup + call, ranked first
    assert lines[head + 2].split() == ["4.0", "s", "tests/unit/b.py::t2"]
