"""TRL 1.16 `GRPOTrainer` and agentrl_ray side by side, on identical work, in one invocation.

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/run.py against_trl --repeats 3      # 3 repeats x 2 tasks x 2 trainers, ~10 min on 2 idle cores
    python benchmarks/run.py against_trl --threads 1 --out /tmp/side_by_side-1thread.json
    python benchmarks/run.py against_trl --steps 3 --prompts 4 --group 4 --repeats 1 --no-write   # smoke run
    python benchmarks/run.py against_trl --report /tmp/side_by_side-1thread.json   # tables again, no runs
    python benchmarks/run.py against_trl --tasks gsm --warm runs/real_model/gsm_a/warm \
        --gsm-data runs/real_model/gsm_a/data --steps 6 --lr 1e-5 --bf16 1 --max-completion 192 --repeats 1 \
        --out benchmarks/results/trl_side_by_side/gsm-<date>-<machine>.json        # the real model (below)

CPU only: TRL generates with `transformers` (its vLLM modes do not run here, see docs/benchmarks.md); our side runs
`python -m agentrl_ray train examples/calculator/config.yaml` with overrides (vLLM CPU rollouts, Ray Train learner).
Both sides get the built-in model, the same arithmetic prompts in the same order, the same group size, prompts per
step, completion budget, learning rate, optimizer and clip settings, and the same number of steps, on two tasks:

- `single`: one assistant turn, no tool loop (ours: `rollout.max_turns=1`). Both prompts list the calculator in the
  system turn (the prompt ids are checked to be identical), so a tool call is possible but never executed: reward 0.
- `tool`: the calculator tool loop, up to 3 assistant turns (TRL: `environment_factory=CalculatorEnv`,
  `max_tool_calling_iterations=2`).

- `gsm` (not in the default `--tasks`): a real model, SmolLM2-135M-Instruct after the real_model benchmark's warm
  start (`--warm`), on examples/gsm_tools' chain_sum rows (`--gsm-data`, make_data.py's folder) with the calculator
  and the example's `rg_score`. Ours runs examples/gsm_tools/config.yaml. Both final models are evaluated by
  `agentrl-ray eval` on the same held-out rows (greedy pass@1, `--eval-prompts` of them).

Runs are interleaved (TRL, ours, TRL, ours, ...; the order flips every repeat) so machine noise hits both alike.
Each trainer runs as a subprocess whose whole process tree (Ray's processes and actors included) is sampled for
memory and CPU time. Step 1 (warm-up) and start-up are reported apart from the steady-state steps. Both final models
are then evaluated the same way, here, with `transformers` and our multi-turn loop (`run_episodes` of
the real_model benchmark's builtin_model_quality mode) scored by our `answer_match`. Prints markdown tables; writes
benchmarks/results/trl_side_by_side/<date>-<machine>.json (or --out).
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
from dataclasses import asdict, dataclass
from pathlib import Path

from results_path import ROOT, default_out, with_meta
from suite.common.process_tree import run_watched, window_cpu

TASKS = ("single", "tool", "gsm")
DEFAULT_TASKS = ("single", "tool")  # gsm needs a warm-started real model (--warm) and its data (--gsm-data)
GSM_CONFIG = ROOT / "examples" / "gsm_tools" / "config.yaml"
SIDES = ("trl", "ours")


@dataclass
class Settings:
    steps: int = 10
    prompts: int = 8
    group: int = 8
    max_completion: int = 64  # tokens per completion (TRL's max_completion_length; tool results count)
    max_turns: int = 3  # task tool
    lr: float = 1e-4
    micro_batch: int = 32
    seed: int = 0
    threads: int = 0  # torch threads on both sides (0 = every core: our default, and torch's)
    model: str = "tiny"  # what both sides train: built-in tiny (0.44M) or small (~25M), or qwen05b (0.5B shape)
    lora: int = 0  # 1: LoRA on both sides (our learner.lora defaults; TRL a PEFT LoraConfig of the same values)
    staleness: int = 1  # ours: sync.max_staleness (1 = roll out step t+1 while training on step t, our default)
    bf16: int = 0  # 1: bfloat16 math on both sides (TRL bf16=True; ours model.dtype=bfloat16 learner.bf16=true)
    compile: str = "auto"  # ours: learner.compile (auto, our default: compiled from 200M parameters; 1/0: on/off)
    ours_overrides: str = ""  # ours: more config overrides, space-separated (e.g. "learner.release_memory=false")
    repeats: int = 2
    eval_prompts: int = 200
    eval_samples: int = 2  # sampled completions per held-out prompt (plus one greedy)
    work_dir: str = str(ROOT / "runs" / "side_by_side")
    warm: str = ""  # task gsm: the warm-started HF model folder both sides start from
    gsm_data: str = ""  # task gsm: examples/gsm_tools/make_data.py's output folder (train.jsonl, eval.jsonl)


# ---------------------------------------------------------------------------------------------------- the two sides


def prompt_lengths(s: Settings, task: str = "tool") -> list[int]:
    """Prompt ids per prompt, step after step, as both sides build them (the TRL run checks they are identical)."""
    from suite.against_trl.trl_grpo_run import gsm_step_rows, step_rows
    from transformers import AutoTokenizer

    from agentrl_ray.builtin.model import calculator_tools

    tok = AutoTokenizer.from_pretrained(s.warm if task == "gsm" else model_path(s))
    tools = calculator_tools()
    if task == "gsm":
        rows = gsm_step_rows(Path(s.gsm_data) / "train.jsonl", s.steps, s.prompts, s.seed)
    else:
        rows = step_rows(s.steps, s.prompts, s.seed)
    return [
        len(tok.apply_chat_template(r["prompt"], tools=tools, add_generation_prompt=True, return_dict=False))
        for r in rows
    ]


def model_path(s: Settings) -> Path:
    if s.model == "qwen05b":
        from suite.learner.qwen05b_shape import ensure_qwen05b_shape

        return ensure_qwen05b_shape()
    from agentrl_ray.builtin.model import ensure_builtin_model

    return ensure_builtin_model(size=s.model)


def run_trl(s: Settings, task: str, rep: int) -> dict:
    out = Path(s.work_dir) / f"trl-{task}-r{rep}"
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    cmd = [sys.executable, str(ROOT / "benchmarks" / "against_trl.py"), "--mode", "trl_grpo_run"]
    cmd += ["--task", task, "--out", str(out)]
    cmd += ["--steps", str(s.steps), "--prompts", str(s.prompts), "--group", str(s.group), "--lr", str(s.lr)]
    cmd += [
        "--max-completion",
        str(s.max_completion),
        "--max-turns",
        str(s.max_turns if task in ("tool", "gsm") else 1),
    ]
    cmd += ["--micro-batch", str(s.micro_batch), "--seed", str(s.seed), "--threads", str(s.threads)]
    cmd += ["--model-size", s.model] + (["--bf16"] if s.bf16 else []) + (["--lora"] if s.lora else [])
    if task == "gsm":
        cmd += ["--model-path", s.warm, "--train-jsonl", str(Path(s.gsm_data) / "train.jsonl")]
    trace = run_watched(cmd, out / "steps.jsonl", out / "log.txt", ROOT)
    res = json.loads((out / "result.json").read_text())
    ends, rollouts = res["step_ends"], res["rollouts"]
    steps = [b - a for a, b in zip([res["train_begin"], *ends], ends)]
    return {
        **trace,
        "startup_s": res["train_begin"] - trace["t_start"],
        "step_s_all": steps,
        "rollout_s_all": [r["rollout_s"] for r in rollouts],
        "samples_all": [r["samples"] for r in rollouts],
        "sampled_tokens_all": [r["sampled_tokens"] for r in rollouts],
        "trained_tokens_all": [r["trained_tokens"] for r in rollouts],
        "train_reward_all": res["rewards"],
        "prompt_ids_identical": res["prompt_ids_identical"],
        "model": res["model"],
    }


def run_ours(s: Settings, task: str, rep: int, prompt_lens: list[int]) -> dict:
    name = f"ours-{task}-r{rep}"
    run_dir = Path(s.work_dir) / name
    shutil.rmtree(run_dir, ignore_errors=True)
    turns = s.max_turns if task in ("tool", "gsm") else 1
    config = GSM_CONFIG if task == "gsm" else ROOT / "examples/calculator/config.yaml"
    cmd = [sys.executable, "-m", "agentrl_ray", "train", str(config)]
    if task == "gsm":
        data = Path(s.gsm_data)
        # The held-out set is evaluate()'s, for both sides alike: our run's own final evaluation gets one row.
        cmd += [f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'eval.jsonl'}", "data.eval_size=1"]
    model = s.warm if task == "gsm" else model_path(s) if s.model == "qwen05b" else "builtin:" + s.model
    cmd += [
        f"rollout.group_size={s.group}",
        f"rollout.prompts_per_step={s.prompts}",
        f"rollout.max_turns={turns}",
        f"rollout.max_tokens_per_turn={min(s.max_completion, 64) if task == 'gsm' else s.max_completion}",
        # TRL caps prompt-free completion length; ours caps the whole sequence: prompts are 57-59 tokens.
        f"rollout.max_total_tokens={max(prompt_lens) + s.max_completion}",
        f"learner.lr={s.lr}",
        f"learner.micro_batch_size={s.micro_batch}",
        # TRL computes every row; a random model's rewards are all 0, so ours would compute none (round 17).
        "learner.skip_zero_gradient_rows=false",
        f"learner.torch_threads={s.threads}",
        f"rollout.num_threads={s.threads}",
        f"model.path={model}",
        f"learner.lora.enabled={'true' if s.lora else 'false'}",
        # A random 0.5B model's held-out evaluation means nothing and costs minutes: one prompt.
        *(["data.eval_size=1", "run.eval_samples=1"] if s.eval_prompts == 0 else []),
        f"sync.max_staleness={s.staleness}",
        f"learner.bf16={'true' if s.bf16 else 'false'}",
        f"model.dtype={'bfloat16' if s.bf16 else 'float32'}",
        f"learner.compile={s.compile}",
        f"run.steps={s.steps}",
        f"run.seed={s.seed}",
        f"run.name={name}",
        f"run.output_dir={s.work_dir}",
        "run.eval_every=0",
        "run.eval_at_start=false",
        "run.checkpoint_every=0",
        "run.plot=false",
        *s.ours_overrides.split(),
    ]
    run_dir.mkdir(parents=True)
    trace = run_watched(cmd, run_dir / "metrics.jsonl", Path(s.work_dir) / f"{name}.log", ROOT)
    records = [json.loads(x) for x in (run_dir / "metrics.jsonl").read_text().splitlines() if x.strip()]
    steps = [r for r in records if "time/step_s" in r]
    samples = [r["samples"] - p for r, p in zip(steps, [0] + [r["samples"] for r in steps])]
    per_step = s.prompts * s.group
    trained = [
        s.group * sum(prompt_lens[i * s.prompts : (i + 1) * s.prompts]) + n * r["rollout/mean_length"]
        for i, (r, n) in enumerate(zip(steps, samples))
    ]
    assert all(n == per_step for n in samples), samples
    first_end = trace["marks"][0]["time"]
    return {
        **trace,
        "startup_s": first_end - steps[0]["time/step_s"] - trace["t_start"],  # to within the 0.1 s file poll
        "step_s_all": [r["time/step_s"] for r in steps],
        "rollout_s_all": [r["time/rollout_s"] for r in steps],
        "samples_all": samples,
        "sampled_tokens_all": [r["rollout/sampled_tokens"] for r in steps],
        "trained_tokens_all": trained,
        "train_reward_all": [r["reward/mean"] for r in steps],
        "builtin_eval_success": steps[-1].get("eval/success"),
        "model": str(run_dir / f"checkpoint_{s.steps:06d}" / "model"),
    }


def steady_state(run: dict, s: Settings) -> tuple[dict, dict]:
    """Steady state = steps 2..N-1, timed alike on both sides: the wall time between the moments the watcher saw
    step 1 and step N-1 end. Step 1 is warm-up, and our step N also waits for the final held-out evaluation, so both
    stay out; what each trainer logs as its own step time (ours leaves out its per-step `ray.train.report`) is kept
    as `step_s_logged`. Also returns the CPU seconds per step of the busiest processes of the tree."""
    n = s.steps
    window = run["marks"][n - 2]["time"] - run["marks"][0]["time"]
    cpu = window_cpu(run["marks"], 0, n - 2)
    inner = slice(1, n - 1)
    return {
        "startup_s": run["startup_s"],
        "first_step_s": run["step_s_all"][0],
        "step_s": window / (n - 2),
        "step_s_logged": statistics.mean(run["step_s_all"][inner]),
        "step_s_sd": statistics.pstdev(run["step_s_all"][inner]),
        "rollout_s": statistics.mean(run["rollout_s_all"][inner]),
        "samples_per_s": sum(run["samples_all"][inner]) / window,
        "sampled_tokens_per_s": sum(run["sampled_tokens_all"][inner]) / window,
        "trained_tokens_per_s": sum(run["trained_tokens_all"][inner]) / window,
        "cpu_s_per_step": cpu["tree_cpu_s"] / (n - 2),
        # Everything the tree computed from its start to the end of step 1 (start-up and the first step): on a
        # machine of C cores, start-up cannot take less than this / C while every role competes for the cores.
        "cpu_s_to_first_step_end": sum(seconds for _, seconds in run["marks"][0]["cpu_s"].values()),
        "others_core_share": cpu["others_core_share"],
        "peak_rss_gib": run["peak_rss_gib"],
        "peak_pss_gib": run["peak_pss_gib"],
    }, {name: v / (n - 2) for name, v in list(cpu["by_process"].items())[:8]}


# ---------------------------------------------------------------------------------------------------- evaluation


class HFEngine:
    """`VLLMEngine.generate`'s interface on `transformers`: one evaluation path for both final models."""

    def __init__(self, model, pad_id: int) -> None:
        self.model, self.pad_id = model, pad_id

    def generate(self, prompts, max_tokens, *, temperature, top_p, stop_token_ids, seeds):
        import torch

        from agentrl_ray.rollout.engine import Generation

        torch.manual_seed(seeds[0])  # one stream per call: both models see the same random numbers
        width = max(map(len, prompts))
        ids = torch.full((len(prompts), width), self.pad_id)  # (B, T), left-padded
        mask = torch.zeros_like(ids)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        sample = {"do_sample": True, "temperature": temperature, "top_p": top_p, "top_k": 0} if temperature else {}
        with torch.no_grad():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=max(max_tokens),
                eos_token_id=stop_token_ids,
                pad_token_id=self.pad_id,
                **(sample or {"do_sample": False}),
            )
        gens = []
        for row, limit in zip(out[:, width:].tolist(), max_tokens):
            stop = next((i for i, t in enumerate(row) if t in stop_token_ids), None)
            if stop is not None and stop < limit:
                gens.append(Generation(row[: stop + 1], [], "stop"))
            else:
                gens.append(Generation(row[:limit], [], "length"))
        return gens


