"""One TRL `GRPOTrainer` run on the built-in model and arithmetic task, timed step by step (TRL's side of the
trl_side_by_side mode, which starts this mode as a subprocess and watches its memory).

    export AGENTRL_CACHE=$PWD/.cache/agentrl_ray
    python benchmarks/run.py against_trl --mode trl_grpo_run --task tool --steps 3 --prompts 4 --group 4 \
        --out /tmp/trl-run
    python benchmarks/run.py against_trl --mode trl_grpo_run --task single --steps 3 --prompts 4 --group 4 \
        --out /tmp/trl-run
    python benchmarks/run.py against_trl --mode trl_grpo_run --task gsm --model-path runs/real_model/gsm_a/warm \
        --train-jsonl runs/real_model/gsm_a/data/train.jsonl --steps 3 --prompts 4 --group 4 --out /tmp/trl-run

CPU only (`use_cpu=True`, generation through `transformers`; see docs/benchmarks.md for why TRL's vLLM modes do not
run here). The run sees exactly our side's prompts, in our side's order: the dataset holds the rows that
`agentrl_ray.learner.feed.PromptSampler` draws for steps 0..N-1, and TRL's shuffling is off.

- task `single`: the prompt is the rendered chat-template text (calculator listed in the system turn, like ours),
  given as a plain string, so TRL runs no tool machinery at all; one assistant turn is sampled.
- task `tool`: conversational prompts with `environment_factory=CalculatorEnv` (our env class); TRL renders the
  system turn from the env's method, executes calls, and allows `max_turns - 1` tool rounds.
- task `gsm`: a real model (`--model-path`, an HF folder: SmolLM2-135M-Instruct warm-started by
  the real_model benchmark) on examples/gsm_tools' rows (`--train-jsonl`, drawn as our learner draws them under
  that example's config), the calculator as in `tool`, and the example's reward (`rg_score`).

Writes `<out>/result.json` (absolute timestamps of train begin and of each step end, per-step rollout time and token
counts) and the final model to `<out>/model`; `<out>/steps.jsonl` gets a line as each step ends.
"""

from __future__ import annotations

import argparse
import json
import os
import time
from pathlib import Path

from results_path import ROOT, with_meta

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # environment_factory is marked experimental
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


# TRL's generation backends, as GRPOConfig fields.
GENERATION = {
    "transformers": {},
    "continuous_batching": {"use_transformers_continuous_batching": True},
    "vllm_colocate": {"use_vllm": True, "vllm_mode": "colocate", "vllm_gpu_memory_utilization": 0.1},
    "vllm_server": {"use_vllm": True, "vllm_mode": "server", "vllm_server_timeout": 30},
}


def parse_args(argv: list[str], prog: str) -> argparse.Namespace:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--task", choices=["single", "tool", "gsm"], required=True)
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--prompts", type=int, required=True, help="prompts per step")
    p.add_argument("--group", type=int, required=True, help="completions per prompt")
    p.add_argument("--max-completion", type=int, default=64, help="tokens per completion, tool results included")
    p.add_argument("--max-turns", type=int, default=3, help="task tool: assistant turns (tool rounds + 1)")
    p.add_argument("--lr", type=float, default=1e-4)
    p.add_argument("--micro-batch", type=int, default=32)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=0, help="torch threads (0 = every core, like our side's default)")
    p.add_argument(
        "--generation",
        choices=list(GENERATION),
        default="transformers",
        help="TRL's generation backend (only `transformers` and `continuous_batching` run on this CPU machine)",
    )
    p.add_argument("--bf16", action="store_true", help="bfloat16 autocast (TRL's default; ours: learner.bf16)")
    p.add_argument(
        "--model-size",
        choices=["tiny", "small", "qwen05b"],
        default="tiny",
        help="the built-in model to train, or qwen05b: the learner benchmark's qwen05b_shape (Qwen2.5-0.5B's shape)",
    )
    p.add_argument("--lora", action="store_true", help="PEFT LoRA with our learner.lora defaults (r, alpha, targets)")
    p.add_argument("--model-path", type=Path, help="task gsm: the HF model folder to train")
    p.add_argument("--train-jsonl", type=Path, help="task gsm: examples/gsm_tools/make_data.py's train.jsonl")
    p.add_argument("--out", type=Path, required=True)
    return p.parse_args(argv)


def step_rows(steps: int, per_step: int, seed: int) -> list[dict]:
    """The prompts our learner draws for steps 0..steps-1, in order (same train rows, same sampler)."""
    from agentrl_ray.learner.feed import PromptSampler
    from agentrl_ray.tasks.arithmetic import make_arithmetic_rows

    sampler = PromptSampler(make_arithmetic_rows(4000, seed, "train"), per_step, seed)  # data.train_size=4000
    return [row for s in range(steps) for row in sampler.for_step(s)]


GSM_CONFIG = ROOT / "examples" / "gsm_tools" / "config.yaml"


