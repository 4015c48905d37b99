"""Run test tiers one after another, each test's duration written as it ends, and print last each tier's wall time
and its 15 slowest tests. What `make test` (unit + integration) and `make test-all` (+ long) run:

    python tests/tiers.py unit integration          # make test: the unit tier, then the short integration tier
    python tests/tiers.py unit integration long     # make test-all
    python tests/tiers.py --summary .cache/test-times  # the summary of the last run again

Every tier runs even when an earlier one failed; the exit status is 1 if any failed. Durations go to
$AGENTRL_TEST_TIMES_DIR/<tier>.tsv (default .cache/test-times/): one line per test phase over 0.5 s (seconds, phase,
outcome, test id; tests/conftest.py writes them), so a run that was cut short still says where its time went.
"""

from __future__ import annotations

import argparse
import collections
import os
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PYTEST = [sys.executable, "-m", "pytest", "-v", "--timeout", "1200", "--durations=0", "--durations-min=5"]
# A tier is a pytest selection. The unit tier (no Ray) runs on both cores; the Ray tiers one test at a time (their
# tests start Rays and trainings that must not overlap).
TIERS = {
    "unit": ["tests/unit", "-n", "2", "-m", "not long and not rebuild"],
    "integration": ["tests/ray", "tests/gpu", "-m", "not long and not rebuild"],
    "long": ["tests", "-m", "long and not rebuild"],
}
SLOWEST = 15


def run(tiers: list[str], times_dir: Path) -> int:
    times_dir.mkdir(parents=True, exist_ok=True)
    status = 0
    for tier in tiers:
        path = times_dir / f"{tier}.tsv"
        path.unlink(missing_ok=True)
        env = {**os.environ, "AGENTRL_TEST_TIMES": str(path)}
        t0 = time.monotonic()
        code = subprocess.call([*PYTEST, *TIERS[tier]], cwd=ROOT, env=env)
        with path.open("a") as f:
            f.write(f"# wall\t{time.monotonic() - t0:.1f}\texit {code}\n")
        status |= code != 0  # 5 included: a tier that selected nothing is a mistake
    print(summary(times_dir, tiers))
    return status


def summary(times_dir: Path, tiers: list[str] | None = None) -> str:
    """Each tier's wall time and outcome, then its slowest tests (setup, call and teardown added up)."""
    tiers = tiers or [t for t in TIERS if (times_dir / f"{t}.tsv").exists()]
    lines = ["", f"test times ({times_dir}):"]
    for tier in tiers:
        path = times_dir / f"{tier}.tsv"
        if not path.exists():
            continue
        per_test: dict[str, float] = collections.defaultdict(float)
        wall, code = "?", "?"
        for line in path.read_text().splitlines():
            parts = line.split("\t")
            if line.startswith("# wall"):
                wall, code = parts[1], parts[2]
            elif len(parts) == 4:
                per_test[parts[3]] += float(parts[0])
        lines.append(f"{tier}: {float(wall) if wall != '?' else 0:.0f} s wall ({code}); its {SLOWEST} slowest tests:")
        for name, seconds in sorted(per_test.items(), key=lambda kv: -kv[1])[:SLOWEST]:
            lines.append(f"  {seconds:7.1f} s  {name}")
    return "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("tiers", nargs="*", help=f"tiers to run, in order: {', '.join(TIERS)}")
    parser.add_argument("--summary", type=Path, help="print the summary of the durations in this folder, run nothing")
    args = parser.parse_args()
    if args.summary:
        print(summary(args.summary))
        return 0
    unknown = [t for t in args.tiers if t not in TIERS]
    if unknown or not args.tiers:
        parser.error(f"name one or more tiers of {', '.join(TIERS)} (not {', '.join(unknown) or 'none'})")
    times_dir = Path(os.environ.get("AGENTRL_TEST_TIMES_DIR", ROOT / ".cache" / "test-times"))
    return run(args.tiers, times_dir)


if __name__ == "__main__":
    sys.exit(main())
