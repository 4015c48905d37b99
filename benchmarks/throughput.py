"""Throughput of a training run: samples/s, sampled tokens/s and the per-phase split of a step.

    python benchmarks/throughput.py                          # runs the default config for 8 steps, then reports
    python benchmarks/throughput.py --run-dir runs/calculator   # reports on an existing run's metrics.jsonl
    python benchmarks/throughput.py --steps 12 -- rollout.group_size=4   # extra overrides after --

The first step is reported separately (engine warm-up); the rest are averaged. Results are printed and written to
docs/benchmarks/throughput-<run name>.json.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PHASES = ["generate_s", "env_s", "reward_s", "learner_s", "sync_s"]


def summarize(run_dir: Path) -> dict:
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if "time/step_s" in r]
    if len(steps) < 2:
        raise SystemExit(f"{run_dir} has {len(steps)} training steps; need at least 2")
    warm = steps[1:]
    step_s = statistics.mean(r["time/step_s"] for r in warm)
    samples = statistics.mean(r["samples"] - p["samples"] for p, r in zip(steps, steps[1:]))
    tokens = statistics.mean(r["rollout/sampled_tokens"] for r in warm)
    out = {
        "run_dir": str(run_dir),
        "steps_measured": len(warm),
        "first_step_s": steps[0]["time/step_s"],
        "step_s": step_s,
        "step_s_stdev": statistics.pstdev(r["time/step_s"] for r in warm),
        "samples_per_s": samples / step_s,
        "sampled_tokens_per_s": tokens / step_s,
        "phase_s": {p: statistics.mean(r[f"time/{p}"] for r in warm) for p in PHASES},
    }
    accounted = sum(out["phase_s"].values())
    out["phase_s"]["other_s"] = max(0.0, step_s - accounted)
    out["phase_fraction"] = {k: v / step_s for k, v in out["phase_s"].items()}
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--run-dir", type=Path)
    p.add_argument("--steps", type=int, default=8)
    p.add_argument("--config", default=str(ROOT / "examples/calculator/config.yaml"))
    p.add_argument("overrides", nargs="*")
    args = p.parse_args()
    run_dir = args.run_dir
    if run_dir is None:
        out = ROOT / "runs" / "bench"
        cmd = [
            sys.executable,
            "-m",
            "agentrl_ray",
            "train",
            args.config,
            f"run.steps={args.steps}",
            "run.name=throughput",
            f"run.output_dir={out}",
            "run.eval_every=0",
            "run.eval_at_start=false",
            "run.checkpoint_every=0",
            *args.overrides,
        ]
        if (out / "throughput").exists():
            import shutil

            shutil.rmtree(out / "throughput")
        subprocess.run(cmd, check=True)
        run_dir = out / "throughput"
    result = summarize(run_dir)
    print(f"samples/s        {result['samples_per_s']:.2f}")
    print(f"sampled tokens/s {result['sampled_tokens_per_s']:.1f}")
    print(
        f"step             {result['step_s']:.2f} s (± {result['step_s_stdev']:.2f}), first step "
        f"{result['first_step_s']:.2f} s"
    )
    for k, v in result["phase_s"].items():
        print(f"  {k:<12} {v:7.2f} s  {100 * result['phase_fraction'][k]:5.1f}%")
    dest = ROOT / "docs" / "benchmarks" / f"throughput-{run_dir.name}.json"
    dest.parent.mkdir(parents=True, exist_ok=True)
    dest.write_text(json.dumps(result, indent=2))


if __name__ == "__main__":
    main()
