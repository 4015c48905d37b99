"""benchmarks/ as a maintained set: every script is a benchmark of benchmarks/run.py (with its own --help) or a helper
the benchmarks import, docs/benchmarks.md lists every benchmark, and every stored result is in the one tree,
benchmarks/results/<benchmark>/<label>-<date>-<machine>.<ext> (docs/benchmarks.md, "Results")."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"


@pytest.fixture(scope="module")
def run():
    sys.path.insert(0, str(BENCH))
    try:
        import run as harness

        yield harness
    finally:
        sys.path.remove(str(BENCH))


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def test_every_script_is_a_benchmark_of_the_harness_or_a_helper(run):
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    registered = {b.script for b in run.BENCHMARKS.values()}
    assert registered <= scripts, f"registered but missing: {sorted(registered - scripts)}"
    assert scripts - registered == set(run.HELPERS), f"neither a benchmark nor a helper: {scripts - registered}"


def test_every_benchmark_has_its_own_help_and_backs_a_docs_page(run):
    for name, b in run.BENCHMARKS.items():
        text = (BENCH / b.script).read_text()
        assert ("ArgumentParser" in text) if b.script.endswith(".py") else ("--help" in text), name
        assert (ROOT / b.doc).is_file(), (name, b.doc)
        assert len(b.what) <= 120 and "\n" not in b.what, name


def test_the_harness_help_lists_every_benchmark_with_its_command(run):
    out = subprocess.run([sys.executable, str(BENCH / "run.py"), "--help"], capture_output=True, text=True, check=True)
    for name in run.BENCHMARKS:
        assert f"  {name} " in out.stdout and f"benchmarks/run.py {name}" in out.stdout, name
    assert max(map(len, out.stdout.splitlines())) <= 120


def test_the_harness_passes_arguments_through_and_fails_on_an_unknown_name():
    cmd = [sys.executable, str(BENCH / "run.py"), "cost_model", "--help"]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    assert "usage: cost_model.py" in out.stdout and "--sync-cost" in out.stdout
    bad = subprocess.run([sys.executable, str(BENCH / "run.py"), "no_such"], capture_output=True, text=True)
    assert bad.returncode == 2 and "cost_model" in bad.stderr


def test_trl_side_by_side_gets_an_out_in_the_results_tree_unless_given_one(run):
    cmd = run.command("trl_side_by_side", ["--steps", "3"])
    out = cmd[cmd.index("--out") + 1]
    assert re.fullmatch(r"benchmarks/results/trl_side_by_side/\d{4}-\d\d-\d\d-[a-z0-9-]+\.json", out), out
    for given in (["--out", "x.json"], ["--out=x.json"], ["--report", "x.json"], ["--no-write"]):
        assert run.command("trl_side_by_side", given)[2:] == given
    assert run.command("gpu_learner", ["--help"])[:2] == ["bash", "benchmarks/gpu_learner.sh"]


def test_docs_benchmarks_lists_every_benchmark(run):
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    for name, b in run.BENCHMARKS.items():
        assert f"[`{name}`](../benchmarks/{b.script})" in text, name


def test_every_stored_result_is_in_the_one_tree_named_by_benchmark_date_and_machine():
    assert _tracked("docs/benchmarks") == []  # the scripts' history: docs/history/benchmark_scripts.md
    named = re.compile(r"(^|-)\d{4}-\d\d-\d\d-[A-Za-z0-9_.-]+$")
    for path in _tracked("benchmarks/results"):
        parts = Path(path).parts
        assert len(parts) in (4, 5), path  # benchmarks/results/<benchmark>/<file>, or .../<experiment folder>/<file>
        name = parts[3] if len(parts) == 5 else re.sub(r"\.(json|jsonl|jsonl\.xz|log|txt)$", "", parts[3])
        assert named.search(name), path


def test_machine_names():
    sys.path.insert(0, str(BENCH))
    try:
        from results_path import cpu_tag, default_out, gpu_tag
    finally:
        sys.path.remove(str(BENCH))
    assert cpu_tag("model name\t: AMD EPYC\ncpu family\t: 25\nmodel\t\t: 17\n") == "epyc-f25m17"
    assert cpu_tag("model name\t: Intel(R) Xeon(R) Platinum 8488C @ 2.40GHz\ncpu family\t: 6\nmodel\t: 143\n") == (
        "xeon-platinum-8488c-f6m143"
    )
    assert cpu_tag("") == "unknown"
    assert [gpu_tag(g) for g in ("NVIDIA H100 80GB HBM3", "NVIDIA H200", "NVIDIA A100-SXM4-80GB")] == [
        "h100",
        "h200",
        "a100",
    ]
    out = default_out("throughput", label="calculator", gpu="NVIDIA H200")
    assert out.parent == BENCH / "results" / "throughput"
    assert re.fullmatch(r"calculator-\d{4}-\d\d-\d\d-h200\.json", out.name), out.name