def evaluate_gsm(model_dir: str, s: Settings) -> dict:
    """Held-out greedy pass@1 of a final model on examples/gsm_tools' rows, by `agentrl-ray eval` (vLLM, our
    multi-turn loop, the example's reward), the same for both sides' models."""
    import subprocess

    data, out = Path(s.gsm_data), Path(model_dir).parent / "heldout"
    cmd = [str(Path(sys.executable).parent / "agentrl-ray"), "eval", "--config", str(GSM_CONFIG)]
    cmd += [f"model.path={model_dir}", f"data.train={data / 'train.jsonl'}", f"data.eval={data / 'eval.jsonl'}"]
    cmd += [f"data.eval_size={s.eval_prompts}", "--out", str(out)]
    subprocess.run(cmd, check=True, cwd=ROOT, capture_output=True, text=True)
    report = json.loads((out / "report.json").read_text())
    return {"success_greedy": report["pass@1"], "success_greedy_ci95": report["pass@1_ci95"]}


def evaluate(model_dir: str, task: str, s: Settings) -> dict:
    """Held-out success of a final model: sampled at T=1 (`eval_samples` per prompt) and greedy."""
    if task == "gsm":
        return evaluate_gsm(model_dir, s)
    import torch
    from suite.real_model.builtin_model_quality import run_episodes
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_ray.builtin.model import calculator_tools
    from agentrl_ray.chat_format import parse_tool_calls
    from agentrl_ray.envs.builtin.calculator import CalculatorEnv
    from agentrl_ray.rewards.builtin import answer_match
    from agentrl_ray.tasks.arithmetic import make_arithmetic_rows

    tok = AutoTokenizer.from_pretrained(model_dir)
    engine = HFEngine(AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval(), tok.pad_token_id)
    rows = make_arithmetic_rows(s.eval_prompts, s.seed, "eval")  # = our data.eval rows
    out = {}
    for name, temperature, reps in (("sampled", 1.0, s.eval_samples), ("greedy", 0.0, 1)):
        batch = [r for r in rows for _ in range(reps)]
        records = run_episodes(
            engine,
            tok,
            calculator_tools(),
            CalculatorEnv().calculator,
            batch,
            temperature=temperature,
            max_turns=s.max_turns if task == "tool" else 1,
            max_tokens=s.max_completion,
            seed=s.seed,
        )
        completions = [[{"role": "assistant", "content": t} for t in rec["turns"]] for rec in records]
        rewards = answer_match(completions, [r["answer"] for r in batch])
        out[f"success_{name}"] = sum(rewards) / len(rewards)
        # First turn asks for the tool (with one turn the call is never executed, so read it from the text).
        out[f"tool_call_rate_{name}"] = sum(bool(parse_tool_calls(r["turns"][0]).calls) for r in records) / len(records)
    return out


