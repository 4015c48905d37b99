"""The maintained benchmarks' code: a folder per benchmark of `benchmarks/run.py`, a module per mode.

Each top-level script of benchmarks/ is one benchmark: a claim of the docs, measured by one or more modes (the first
is the default). `python benchmarks/run.py NAME [--mode MODE] [ARGS...]` runs mode MODE's `main(ARGS, prog)`, the
code that was once a script of its own; a mode's results go to `benchmarks/results/<mode>/` (results_path.py).
`common/` holds what several benchmarks import (a process tree's watcher, a run of the installed CLI).
"""

from __future__ import annotations

import importlib
import os
import shlex
import subprocess
import sys
import textwrap
from dataclasses import dataclass, field
from pathlib import Path

from results_path import COMMAND_ENV, ROOT

HERE = Path(__file__).resolve().parent
WIDTH = 118  # of --help's lines


@dataclass(frozen=True)
class Mode:
    what: str  # one line: what it measures
    example: str = ""  # its arguments in a typical command
    doc: str = ""  # the docs page of its claim, when it is not the benchmark's


@dataclass(frozen=True)
class Benchmark:
    name: str  # its script's name in benchmarks/, and its folder here
    claim: str  # one line: the claim of the docs it measures
    doc: str  # the docs page that makes the claim
    modes: dict[str, Mode] = field(default_factory=dict)  # the first one runs when no --mode is given

    def command(self, mode: str) -> str:
        """The typical command of `mode`, as docs/benchmarks.md and --help write it."""
        words = ["python benchmarks/run.py", self.name]
        if mode != next(iter(self.modes)):
            words += ["--mode", mode]
        return " ".join(w for w in [*words, self.modes[mode].example] if w)

    def usage(self) -> str:
        lines = [
            f"usage: python benchmarks/run.py {self.name} [--mode MODE] [ARGS...]   (--mode MODE --help: its options)",
            "",
            *textwrap.wrap(f"{self.claim} [{self.doc}]", WIDTH),
            "",
            "modes (the first is the default; a mode's results go to benchmarks/results/<mode>/):",
        ]
        pad = " " * 24
        for mode, m in self.modes.items():
            what = m.what + (f" [{m.doc}]" if m.doc else "")
            lines += textwrap.wrap(what, WIDTH, initial_indent=f"  {mode:<22}", subsequent_indent=pad)
            lines += command_lines(self.command(mode).split(), pad)
        return "\n".join(lines)


def command_lines(words: list[str], pad: str) -> list[str]:
    """A shell command over lines of at most WIDTH characters, continued with a backslash."""
    lines, line = [], pad + words[0]
    for w in words[1:]:
        if len(line) + 1 + len(w) > WIDTH - 2:
            lines.append(line + " \\")
            line = pad + "    " + w
        else:
            line += " " + w
    return [*lines, line]


def split_mode(bench: Benchmark, argv: list[str]) -> tuple[str, list[str]]:
    """(mode, its arguments): `--mode X` or `--mode=X` as the first argument, else the default mode."""
    if argv and argv[0] == "--mode" and len(argv) > 1:
        return argv[1], argv[2:]
    if argv and argv[0].startswith("--mode="):
        return argv[0].partition("=")[2], argv[1:]
    return next(iter(bench.modes)), argv


def dispatch(bench: Benchmark, argv: list[str]) -> int:
    """Run the benchmark's mode that argv names with the rest of argv; `--help` first: the benchmark's modes."""
    if argv[:1] in (["-h"], ["--help"]):
        print(bench.usage())
        return 0
    mode, args = split_mode(bench, argv)
    if mode not in bench.modes:
        print(f"{bench.name}: no mode {mode!r}; one of: {', '.join(bench.modes)}", file=sys.stderr)
        return 2
    # The command as typed, for the results' meta (results_path.meta); run.py has set it when it started this script.
    os.environ.setdefault(COMMAND_ENV, shlex.join(["python", *sys.argv]))
    script = HERE / bench.name / f"{mode}.sh"
    if script.is_file():  # a shell mode: its commands are relative to the repository's root
        return subprocess.run(["bash", str(script.relative_to(ROOT)), *args], cwd=ROOT).returncode
    module = importlib.import_module(f"suite.{bench.name}.{mode}")
    return module.main(args, prog=f"benchmarks/run.py {bench.name} --mode {mode}") or 0
