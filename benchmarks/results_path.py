"""Where a benchmark's result goes by default: the naming rule of docs/benchmarks.md ("Results").

    benchmarks/results/<benchmark>/<label>-<date>-<machine>.<ext>       (label optional)

`date` is today's in UTC (YYYY-MM-DD); `machine` names the GPU the result was measured on, else the CPU:
/proc/cpuinfo's model name without vendor words, lower case, then `-f<family>m<model>`, which tells apart VMs that
name their CPU only "AMD EPYC" (`epyc-f25m17` is a Zen 4); `unknown` where neither can be read.

    from results_path import default_out
    out = default_out("sync_cost")                        # benchmarks/results/sync_cost/2026-12-01-epyc-f26m2.json
    out = default_out("throughput", label="calculator")   # .../throughput/calculator-2026-12-01-epyc-f26m2.json
"""

from __future__ import annotations

import platform
import re
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
RESULTS = ROOT / "benchmarks" / "results"
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
