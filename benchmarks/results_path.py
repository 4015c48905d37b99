"""Where a benchmark's result goes by default, and what every result JSON records about how it was made: the naming
rule and the schema of docs/benchmarks.md ("Results").

    benchmarks/results/<mode>/<label>-<date>-<machine>.<ext>       (label optional; a benchmark's mode, its folder)

`date` is today's in UTC (YYYY-MM-DD); `machine` names the GPU the result was measured on, else the CPU:
/proc/cpuinfo's model name without vendor words, lower case, then `-f<family>m<model>`, which tells apart VMs that
name their CPU only "AMD EPYC" (`epyc-f25m17` is a Zen 4); `unknown` where neither can be read.

    from results_path import default_out
    out = default_out("sync_cost")                        # benchmarks/results/sync_cost/2026-12-01-epyc-f26m2.json
    out = default_out("throughput", label="calculator")   # .../throughput/calculator-2026-12-01-epyc-f26m2.json
    out.write_text(json.dumps(with_meta(result, f"{samples_per_s:.2f} samples/s"), indent=2))

`with_meta` puts a `meta` object first in the result: `commit` (HEAD, `-dirty` when tracked files differ from it;
`unknown` outside a git checkout), `command` (as typed, through benchmarks/run.py when it started the benchmark),
`machine` (the tag above), `date` (UTC) and `summary`, the result in one line, which the benchmark writes.

The results stored before `meta` existed say where they come from in the same keys. Their `commit` is
`added in <40-hex sha>`: the commit that added the file's numbers (its first commit, renames followed; or the later
one that measured them again), whose tree, or the code just before it, made them (a label such as `-round7-code` or
`-before` names older code). Their `command` was rebuilt from what the JSON records (settings, args) or the docs give
beside it, written as typed through the harness today, or as the old script's command where the recorded arguments
are no longer all the mode's; `unrecorded` where no evidence gives it (tests/unit/test_benchmarks_harness.py lists
those). Their `summary` was written from the file's own numbers.
"""

from __future__ import annotations

import os
import platform
import re
import shlex
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
COMMAND_ENV = "AGENTRL_BENCH_COMMAND"  # the command as typed; the harness (suite.dispatch) sets it
_VENDOR = re.compile(r"\((r|tm)\)|@.*$|\b(amd|intel|nvidia|cpu|processor|\d+-core)\b")


def _slug(words: str) -> str:
    return "-".join(w for w in re.split(r"[^a-z0-9]+", _VENDOR.sub(" ", words.lower())) if w)


def gpu_tag(name: str) -> str:
    """ "NVIDIA H100 80GB HBM3" -> "h100", "NVIDIA A100-SXM4-80GB" -> "a100": up to the first word with a digit."""
    words = [w for w in re.split(r"[\s-]+", _VENDOR.sub(" ", name.lower())) if w and w not in ("geforce", "tesla")]
    for i, w in enumerate(words):
        if any(c.isdigit() for c in w):
            return _slug(" ".join(words[: i + 1]))
    return _slug(" ".join(words)) or "unknown"


def cpu_tag(cpuinfo: str | None = None) -> str:
    """This machine's CPU as a file-name word, e.g. "epyc-f25m17" ("unknown" where /proc/cpuinfo is unreadable)."""
    if cpuinfo is None:
        try:
            cpuinfo = Path("/proc/cpuinfo").read_text()
        except OSError:
            return _slug(platform.processor() or platform.machine()) or "unknown"
    fields: dict[str, str] = {}
    for line in cpuinfo.splitlines():
        key, _, value = line.partition(":")
        fields.setdefault(key.strip(), value.strip())
    tag = _slug(fields.get("model name", "")) or "unknown"
    if fields.get("cpu family") and fields.get("model"):
        tag += f"-f{fields['cpu family']}m{fields['model']}"
    return tag


def machine(gpu: str | None = None) -> str:
    return gpu_tag(gpu) if gpu else cpu_tag()


def default_out(benchmark: str, label: str = "", ext: str = "json", gpu: str | None = None) -> Path:
    """benchmarks/results/<benchmark>/<label>-<date>-<machine>.<ext>; the folder is not created."""
    parts = [_slug(label) if label else "", time.strftime("%Y-%m-%d", time.gmtime()), machine(gpu)]
    return RESULTS / benchmark / (("-".join(p for p in parts if p)) + "." + ext)


def commit() -> str:
    """HEAD's hash, with "-dirty" when a tracked file differs from it; "unknown" outside a git checkout."""
    try:
        head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=ROOT, capture_output=True, text=True)
        dirty = subprocess.run(["git", "status", "--porcelain", "--untracked-files=no"], cwd=ROOT, capture_output=True)
    except OSError:  # no git installed
        return "unknown"
    if head.returncode != 0:
        return "unknown"
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def meta(summary: str, gpu: str | None = None) -> dict:
    """How this result was made: commit, command, machine, date, and the benchmark's one-line summary of it."""
    return {
        "commit": commit(),
        "command": os.environ.get(COMMAND_ENV) or shlex.join(["python", *sys.argv]),
        "machine": machine(gpu),
        "date": time.strftime("%Y-%m-%d", time.gmtime()),
        "summary": " ".join(summary.split()),
    }


def with_meta(result: dict, summary: str, gpu: str | None = None) -> dict:
    """`result` with its `meta` first, as every benchmark writes its JSON (`gpu`: the GPU's name where one ran it)."""
    return {"meta": meta(summary, gpu), **{k: v for k, v in result.items() if k != "meta"}}