def gsm_step_rows(train_jsonl: Path, steps: int, per_step: int, seed: int) -> list[dict]:
    """examples/gsm_tools' prompts for steps 0..steps-1 as our learner draws them (its data.train_size rows)."""
    from agentrl_ray.data import load_rows
    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.feed import PromptSampler

    cfg = load_config(GSM_CONFIG, ["profile=cpu", f"data.train={train_jsonl}"]).data
    rows = load_rows(str(train_jsonl), cfg, split="train", size=cfg.train_size)
    sampler = PromptSampler(rows, per_step, seed)
    return [row for s in range(steps) for row in sampler.for_step(s)]


def same_schema_calculator_env():
    """CalculatorEnv as TRL's environment_factory, its tool's schema exactly ours: TRL (transformers'
    `get_json_schema`) adds `"return": {"type": "string"}` for the method's return annotation, which our schemas
    leave out. A template that renders the whole schema (SmolLM2's, from builtin/chat_template.py) would then show
    TRL's side another prompt than the one the warm start was trained on."""
    from agentrl_ray.envs.builtin.calculator import CalculatorEnv

    class SameSchemaCalculatorEnv(CalculatorEnv):
        def calculator(self, expression: str):  # noqa: ANN201 - no return annotation: see above
            return super().calculator(expression)

    SameSchemaCalculatorEnv.calculator.__doc__ = CalculatorEnv.calculator.__doc__
    return SameSchemaCalculatorEnv


def decoded_answer_match(tokenizer):
    """Our `answer_match` on the completion decoded with special tokens kept, as our rollout decodes it.

    TRL hands plain-string completions over with special tokens stripped, which would turn a `<tool_call>` block into
    bare JSON whose last number `answer_match` might read as an answer.
    """
    from agentrl_ray.rewards.builtin import answer_match

    def reward(completions, completion_ids, answer, **kwargs):
        eos = tokenizer.eos_token
        texts = [tokenizer.decode(ids, skip_special_tokens=False).removesuffix(eos) for ids in completion_ids]
        return answer_match(texts, answer)

    reward.__name__ = "answer_match"
    return reward


def timed_trainer_class():
    """GRPOTrainer that records, per generation batch, its wall time and the tokens it produced."""
    from trl import GRPOTrainer

    class TimedGRPOTrainer(GRPOTrainer):
        rollouts: list[dict] = []

        def _generate_and_score_completions(self, inputs):
            t0 = time.perf_counter()
            out = super()._generate_and_score_completions(inputs)
            completion = out["completion_mask"]  # (B, C): 1 on completion tokens, tool results included
            sampled = completion * out["tool_mask"] if "tool_mask" in out else completion
            self.rollouts.append(
                {
                    "rollout_s": time.perf_counter() - t0,
                    "samples": int(completion.shape[0]),
                    "sampled_tokens": int(sampled.sum()),
                    "trained_tokens": int(out["prompt_mask"].sum() + completion.sum()),
                }
            )
            return out

    return TimedGRPOTrainer


def step_clock(progress: Path):
    """Wall-clock timestamps of train begin and of every optimizer step's end; each step end is also appended to
    `progress` at once, so the parent can read the process tree's CPU time at step boundaries."""
    from transformers import TrainerCallback

    class StepClock(TrainerCallback):
        def __init__(self) -> None:
            self.train_begin = 0.0
            self.step_ends: list[float] = []
            self.rewards: list[float] = []

        def on_train_begin(self, args, state, control, **kwargs):
            self.train_begin = time.time()

        def on_step_end(self, args, state, control, **kwargs):
            self.step_ends.append(time.time())
            with progress.open("a") as f:
                f.write(json.dumps({"step": state.global_step, "time": self.step_ends[-1]}) + "\n")

        def on_log(self, args, state, control, logs=None, **kwargs):
            if logs and "reward" in logs:
                self.rewards.append(float(logs["reward"]))

    return StepClock()