# ---------------------------------------------------------------------------------------------------- report

METRICS = [  # (key, label, format)
    ("startup_s", "start-up (s)", "{:.1f}"),
    ("first_step_s", "step 1, warm-up (s)", "{:.2f}"),
    ("step_s", "step, steady (s)", "{:.2f}"),
    ("step_s_logged", "step as the trainer logs it (s)", "{:.2f}"),
    ("rollout_s", "rollout part of a step (s)", "{:.2f}"),
    ("cpu_s_per_step", "CPU-seconds per step (tree)", "{:.2f}"),
    ("cpu_s_to_first_step_end", "CPU-seconds from start to the end of step 1 (tree)", "{:.1f}"),
    ("others_core_share", "cores kept busy by other work", "{:.0%}"),
    ("samples_per_s", "samples/s", "{:.1f}"),
    ("sampled_tokens_per_s", "sampled tokens/s", "{:.0f}"),
    ("trained_tokens_per_s", "trained tokens/s", "{:.0f}"),
    ("peak_rss_gib", "peak RSS, tree sum (GiB)", "{:.2f}"),
    ("peak_pss_gib", "peak PSS, tree sum (GiB)", "{:.2f}"),
    ("success_sampled", "held-out success, T=1", "{:.3f}"),
    ("success_greedy", "held-out success, greedy", "{:.3f}"),
]


