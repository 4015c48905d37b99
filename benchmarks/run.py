"""One entry point for the maintained benchmarks: `python benchmarks/run.py NAME [ARGS...]` runs benchmark NAME's
script with ARGS passed through, from the repository's root (`NAME --help`: its own options). Each backs a claim of
the docs page named beside it; docs/benchmarks.md lists them and the results' naming rule.
"""

from __future__ import annotations

import subprocess
import sys
import textwrap
from dataclasses import dataclass
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parent
sys.path.insert(0, str(HERE))

from results_path import default_out  # noqa: E402


@dataclass(frozen=True)
class Benchmark:
    script: str  # file in benchmarks/
    what: str  # one line
    doc: str  # the docs page whose claim it measures
    example: str  # its arguments in a typical command


GROUPS: dict[str, dict[str, Benchmark]] = {
    "Against TRL, and the CPU's bound": {
        "trl_side_by_side": Benchmark(
            "trl_side_by_side.py",
            "TRL's GRPOTrainer and ours on identical work: samples/s, start-up, peak RSS/PSS",
            "docs/benchmarks.md",
            "--model qwen05b --lora 1 --bf16 1 --steps 3 --prompts 8 --group 8 --max-completion 256 "
            "--micro-batch 4 --staleness 0 --repeats 2 --tasks single --eval-prompts 0",
        ),
        "trl_grpo_run": Benchmark(
            "trl_grpo_run.py",
            "one TRL GRPOTrainer run, timed step by step (trl_side_by_side's TRL side)",
            "docs/benchmarks.md",
            "--task tool --steps 3 --prompts 4 --group 4 --out /tmp/trl-run",
        ),
        "roofline": Benchmark(
            "roofline.py",
            "a step's FLOPs and bytes against this CPU's GEMM rate and bandwidth: how far a speed-up is",
            "docs/benchmarks.md",
            "--model qwen05b --lora-r 16 --group 8 --samples 64 --tokens 16384 --generate-s 69.4 --learner-s 140.0",
        ),
        "machine_peak": Benchmark(
            "machine_peak.py",
            "GEMM GFLOP/s (float32, bfloat16) at the 0.5B shape's matmuls, and copy bandwidth",
            "docs/benchmarks.md",
            "--threads 1,2",
        ),
        "gemm_forms": Benchmark(
            "gemm_forms.py",
            "the learner's matrix products as is, transposed and in row blocks: where the GEMM library is short",
            "docs/benchmarks.md",
            "--rounds 5",
        ),
        "generation_phases": Benchmark(
            "generation_phases.py",
            "the vLLM engine's prefill and decode timed apart, at a shape",
            "docs/benchmarks.md",
            "--model qwen05b --prompts 8 --group 8 --decode 32",
        ),
        "startup_cpu": Benchmark(
            "startup_cpu.py",
            "where a run's start-up goes: each process's phases, and its CPU-seconds against the cores' bound",
            "docs/benchmarks.md",
            "--phases --run-dir runs/startup/s -- agentrl-ray train examples/calculator/config.yaml "
            "run.output_dir=runs/startup run.name=s run.steps=3 run.eval_every=0 run.eval_at_start=false",
        ),
        "integrity_cost": Benchmark(
            "integrity_cost.py",
            "the always-on integrity checks' time per step, and the step time with them against without",
            "docs/integrity.md",
            "--steps 30 --pairs 2",
        ),
        "pipeline_timeline": Benchmark(
            "pipeline_timeline.py",
            "the long-tail agent workload per pipeline mode: engines generating/waiting/idle, learner busy/waiting",
            "docs/async.md",
            "--steps 12",
        ),
        "real_model": Benchmark(
            "real_model.py",
            "SmolLM2-135M on BFCL or GSM with tools end to end: data, eval, SFT, GRPO + ECHO, eval",
            "docs/real_model.md",
            "bfcl",
        ),
    },
    "The learner and weight sync": {
        "learner_throughput": Benchmark(
            "learner_throughput.py",
            "the learner's step alone (tokens/s, MFU), each speed lever on and off, CUDA or CPU",
            "docs/learner_speed.md",
            "--device cpu --shape tiny --steps 1 --warmup 1",
        ),
        "gpu_learner": Benchmark(
            "gpu_learner.sh",
            "the GPU learner's open targets (fused linears, compile buckets) in one budgeted command; DRY=1: "
            "its logic on a CPU",
            "docs/learner_speed.md",
            "",
        ),
        "ipc_handoff": Benchmark(
            "ipc_handoff.py",
            "colocated weight handoff by CUDA IPC against the object store, s/GB",
            "docs/learner_speed.md",
            "--shape 0.5b --shape 1.5b --repeats 5",
        ),
        "lora_sync": Benchmark(
            "lora_sync.py",
            "LoRA weight sync on vLLM CPU, merged into the base against vLLM's own LoRA",
            "docs/scaling.md",
            "--model qwen05b --dtype bfloat16 --modes merge",
        ),
        "sync_cost": Benchmark(
            "sync_cost.py",
            "weight push between two Ray nodes, object store against gloo, per payload size",
            "docs/scaling.md",
            "--sizes-mb 8 64",
        ),
        "cost_model": Benchmark(
            "cost_model.py",
            "the per-step cost model on paper, 0.5B-70B on agentrl-ray plan's plans",
            "docs/scaling.md",
            "",
        ),
        "cpu_adamw": Benchmark(
            "cpu_adamw.py",
            "one AdamW step on a CPU: torch's foreach and fused kernels, DeepSpeed's FusedAdam",
            "docs/deepspeed.md",
            "--params 100e6 --threads 2",
        ),
        "deepspeed_options": Benchmark(
            "deepspeed_options.py",
            "ZeRO-3 with optimizer offload, parameter offload, gradient checkpointing, 2 steps each",
            "docs/deepspeed.md",
            "",
        ),
    },
    "Rollout, environments and the sandbox": {
        "throughput": Benchmark(
            "throughput.py",
            "a training run's samples/s, sampled tokens/s and per-phase split (make bench)",
            "docs/default_run.md",
            "--run-dir runs/calculator",
        ),
        "backend_compare": Benchmark(
            "backend_compare.py",
            "the vLLM and torch rollout engines on the same prompts: tokens/s, log-prob gaps",
            "docs/backends.md",
            "--model tiny --dtype float32",
        ),
        "builtin_model_quality": Benchmark(
            "builtin_model_quality.py",
            "the built-in model before training, as rollouts see it: success, tool-call rate",
            "docs/benchmarks.md",
            "--n 500",
        ),
        "env_scale": Benchmark(
            "env_scale.py",
            "hundreds of environments on a few EnvHost actors, one tool call each: latency",
            "docs/sandbox.md",
            "--instances 32",
        ),
        "env_isolation": Benchmark(
            "env_isolation.py",
            "create and tool-call latency and memory of each env.isolation level, 1 and 512 at once",
            "docs/reliability.md",
            "thread process",
        ),
        "sandbox_latency": Benchmark(
            "sandbox_latency.py",
            "a sandboxed run's start cost, and latency with hundreds at once",
            "docs/sandbox.md",
            "--concurrent 1024",
        ),
        "openai_endpoint": Benchmark(
            "openai_endpoint.py",
            "the OpenAI-compatible endpoint's latency, sequential and concurrent",
            "docs/openai_agent.md",
            "--backend torch",
        ),
        "openai_agent_compare": Benchmark(
            "openai_agent_compare.py",
            "the calculator trained as the built-in env and as an OpenAI-client program",
            "docs/openai_agent.md",
            "runs/cmp_builtin runs/cmp_agent",
        ),
    },
    "ECHO, the viewer, the cluster": {
        "echo_experiment": Benchmark(
            "echo_experiment.py",
            "GRPO against GRPO + ECHO: held-out success vs samples, env-token CE",
            "docs/echo.md",
            "--config examples/grid/delayed.yaml --pick reach --schedule linear --seeds 0 1 2 3 4",
        ),
        "grid_probe": Benchmark(
            "grid_probe.py",
            "whether a grid model's first moves depend on the goal (the gate before RL)",
            "docs/echo.md",
            "--observe delayed",
        ),
        "view_cost": Benchmark(
            "view_cost.py",
            "what agentrl-ray view costs a training run's step time",
            "docs/viewer.md",
            "--steps 30 --rounds 2",
        ),
        "view_screenshots": Benchmark(
            "view_screenshots.py",
            "screenshots of every viewer page for the docs (headless Chromium)",
            "docs/viewer.md",
            "runs --run NAME",
        ),
        "ray_up_local": Benchmark(
            "ray_up_local.sh",
            "ray up clusters/local.yaml for real on this machine (root): up, a job, down",
            "docs/ray_up_local.md",
            "",
        ),
    },
}
BENCHMARKS = {name: b for group in GROUPS.values() for name, b in group.items()}
# Imported by the benchmarks, not run: the process-tree watcher and the 0.5B shape's builder.
HELPERS = ("process_tree.py", "qwen05b_shape.py", "cli_runs.py", "pipeline_sim.py", "results_path.py", "run.py")


