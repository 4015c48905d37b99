"""One entry point for the maintained benchmarks: `python benchmarks/run.py NAME [--mode MODE] [ARGS...]` runs
benchmark NAME's script (benchmarks/NAME.py) from the repository's root, with ARGS passed through to the mode
(`NAME --help`: its modes; `NAME --mode MODE --help`: the mode's own options). Each benchmark measures a claim of the
docs page named beside it; docs/benchmarks.md lists them, the results' naming rule and what every result records.
"""

from __future__ import annotations

import importlib
import os
import shlex
import subprocess
import sys
import textwrap
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from results_path import COMMAND_ENV  # noqa: E402
from suite import WIDTH, Benchmark, command_lines  # noqa: E402

# The set, in the order --help lists it: each a script benchmarks/<name>.py whose BENCHMARK names its modes.
NAMES = (
    "against_trl",
    "roofline",
    "learner",
    "rollout",
    "weight_sync",
    "environments",
    "endpoint",
    "echo",
    "real_model",
    "overhead",
)


def benchmarks() -> dict[str, Benchmark]:
    return {name: importlib.import_module(name).BENCHMARK for name in NAMES}


def command(name: str, args: list[str] | None = None) -> list[str]:
    return [sys.executable, f"benchmarks/{name}.py", *(args or [])]


def usage() -> str:
    lines = [
        "usage: python benchmarks/run.py NAME [--mode MODE] [ARGS...]   ARGS go to the mode (the first one by default)",
        "       python benchmarks/run.py NAME --help                   its modes, each with a typical command",
        "       python benchmarks/run.py NAME --mode MODE --help       the mode's own options",
        "       python benchmarks/run.py --list                        the names only",
        "",
        textwrap.fill(
            "The maintained benchmarks, each measuring a claim of the docs page in brackets. A mode's results go to "
            "benchmarks/results/<mode>/<label>-<date>-<machine>.json with a `meta` object: commit, command, machine, "
            "date, summary (docs/benchmarks.md, 'Results').",
            WIDTH,
        ),
    ]
    pad = " " * 24
    for name, b in benchmarks().items():
        lines.append("")
        lines += textwrap.wrap(f"{b.claim} [{b.doc}]", WIDTH, initial_indent=f"  {name:<22}", subsequent_indent=pad)
        lines += textwrap.wrap("modes: " + ", ".join(b.modes), WIDTH, initial_indent=pad, subsequent_indent=pad + "  ")
        lines += command_lines(b.command(next(iter(b.modes))).split(), pad)
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--list":
        print("\n".join(NAMES))
        return 0
    name, args = argv[0], argv[1:]
    if name not in NAMES:
        print(f"run.py: no benchmark {name!r}; one of: {', '.join(NAMES)}", file=sys.stderr)
        return 2
    cmd = command(name, args)
    print("+ " + shlex.join(cmd), file=sys.stderr, flush=True)
    env = {**os.environ, COMMAND_ENV: shlex.join(["python", "benchmarks/run.py", *argv])}
    return subprocess.run(cmd, cwd=ROOT, env=env).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