# The least disturbed repeat of each side (fastest step, highest throughput): on a shared machine other work only
# ever slows a run down, so the best repeat is the closest to what each trainer costs by itself.
BEST = [
    ("step_s", "step, steady, best repeat (s)", "{:.2f}", min),
    ("samples_per_s", "samples/s, best repeat", "{:.1f}", max),
    ("sampled_tokens_per_s", "sampled tokens/s, best repeat", "{:.0f}", max),
    ("trained_tokens_per_s", "trained tokens/s, best repeat", "{:.0f}", max),
]


def summarize(runs: list[dict]) -> dict:
    """Per task and metric: each side's mean, and the ratio ours/TRL per repeat (paired): mean, median, min, max."""
    out: dict = {}
    for task in TASKS:
        pairs: dict[int, dict] = {}
        for r in runs:
            if r["task"] == task:
                pairs.setdefault(r["repeat"], {})[r["side"]] = r["metrics"]
        pairs = {k: v for k, v in pairs.items() if len(v) == 2}
        if not pairs:
            continue
        rows = {}
        for key, _, _ in METRICS:
            vals = {side: [p[side][key] for p in pairs.values() if p[side].get(key) is not None] for side in SIDES}
            ratios = [
                p["ours"][key] / p["trl"][key] for p in pairs.values() if p["ours"].get(key) and p["trl"].get(key)
            ]
            if key == "others_core_share":
                ratios = []  # a property of the machine's other load, not of either trainer
            rows[key] = {
                **{side: statistics.mean(v) if v else None for side, v in vals.items()},
                "ratio_mean": statistics.mean(ratios) if ratios else None,
                "ratio_median": statistics.median(ratios) if ratios else None,
                "ratio_min": min(ratios) if ratios else None,
                "ratio_max": max(ratios) if ratios else None,
            }
        for key, _, _, pick in BEST:
            best = {side: pick(p[side][key] for p in pairs.values()) for side in SIDES}
            rows[f"best_{key}"] = {**best, "ratio_mean": best["ours"] / best["trl"], "ratio_min": None}
        out[task] = rows
    return out


