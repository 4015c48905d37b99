"""benchmarks/ as a maintained set: at most 12 top-level scripts, each a benchmark of benchmarks/run.py (a claim of the
docs, measured by one or more modes, each mode a module of benchmarks/suite/ run only through it) with its own
--help; docs/benchmarks.md lists every benchmark and mode; every stored result is in the one tree,
benchmarks/results/<mode>/<label>-<date>-<machine>.<ext>, and every result JSON outside _retired/ records how it was
made in a `meta` object (docs/benchmarks.md, "Results")."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
BENCH = ROOT / "benchmarks"
SUITE = BENCH / "suite"
HELPERS = {"run.py", "results_path.py"}  # the harness and the results' naming rule and meta
META_KEYS = {"commit", "command", "machine", "date", "summary"}


@pytest.fixture(scope="module")
def run():
    """benchmarks/run.py, imported; the benchmark scripts it imports (`echo`, `learner`, ...) leave sys.modules
    afterwards, so that no later test imports them by those names."""
    before = set(sys.modules)
    sys.path.insert(0, str(BENCH))
    try:
        import run as harness

        yield harness
    finally:
        sys.path.remove(str(BENCH))
        for name in set(sys.modules) - before:
            if str(getattr(sys.modules[name], "__file__", "")).startswith(str(BENCH)):
                del sys.modules[name]


def _tracked(*paths: str) -> list[str]:
    out = subprocess.run(["git", "ls-files", *paths], cwd=ROOT, capture_output=True, text=True, check=True).stdout
    return out.splitlines()


def _harness(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(BENCH / "run.py"), *args], capture_output=True, text=True, cwd=ROOT)


def test_the_top_level_scripts_are_the_set_and_at_most_12(run):
    scripts = {p.name for p in BENCH.iterdir() if p.suffix in (".py", ".sh")}
    assert len(scripts) <= 12, sorted(scripts)
    assert scripts - HELPERS == {f"{name}.py" for name in run.NAMES}, "every script a benchmark of run.NAMES"


def test_every_benchmark_names_its_claim_its_docs_page_and_modes_that_exist(run):
    for name, b in run.benchmarks().items():
        assert b.name == name and b.modes, name
        assert (ROOT / b.doc).is_file() and len(b.claim) <= 120, name
        for mode, m in b.modes.items():
            found = [p for p in (SUITE / name / f"{mode}.py", SUITE / name / f"{mode}.sh") if p.is_file()]
            assert len(found) == 1, (name, mode)
            assert len(m.what) <= 120 and "\n" not in m.what, (name, mode)
            assert not m.doc or (ROOT / m.doc).is_file(), (name, mode, m.doc)


def test_a_mode_runs_only_through_its_benchmark(run):
    """Each mode module is the code of a script once run alone: a `main(argv, prog)` the harness calls, and no
    `__main__` block of its own (no second way to run it)."""
    modes = {SUITE / name / f"{mode}.py" for name, b in run.benchmarks().items() for mode in b.modes}
    for path in SUITE.rglob("*.py"):
        source = path.read_text()
        assert '__name__ == "__main__"' not in source, path
        if path in modes:
            (main,) = [f for f in ast.parse(source).body if isinstance(f, ast.FunctionDef) and f.name == "main"]
            assert [a.arg for a in main.args.args] == ["argv", "prog"], path
    for path in SUITE.rglob("*.sh"):
        assert "--help" in path.read_text(), path


def test_every_benchmark_has_its_own_help_through_the_harness(run):
    for name, b in run.benchmarks().items():
        out = _harness(name, "--help")
        assert out.returncode == 0, (name, out.stderr)
        assert all(f"  {mode} " in out.stdout for mode in b.modes), name
        assert f"python benchmarks/run.py {name}" in out.stdout and max(map(len, out.stdout.splitlines())) <= 120
    # A mode's own --help is its options (these import little; the rest import torch or vLLM: seconds each).
    for args, said in (
        (("overhead", "--mode", "integrity_cost", "--help"), "usage: benchmarks/run.py overhead --mode integrity_cost"),
        (("against_trl", "--mode=startup_cpu", "--help"), "--run-dir"),
        (("learner", "--mode", "gpu_learner", "--help"), "DRY=1"),
    ):
        out = _harness(*args)
        assert out.returncode == 0 and said in out.stdout, (args, out.stderr)


def test_the_scripts_that_measure_nothing_are_tools_docs_benchmarks_names_with_their_own_help():
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    for path in _tracked("tools"):
        assert f"`{Path(path).name}`" in text, path
        if path.endswith(".sh"):
            assert "--help" in (ROOT / path).read_text(), path
        else:
            assert "ArgumentParser" in (ROOT / path).read_text(), path
    out = subprocess.run([sys.executable, "tools/cost_model.py", "--help"], capture_output=True, text=True, cwd=ROOT)
    assert out.returncode == 0 and "docs/scaling.md" in out.stdout


def test_the_harness_help_lists_every_benchmark_with_its_modes_and_command(run):
    out = _harness("--help")
    assert out.returncode == 0
    for name, b in run.benchmarks().items():
        assert f"  {name} " in out.stdout and f"benchmarks/run.py {name}" in out.stdout, name
        assert ", ".join(b.modes) in " ".join(out.stdout.split()), name
    assert max(map(len, out.stdout.splitlines())) <= 120
    assert _harness("--list").stdout.split() == list(run.NAMES)


def test_the_harness_fails_on_an_unknown_benchmark_or_mode(run):
    bad = _harness("no_such")
    assert bad.returncode == 2 and "against_trl" in bad.stderr
    bad = _harness("learner", "--mode", "no_such")
    assert bad.returncode == 2 and "learner_throughput" in bad.stderr
    assert run.command("roofline", ["--threads", "1"]) == [sys.executable, "benchmarks/roofline.py", "--threads", "1"]


def test_the_mode_is_the_first_argument_else_the_default(run):
    from suite import split_mode

    b = run.benchmarks()["rollout"]
    assert split_mode(b, ["--steps", "3"]) == ("throughput", ["--steps", "3"])
    assert split_mode(b, ["--mode", "pipeline_timeline", "--modes", "0,1"]) == ("pipeline_timeline", ["--modes", "0,1"])
    assert split_mode(b, ["--mode=backend_compare", "--model", "tiny"]) == ("backend_compare", ["--model", "tiny"])


def test_docs_benchmarks_lists_every_benchmark_and_mode(run):
    text = (ROOT / "docs" / "benchmarks.md").read_text()
    for name, b in run.benchmarks().items():
        row = next((line for line in text.splitlines() if f"[`{name}`](../benchmarks/{name}.py)" in line), None)
        assert row is not None, name
        assert all(f"`{mode}`" in row for mode in b.modes), name


def test_every_stored_result_is_in_the_one_tree_named_by_mode_date_and_machine(run):
    assert _tracked("docs/benchmarks") == []  # the scripts' history: docs/history/benchmark_scripts.md
    named = re.compile(r"(^|-)\d{4}-\d\d-\d\d-[A-Za-z0-9_.-]+$")
    modes = {mode for b in run.benchmarks().values() for mode in b.modes}
    for path in _tracked("benchmarks/results"):
        parts = Path(path).parts[2:]  # <mode>/<file>, <mode>/<experiment folder>/<file>, _retired/<folder>/<file>
        if parts[0] == "_retired":
            parts = parts[1:]
        else:
            # A mode's folder; gpu_tests/ records tests/gpu runs, train/ plain `agentrl-ray train` runs.
            assert parts[0] in modes | {"gpu_tests", "train"}, f"{path}: no mode of that name (retired: _retired/)"
        assert len(parts) in (2, 3), path
        name = parts[1] if len(parts) == 3 else re.sub(r"\.(json|jsonl|jsonl\.xz|log|txt)$", "", parts[1])
        assert named.search(name), path


# The stored results whose command no evidence gives (docs/benchmarks.md, "Results"): each keeps "unrecorded", and
# only these may. A command found later comes off this list, and the test says so.
LT, TP = "learner_throughput/", "throughput/steps-3-threads-"
COMMAND_UNRECORDED = {
    "a tests/gpu record: docs/gpu_checks.md names the test, not the command line it ran under": [
        "gpu_tests/gpu_e2e-train-torch-2026-11-26-h100.json"
    ],
    "GPU round 1: learner_speed.md's commands differ from what ran (variants skipped by --budget-s, 3-4 steps)": [
        LT + name
        for name in (
            "05b-2026-11-26-h100.json",
            "05b-compiled-2026-11-26-h100.json",
            "05b-ragged-2026-11-26-h100.json",
            "15b-2026-11-26-h100.json",
        )
    ],
    "no command in the docs, now or at the commit that added it, has its variants, steps and paired levers": [
        LT + name
        for name in (
            "05b-cudagraphs-2026-11-27-h200.json",
            "issue33-learner_keep-05b-full_step-after-2026-11-26-epyc.json",
            "issue33-learner_keep-05b-full_step-before-2026-11-26-epyc.json",
            "issue33-learner_keep-05b-quarter_compile-2026-11-26-epyc.json",
            "issue33-round10-learner-attn-math-profile-2026-11-27-epyc.json",
            "issue33-round10-learner-attn-paired-run_allocator-2026-11-27-epyc.json",
            "issue33-round10-learner-attn-sdpa-profile-2026-11-27-epyc.json",
            "issue33-round10-learner-compile-stack-cpu-05b-lora-2026-11-27-epyc.json",
            "issue33-round11-learner-fuse-cpu-05b-lorabf16-2026-11-27-epyc.json",
            "issue33-round11-learner-fuse-rss-cpu-05b-lorabf16-2026-11-28-epyc.json",
            "issue33-round4-hugepages-quarter_glibc_defaults-2026-11-27-epyc.json",
            "issue33-round4-hugepages-quarter_run_allocator-2026-11-27-epyc.json",
            "issue33-round4-hugepages-quarter_run_allocator_hugepages-2026-11-27-epyc.json",
            "issue33-round6-learner_paired_scatter-quarter-2026-11-27-epyc.json",
            "issue33-round6-learner_paired_scatter-quarter-compiled-2026-11-27-epyc.json",
            "issue33-round9-learner-compile-static-cpu-2026-11-27-epyc.json",
            "issue33-round9-learner-shared_prefix-paired-glibc-2026-11-27-epyc.json",
            "issue55-round24-quarter-profile-2026-12-02-xeon-f6m167.json",
            "issue55-round25-quarter-mb2-2026-12-05-xeon-f6m167.json",
            "issue55-round25-quarter-mb4-2026-12-05-xeon-f6m167.json",
            "issue55-round25-quarter-mb8-2026-12-05-xeon-f6m167.json",
        )
    ],
    "the run's thread-count and model overrides: neither recorded nor given by the docs": [
        TP + name + "-2026-11-23-unknown.json"
        for name in (
            "small-onpolicy",
            "small-overlap-1-1",
            "small-overlap-1-1-passive",
            "small-overlap-2-1",
            "small-overlap-2-1-passive",
            "small-overlap-2-2-passive",
            "tiny-onpolicy-passive",
            "tiny-overlap-1-1",
            "tiny-overlap-2-1-passive",
            "tiny-overlap-2-2-passive",
        )
    ],
    "composed by hand from separate invocations (the runs' notes say which): no one command made it": [
        "trl_side_by_side/issue33-round17-qwen05b-lora-8x8x256-bf16-interleaved-2026-11-28-epyc-f25m17.json",
        "trl_side_by_side/issue33-round18-qwen05b-lora-8x8x256-bf16-3pairs-2026-11-29-epyc-f25m17.json",
    ],
}
# with_meta's HEAD (-dirty) or unknown; "added in <sha>" for a result stored before meta existed; the short hash
# (+changes) a few of those recorded themselves.
COMMIT = re.compile(r"(added in )?[0-9a-f]{40}(-dirty)?|unknown|[0-9a-f]{7}(\+changes)?")


def _stored_metas() -> dict[str, object]:
    return {
        path: json.loads((ROOT / path).read_text()).get("meta")
        for path in _tracked("benchmarks/results")
        if path.endswith(".json") and "/_retired/" not in path
    }


def test_every_result_json_outside_retired_records_how_it_was_made():
    missing = []
    for path, meta in _stored_metas().items():
        if not isinstance(meta, dict) or set(meta) != META_KEYS or any(type(v) is not str for v in meta.values()):
            missing.append(path)
    assert not missing, missing


def test_every_stored_result_says_its_summary_and_commit_and_its_command_unless_listed():
    excepted = {f"benchmarks/results/{name}" for names in COMMAND_UNRECORDED.values() for name in names}
    metas = _stored_metas()
    assert excepted <= set(metas), sorted(excepted - set(metas))
    assert [p for p, m in metas.items() if m["summary"] == "unrecorded" or not m["summary"].strip()] == []
    assert [p for p, m in metas.items() if not COMMIT.fullmatch(m["commit"])] == []
    unrecorded = {p for p, m in metas.items() if m["command"] == "unrecorded"}
    assert unrecorded - excepted == set(), "no command and not in COMMAND_UNRECORDED"
    assert excepted - unrecorded == set(), "a command was found: take these off COMMAND_UNRECORDED"


def test_meta_names_commit_command_machine_date_and_summary(monkeypatch):
    monkeypatch.syspath_prepend(str(BENCH))
    from results_path import COMMAND_ENV, machine, with_meta

    monkeypatch.setenv(COMMAND_ENV, "python benchmarks/run.py roofline --mode machine_peak")
    out = with_meta({"rows": [1], "meta": "stale"}, "bf16 GEMM  965 GFLOP/s\n at 2048-square")
    assert list(out) == ["meta", "rows"] and set(out["meta"]) == META_KEYS
    meta = out["meta"]
    assert meta["command"] == os.environ[COMMAND_ENV] and meta["machine"] == machine()
    assert meta["summary"] == "bf16 GEMM 965 GFLOP/s at 2048-square"
    assert re.fullmatch(r"\d{4}-\d\d-\d\d", meta["date"])
    assert re.fullmatch(r"[0-9a-f]{40}(-dirty)?|unknown", meta["commit"]), meta["commit"]


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
