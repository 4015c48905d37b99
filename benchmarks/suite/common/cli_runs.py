"""One training run through the installed CLI, as a user types it, for the modes that compare whole runs
(`integrity_cost`, `pipeline_timeline`): `agentrl-ray train CONFIG OVERRIDES...` in a fresh output folder, its
metrics.jsonl records returned."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from results_path import ROOT, default_out, with_meta


def train_records(config: str, overrides: list[str], ray_address: str | None = None) -> list[dict]:
    """Every metrics.jsonl record of the run (step 0, an evaluation at the start, included if the run writes it).
    With `ray_address` the run joins that Ray cluster (RAY_ADDRESS) instead of starting a local Ray."""
    out = Path(tempfile.mkdtemp(prefix="agentrl-bench-"))
    cmd = [str(Path(sys.executable).parent / "agentrl-ray"), "train", config, *overrides, f"run.output_dir={out}"]
    env = {**os.environ, "AGENTRL_CACHE": os.environ.get("AGENTRL_CACHE", str(ROOT / ".cache" / "agentrl_ray"))}
    if ray_address:
        env["RAY_ADDRESS"] = ray_address
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=ROOT)
    (metrics,) = out.glob("*/metrics.jsonl")
    return [json.loads(line) for line in metrics.read_text().splitlines()]


def write_result(benchmark: str, config: str, out: str | None, result: dict, summary: str) -> Path:
    """`result` and its meta as JSON at `out`, else at the results tree's name for `benchmark`, labelled by the
    config's folder."""
    path = Path(out) if out else default_out(benchmark, label=Path(config).parent.name)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(with_meta(result, summary), indent=1) + "\n")
    print(f"wrote {path}")
    return path