def markdown(summary: dict) -> str:
    fmt = lambda f, v: "-" if v is None else f.format(v)  # noqa: E731
    lines = []
    for task, rows in summary.items():
        head = "| | TRL | ours | ours/TRL: mean, median (min-max) |"
        lines += [f"\n**Task `{task}`**\n", head, "|---|---:|---:|---:|"]
        for key, label, f in METRICS + [(f"best_{k}", label, f) for k, label, f, _ in BEST]:
            r = rows[key]
            ratio = "-" if r["ratio_mean"] is None else f"{r['ratio_mean']:.2f}"
            if r["ratio_min"] is not None:
                ratio += f", {r['ratio_median']:.2f} ({r['ratio_min']:.2f}-{r['ratio_max']:.2f})"
            lines.append(f"| {label} | {fmt(f, r['trl'])} | {fmt(f, r['ours'])} | {ratio} |")
    return "\n".join(lines)


def report(path: Path) -> None:
    """Tables from the raw traces of an earlier invocation (held-out results are kept as they were measured)."""
    data = json.loads(path.read_text())
    s = Settings(**data["settings"])
    for run in data["runs"]:
        steady, run["raw"]["cpu_s_per_step_by_process"] = steady_state(run["raw"], s)
        run["metrics"].update(steady)
    data["summary"] = summarize(data["runs"])
    print(markdown(data["summary"]))
    path.write_text(json.dumps(data, indent=2))


