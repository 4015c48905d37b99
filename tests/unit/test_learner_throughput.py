"""The learner benchmark's learner_throughput mode runs on a CPU at its small shape (the GPU's real shapes run on a
GPU machine, docs/learner_speed.md): every variant reports its throughput, and the levers leave the log-probs
unchanged."""

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]


@pytest.mark.long  # minutes of compiling or a benchmark's run: make test-all (docs/testing.md)
def test_learner_throughput_benchmark_runs_on_a_cpu(tmp_path):
    out = tmp_path / "lt.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "learner", "--device=cpu", "--shape=tiny"]
    cmd += ["--steps=1", "--warmup=1", "--seq=96", "--prompt-len=16", "--micro-batch=4", "--ragged", "--profile=3"]
    cmd += ["--paired=1", "--paired-keep=1"]
    # Five variants, each its own process: float32 LoRA had only its adapter count to show, which lorabf16 shows too.
    variants = "--variants=full.old,full.flash,lorabf16.old,lorabf16.flash,lorabf16"
    proc = subprocess.run([*cmd, variants, f"--out={out}"], capture_output=True, text=True)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(out.read_text())
    by = {r["variant"]: r for r in report["results"]}
    assert all(r["ok"] for r in by.values()), [r.get("error") for r in by.values()]
    for r in by.values():
        assert r["tokens_per_s"] > 0 and r["model_tflops_per_step"] >= 0 and len(r["top_kernels"]) == 3
        # the profiled step's products by shape: inner dimensions that agree, each with the rate it ran at
        shapes = r["matmul_shapes"]
        assert 0 < len(shapes) <= 3 and all(m["a"][-1] == m["b"][-2] and m["gflops"] > 0 for m in shapes), shapes
        # ragged lengths in [48, 96], right-padded to each micro-batch's longest
        assert 8 * 48 <= r["tokens_per_step"] < r["padded_tokens_per_step"] <= 8 * 96
    assert by["lorabf16"]["params_lora"] > 0 and by["full.flash"]["params_lora"] == 0
    # on a CPU the levers that act there leave the log-probs exact (the kept head probabilities change only the
    # gradient's rounding): no mask on a right-padded batch (SDPA's flash kernel gives the
    # same numbers at real positions), a group's rows packed (with the flash kernel) and, under bfloat16 autocast,
    # LoRA inputs left uncast (exact round trips)
    assert by["full.flash"]["logprob_gap_vs"] == {"full.old": 0.0}
    assert by["lorabf16.flash"]["logprob_gap_vs"] == {"lorabf16.old": 0.0}
    # the packed rows' attention as GEMMs (learner/levers/cpu_attention.py) rounds otherwise: bfloat16 scores
    assert 0 < by["lorabf16"]["logprob_gap_vs"]["lorabf16.old"] <= 0.01
    assert len(by["lorabf16"]["paired_off_s"]) == len(by["lorabf16"]["paired_on_s"]) == 1
    assert len(by["lorabf16"]["paired_keep_off_s"]) == len(by["lorabf16"]["paired_keep_on_s"]) == 1


def test_the_static_and_cudagraphs_levers_change_how_the_layers_compile(monkeypatch):
    """`static` compiles the layers for the benchmark's fixed shape and `cudagraphs` adds CUDA graphs on top; the
    learner itself keeps dynamic shapes (a run's batches change length every step)."""
    from agentrl_ray.learner.levers import compilation

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from suite.learner import learner_throughput

    monkeypatch.setattr(compilation, "LAYER_COMPILE_OPTIONS", dict(compilation.LAYER_COMPILE_OPTIONS))
    assert compilation.LAYER_COMPILE_OPTIONS == {"dynamic": True}
    learner_throughput.apply_levers(["compile", "static"])
    assert compilation.LAYER_COMPILE_OPTIONS == {"dynamic": False}
    learner_throughput.apply_levers(["compile", "cudagraphs"])
    assert compilation.LAYER_COMPILE_OPTIONS == {"dynamic": False, "mode": "reduce-overhead"}
    monkeypatch.setattr(compilation, "COMPILE_SCOPE", compilation.COMPILE_SCOPE)
    assert compilation.COMPILE_SCOPE == "layers"
    learner_throughput.apply_levers(["compile", "stack"])
    assert compilation.COMPILE_SCOPE == "stack"


@pytest.mark.parametrize("device", ["cuda", "cpu"])
def test_the_share_levers_set_the_shared_prefix_whatever_auto_would(monkeypatch, device):
    """`share` turns learner.shared_prefix on (its `auto` leaves it off on a GPU, where `--paired-share` would then
    measure nothing), `-share` and `old` turn it off, and without either the learner's `auto` decides."""
    from agentrl_ray.infra.profiles import load_config

    monkeypatch.syspath_prepend(str(ROOT / "benchmarks"))
    from suite.learner import learner_throughput

    def shared(*levers: str):
        overrides = learner_throughput.variant_overrides(device, "full", list(levers), 8)
        return load_config(None, overrides).learner.shared_prefix

    assert shared("compile", "share") is True
    assert shared("compile", "-share") is False and shared("old") is False
    assert shared("compile") == "auto"
    bucketed = learner_throughput.variant_overrides(device, "full", ["compile", "bucket"], 8)
    assert load_config(None, bucketed).learner.compile_buckets == learner_throughput.BUCKET > 0


@pytest.mark.long  # minutes of compiling or a benchmark's run: make test-all (docs/testing.md)
def test_a_variant_past_its_timeout_is_stopped_and_the_next_still_runs(tmp_path):
    """--variant-timeout: the first variant's endless steps are cut, its steps so far recorded, and the second runs."""
    out = tmp_path / "lt.json"
    cmd = [sys.executable, str(ROOT / "benchmarks" / "run.py"), "learner", "--device=cpu", "--shape=tiny"]
    cmd += ["--seq=32", "--prompt-len=8", "--micro-batch=2", "--micro-batches=1", "--warmup=0"]
    # Two full fine-tune variants, the second with a lever: each must step once before it is cut (30 s each; the test
    # took 72.8 s alone). Not LoRA: its start (PEFT's and bitsandbytes' imports) took over 20 s in a clean clone's CI
    # run beside the other xdist worker, and needed a 45 s cut.
    first = [*cmd, "--steps=100000", "--variant-timeout=30", "--variants=full,full.flash", f"--out={out}"]
    proc = subprocess.run(first, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    full, flash = json.loads(out.read_text())["results"]
    assert not full["ok"] and full["error"].startswith("timed out after 30 s")
    assert re.search(r"\nfull: step \d+ [\d.]+ s\n", full["error"])  # it had got as far as stepping
    # it ran after full was stopped, stepped, and was cut in turn
    assert not flash["ok"] and re.search(r"\nfull\.flash: step \d+ ", flash["error"])