def command(name: str, args: list[str] | None = None) -> list[str]:
    b = BENCHMARKS[name]
    runner = ["bash"] if b.script.endswith(".sh") else [sys.executable]
    args = list(args or [])
    # trl_side_by_side.py's own default --out predates the results tree: give it the tree's name instead.
    if name == "trl_side_by_side" and not {"--out", "--no-write", "--report"} & {a.split("=")[0] for a in args}:
        args += ["--out", str(default_out(name).relative_to(ROOT))]
    return [*runner, str((HERE / b.script).relative_to(ROOT)), *args]


WIDTH = 118


def _command_lines(words: list[str], pad: str) -> list[str]:
    """A shell command over lines of at most WIDTH characters, continued with a backslash."""
    lines, line = [], pad + words[0]
    for w in words[1:]:
        if len(line) + 1 + len(w) > WIDTH - 2:
            lines.append(line + " \\")
            line = pad + "    " + w
        else:
            line += " " + w
    return [*lines, line]


def usage() -> str:
    lines = [
        "usage: python benchmarks/run.py NAME [ARGS...]     ARGS go to the benchmark; NAME --help: its own options",
        "       python benchmarks/run.py --list             the names only",
        "",
        textwrap.fill(
            "The maintained benchmarks, each backing a claim of the docs page in brackets. Results go to "
            "benchmarks/results/<benchmark>/<label>-<date>-<machine>.json (docs/benchmarks.md, 'Results'); "
            "probes that left the tree: docs/history/benchmark_scripts.md.",
            WIDTH,
        ),
    ]
    pad = " " * 24
    for group, items in GROUPS.items():
        lines += ["", group + ":"]
        for name, b in items.items():
            lines += textwrap.wrap(f"{b.what} [{b.doc}]", WIDTH, initial_indent=f"  {name:<22}", subsequent_indent=pad)
            lines += _command_lines(f"python benchmarks/run.py {name} {b.example}".split(), pad)
    lines += ["", "Helpers the benchmarks import (not run): " + ", ".join(HELPERS[:3]) + "."]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    if not argv or argv[0] in ("-h", "--help"):
        print(usage())
        return 0
    if argv[0] == "--list":
        print("\n".join(BENCHMARKS))
        return 0
    name, args = argv[0], argv[1:]
    if name not in BENCHMARKS:
        print(f"run.py: no benchmark {name!r}; one of: {', '.join(BENCHMARKS)}", file=sys.stderr)
        return 2
    cmd = command(name, args)
    print("+ " + " ".join(cmd), file=sys.stderr, flush=True)
    return subprocess.run(cmd, cwd=ROOT).returncode


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