def build_trainer(args: argparse.Namespace, model_path: Path, clock):
    import torch
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, AutoTokenizer
    from trl import GRPOConfig
    from trl.chat_template_utils import qwen3_template

    from agentrl_ray.builtin.model import calculator_tools
    from agentrl_ray.envs.builtin.calculator import CalculatorEnv
    from agentrl_ray.rewards.builtin import answer_match

    torch.set_num_threads(args.threads or os.cpu_count() or 1)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    # Our template is not one TRL recognises; its tool calls are Qwen/hermes blocks, which this parser reads.
    tokenizer.response_template = qwen3_template
    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32)
    if args.task == "gsm":
        rows = gsm_step_rows(args.train_jsonl, args.steps, args.prompts, args.seed)
    else:
        rows = step_rows(args.steps, args.prompts, args.seed)
    extra: dict = {}
    if args.task == "gsm":
        from agentrl_ray.infra.user_code import add_user_code_paths
        from agentrl_ray.rewards import load_reward_functions

        extra = {"environment_factory": same_schema_calculator_env()}
        # resolved as our side resolves the config's reward.functions (the working directory, the config's folder)
        add_user_code_paths(GSM_CONFIG)
        [reward] = load_reward_functions(["examples.gsm_tools.reward:rg_score"])
    elif args.task == "single":
        tools = calculator_tools()
        for row in rows:
            row["prompt"] = tokenizer.apply_chat_template(
                row["prompt"], tools=tools, add_generation_prompt=True, tokenize=False
            )
        reward = decoded_answer_match(tokenizer)
    else:
        extra = {"environment_factory": CalculatorEnv}
        reward = answer_match
    samples = args.prompts * args.group
    micro = min(args.micro_batch, samples)
    config = GRPOConfig(
        output_dir=str(args.out / "trainer"),
        use_cpu=True,
        bf16=args.bf16,  # both sides: float32 (default) or bfloat16 autocast with float32 weights (--bf16)
        gradient_checkpointing=False,  # TRL defaults to True (a second forward); off as on our side: the same work
        per_device_train_batch_size=micro,
        gradient_accumulation_steps=samples // micro,  # one optimizer step per generation batch (on-policy)
        num_generations=args.group,
        max_completion_length=args.max_completion,
        max_tool_calling_iterations=args.max_turns - 1,
        shuffle_dataset=False,
        max_steps=args.steps,
        learning_rate=args.lr,
        lr_scheduler_type="constant",
        warmup_steps=0,
        adam_beta1=0.9,
        adam_beta2=0.99,
        weight_decay=0.0,
        max_grad_norm=1.0,
        beta=0.0,
        epsilon=0.2,
        epsilon_high=0.28,
        loss_type="dapo",  # token mean over the whole batch = our algorithm.loss_aggregation=token_mean
        temperature=1.0,
        top_p=1.0,
        seed=args.seed,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        disable_tqdm=True,
        dataloader_num_workers=0,
        **GENERATION[args.generation],
    )
    if args.lora:
        from peft import LoraConfig

        from agentrl_ray.config import LoraConfig as OurLora

        ours = OurLora()
        extra["peft_config"] = LoraConfig(
            r=ours.r, lora_alpha=ours.alpha, lora_dropout=ours.dropout, target_modules=ours.target_modules
        )
    trainer = timed_trainer_class()(
        model=model,
        reward_funcs=[reward],
        args=config,
        train_dataset=Dataset.from_list(rows),
        processing_class=tokenizer,
        callbacks=[clock],
        **extra,
    )
    return trainer, tokenizer, rows


def prompt_ids_match_ours(trainer, tokenizer, rows, task: str) -> bool:
    """Does TRL build the same prompt ids as our rollout worker (`RolloutWorker._prompt_ids`) for the first row?"""
    from agentrl_ray.builtin.model import calculator_tools
    from agentrl_ray.tasks.arithmetic import make_arithmetic_rows

    if task == "gsm":
        first = rows[0]
    else:
        first = next(r for r in make_arithmetic_rows(4000, 0, "train") if r["id"] == rows[0]["id"])
    ours = tokenizer.apply_chat_template(
        first["prompt"], tools=calculator_tools(), add_generation_prompt=True, tokenize=True, return_dict=False
    )
    if task == "single":
        theirs = tokenizer(text=rows[0]["prompt"])["input_ids"]
    else:
        trainer._batch_environments = [None]
        theirs = trainer._tokenize_prompts([rows[0]["prompt"]])[0][0]
    return list(theirs) == list(ours)


def main(argv: list[str], prog: str) -> None:
    args = parse_args(argv, prog)
    from agentrl_ray.builtin.model import ensure_builtin_model

    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "steps.jsonl").unlink(missing_ok=True)
    clock = step_clock(args.out / "steps.jsonl")
    if args.task == "gsm":
        if not (args.model_path and args.train_jsonl):
            raise SystemExit("--task gsm needs --model-path and --train-jsonl")
        model_path = args.model_path
    elif args.model_size == "qwen05b":
        from suite.learner.qwen05b_shape import ensure_qwen05b_shape

        model_path = ensure_qwen05b_shape()
    else:
        model_path = ensure_builtin_model(size=args.model_size)
    trainer, tokenizer, rows = build_trainer(args, model_path, clock)
    same_prompt = prompt_ids_match_ours(trainer, tokenizer, rows, args.task)
    trainer.train()
    trainer.save_model(str(args.out / "model"))
    tokenizer.save_pretrained(str(args.out / "model"))
    result = {
        "train_begin": clock.train_begin,
        "step_ends": clock.step_ends,
        "rollouts": trainer.rollouts,
        "rewards": clock.rewards,
        "prompt_ids_identical": same_prompt,
        "model": str(args.out / "model"),
    }
    train_s = clock.step_ends[-1] - clock.train_begin if clock.step_ends else 0.0
    summary = f"TRL GRPOTrainer, task {args.task}: {len(clock.step_ends)} steps in {train_s:.1f} s of training"
    (args.out / "result.json").write_text(json.dumps(with_meta(result, summary), indent=2))