def one_line(summary: dict) -> str:
    """The result in a line, for its meta: per task, ours against TRL's samples/s, start-up and peak RSS."""

    def ratio(rows: dict, key: str) -> str:
        return "-" if rows[key]["ratio_mean"] is None else f"{rows[key]['ratio_mean']:.2f}x"

    parts = [
        f"{task}: samples/s {ratio(r, 'samples_per_s')}, start-up {ratio(r, 'startup_s')}, "
        f"peak RSS {ratio(r, 'peak_rss_gib')}"
        for task, r in summary.items()
    ]
    return "ours/TRL, " + ("; ".join(parts) if parts else "no pair of sides run")


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    d = Settings()
    for field, value in asdict(d).items():
        p.add_argument("--" + field.replace("_", "-"), type=type(value), default=value)
    p.add_argument("--tasks", nargs="+", choices=TASKS, default=list(DEFAULT_TASKS))
    p.add_argument("--out", type=Path, default=default_out("trl_side_by_side"))
    p.add_argument("--no-write", action="store_true", help="do not write --out")
    p.add_argument("--report", type=Path, help="recompute the tables from a JSON this script wrote; run nothing")
    p.add_argument("--sides", nargs="+", choices=SIDES, default=list(SIDES), help="which trainers to run")
    p.add_argument(
        "--reuse",
        type=Path,
        help="a JSON of this script with the same settings (our-side-only ones aside): its runs of the sides not "
        "run now join the tables (e.g. TRL's 0.5B runs, ~30 min, against a change on our side)",
    )
    args = p.parse_args(argv)
    if args.report:
        return report(args.report)
    if args.steps < 3:
        p.error("--steps must be at least 3 (step 1 is warm-up, the last step waits for our final evaluation)")
    s = Settings(**{k: getattr(args, k) for k in asdict(d)})
    Path(s.work_dir).mkdir(parents=True, exist_ok=True)
    if "gsm" in args.tasks and not (s.warm and s.gsm_data):
        p.error("--tasks gsm needs --warm (the warm-started model folder) and --gsm-data (its data folder)")
    lens = {task: prompt_lengths(s, task) for task in args.tasks}
    runs = []
    if args.reuse:
        before = json.loads(args.reuse.read_text())
        # What may differ: our side's own settings, the number of repeats run now, and the micro-batch (memory only:
        # the loss is a token mean over the step's whole batch however it is split); the reused runs keep their own
        # settings in their record.
        free = {"staleness", "work_dir", "micro_batch", "compile", "ours_overrides", "repeats"}
        differ = {k for k, v in asdict(s).items() if k not in free and before["settings"].get(k) != v}
        if differ:
            p.error(f"--reuse {args.reuse}: settings differ ({', '.join(sorted(differ))})")
        runs = [
            {**r, "reused_from": str(args.reuse), "settings": before["settings"]}
            for r in before["runs"]
            if r["side"] not in args.sides and r["task"] in args.tasks
        ]
    dest = None if args.no_write else args.out
    for rep in range(s.repeats):
        for task in args.tasks:
            for side in [x for x in (SIDES if rep % 2 == 0 else SIDES[::-1]) if x in args.sides]:
                print(f"repeat {rep} task {task}: {side} ...", flush=True)
                runs.append(measure(s, task, rep, side, lens[task]))
                if dest:  # after every run: a later failure keeps what was measured
                    partial = {"settings": asdict(s), "runs": runs}
                    dest.write_text(json.dumps(with_meta(partial, f"{len(runs)} runs so far"), indent=2))
    summary = summarize(runs)
    print(markdown(summary))
    if dest:
        result = {"settings": asdict(s), "summary": summary, "runs": runs}
        dest.write_text(json.dumps(with_meta(result, one_line(summary)), indent=2))
        print(f"wrote {dest}")


def measure(s: Settings, task: str, rep: int, side: str, prompt_lens: list[int]) -> dict:
    """One run and the evaluation of its final model. Retried once: on a shared machine another user's
    `ray stop --force` kills every Ray process, ours included."""
    for attempt in (1, 2):
        try:
            raw = run_trl(s, task, rep) if side == "trl" else run_ours(s, task, rep, prompt_lens)
            break
        except RuntimeError as e:
            if attempt == 2:
                raise
            print(f"  failed ({e}); retrying once", flush=True)
    raw["attempts"] = attempt
    steady, raw["cpu_s_per_step_by_process"] = steady_state(raw, s)
    metrics = {**steady, **(evaluate(raw["model"], task, s) if s.eval_prompts else {})}
    print(f"  {json.dumps({k: round(v, 3) for k, v in metrics.items() if isinstance(v, int | float)})}", flush=True)
    print(f"  CPU s/step: {json.dumps({k: round(v, 3) for k, v in raw['cpu_s_per_step_by_process'].items()})}")
    return {"task": task, "repeat": rep, "side": side, "metrics": metrics, "raw": raw}
