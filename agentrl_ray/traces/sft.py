"""Supervised warm start of any causal LM on trace conversations, with TRL's SFTTrainer (CPU or GPU).

    agentrl-ray sft runs/calculator/rollouts --model builtin:tiny --out runs/sft-tiny
    agentrl-ray sft my_sft_dataset/ --model /models/Qwen2.5-0.5B-Instruct --epochs 2 --lr 1e-5

The source is an SFT dataset saved by `agentrl-ray traces convert --format sft`, or trace files (.jsonl, a run dir)
whose successful trajectories are taken. Each conversation is split at its first assistant message into prompt and
completion, so the loss covers the completion only (TRL's prompt-completion mode): the model learns the calls, the
answers and, like the ECHO loss, the tool results that sit between them. The result is a model folder (weights and
tokenizer) that `model.path` accepts.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from agentrl_ray.builtin.resolve import resolve_model
from agentrl_ray.config import ConfigError

log = logging.getLogger(__name__)


@dataclass
class SFTOptions:
    epochs: float = 2.0
    lr: float = 5e-4
    batch_size: int = 16
    max_length: int = 512
    threshold: float = 1.0  # success threshold when the source is trace files
    use_gpu: bool = False
    seed: int = 0
    bf16: bool | None = None  # bfloat16 autocast; None: where the CPU computes it natively (or on a GPU)


def native_bf16() -> bool:
    """Whether this CPU computes bfloat16 matmuls natively (AVX512_BF16 or AMX): a forward and backward of
    SmolLM2-135M over 8 x 400 tokens took 12 s under bf16 autocast against 51-65 s in float32 on a 2-core AMD EPYC
    (family 26 model 2; docs/real_model.md)."""
    from agentrl_ray.infra.hardware import this_cpu

    return this_cpu().bf16


@contextlib.contextmanager
def completion_positions_only() -> Iterator[None]:
    """Score only the completion's positions through TRL's fused LM head, on every device.

    TRL 1.16's fused head scores every position off CUDA/XPU (so that tile shapes stay fixed for compilers such as
    Neuron's) and masks the prompt's afterwards; the choice is the module-level `_use_triton` it imported. Eager CPU
    has no such constraint, and a tool prompt is most of each row: on BFCL's SFT rows (SmolLM2-135M, bf16, 8 rows a
    step) scoring only the labelled positions halved the step on a 2-core AMD EPYC with the same loss to the last
    digit (docs/real_model.md). The name is restored on exit.
    """
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:  # another TRL: leave its head as it is
        yield
        return
    trl_utils._use_triton = lambda device: True
    try:
        yield
    finally:
        trl_utils._use_triton = original


def load_sft_rows(source: str, threshold: float = 1.0) -> list[dict[str, Any]]:
    """`messages` + `tools` rows from a saved SFT dataset or from trace files."""
    path = Path(source).expanduser()
    if (path / "dataset_info.json").exists():
        from datasets import load_from_disk

        ds = load_from_disk(str(path))
        if "messages" not in ds.column_names:
            raise ValueError(f"{source}: an SFT dataset needs a 'messages' column, has {ds.column_names}")
        return [dict(r) for r in ds]
    from agentrl_ray.traces.convert import sft_rows
    from agentrl_ray.traces.records import read_records

    return sft_rows(read_records(path), threshold)


def prompt_completion(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Split each conversation at its first assistant message (completion-only loss); drop Arrow's null fields."""
    out = []
    for i, row in enumerate(rows):
        messages = [{k: v for k, v in m.items() if v is not None} for m in row["messages"]]
        first = next((j for j, m in enumerate(messages) if m["role"] == "assistant"), None)
        if not first:
            raise ValueError(f"SFT row {i}: needs a prompt before its first assistant message")
        out.append({"prompt": messages[:first], "completion": messages[first:], "tools": row.get("tools") or "[]"})
    return out


def tokenized(tokenizer, rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """`input_ids` and `completion_mask` of each prompt-completion row, as TRL's SFTTrainer would tokenize it.

    Done here, before the rows become an Arrow dataset: Arrow gives every message every key of the column (a null
    `tool_calls` on a plain answer), and Llama 3's template reads a `tool_calls` key as a call, whatever its value.
    The completion starts where the prompt's rendering (with the generation prompt) and the whole one diverge.
    """
    out = []
    for row in rows:
        tools = json.loads(row["tools"]) if isinstance(row["tools"], str) else row["tools"]
        prompt = tokenizer.apply_chat_template(
            row["prompt"], tools=tools, add_generation_prompt=True, return_dict=False
        )
        ids = tokenizer.apply_chat_template(row["prompt"] + row["completion"], tools=tools, return_dict=False)
        n = next((i for i, (a, b) in enumerate(zip(prompt, ids)) if a != b), min(len(prompt), len(ids)))
        out.append({"input_ids": ids, "completion_mask": [0] * n + [1] * (len(ids) - n)})
    return out


def run_sft(source: str, model: str, out_dir: str, opts: SFTOptions) -> dict[str, Any]:
    """Train, save the model and tokenizer to `out_dir`, and return a summary (rows, steps, final loss)."""
    from datasets import Dataset
    from transformers import AutoTokenizer
    from trl import SFTConfig, SFTTrainer

    try:  # the user's files first: a bad line fails before the model loads
        rows = prompt_completion(load_sft_rows(source, opts.threshold))
    except ValueError as e:
        raise ConfigError(str(e)) from e
    model_path = resolve_model(model)
    tokenizer = AutoTokenizer.from_pretrained(model_path)
    bf16 = (opts.use_gpu or native_bf16()) if opts.bf16 is None else opts.bf16
    args = SFTConfig(
        output_dir=str(Path(out_dir) / "trainer"),
        num_train_epochs=opts.epochs,
        learning_rate=opts.lr,
        per_device_train_batch_size=opts.batch_size,
        max_length=opts.max_length,
        use_cpu=not opts.use_gpu,
        bf16=bf16,
        # TRL turns it on by default; the small models this warm-starts fit without it, and it costs a forward.
        gradient_checkpointing=False,
        report_to="none",
        save_strategy="no",
        logging_steps=10,
        seed=opts.seed,
        lr_scheduler_type="cosine",
        warmup_steps=5,
    )
    trainer = SFTTrainer(
        model=model_path,
        args=args,
        train_dataset=Dataset.from_list(tokenized(tokenizer, rows)),
        processing_class=tokenizer,
    )
    with completion_positions_only():
        result = trainer.train()
    trainer.save_model(out_dir)
    tokenizer.save_pretrained(out_dir)
    summary = {
        "model": model_path,
        "out": str(Path(out_dir).resolve()),
        "rows": len(rows),
        "steps": result.global_step,
        "train_loss": round(result.training_loss, 4),
        "bf16": bf16,
        "seconds": round(result.metrics.get("train_runtime", 0.0), 1),
    }
    (Path(out_dir) / "sft_summary.json").write_text(json.dumps(summary, indent=2))
    return summary


def add_parser(sub) -> None:
    sft = sub.add_parser("sft", help="supervised warm start of a model on trace conversations (TRL's SFTTrainer)")
    sft.add_argument("source", help="an SFT dataset folder, or trace files (their successful trajectories)")
    sft.add_argument("--model", default="builtin:tiny", help="builtin:tiny or a local model folder")
    sft.add_argument("--out", required=True, help="where the warm-started model (weights + tokenizer) goes")
    sft.add_argument("--epochs", type=float, default=2.0)
    sft.add_argument("--lr", type=float, default=5e-4)
    sft.add_argument("--batch-size", type=int, default=16)
    sft.add_argument("--max-length", type=int, default=512)
    sft.add_argument("--threshold", type=float, default=1.0, help="success threshold when SOURCE is trace files")
    sft.add_argument("--gpu", action="store_true", help="train on the GPU")
    sft.add_argument(
        "--bf16",
        action=argparse.BooleanOptionalAction,
        default=None,
        help="bfloat16 autocast (default: on a GPU, or a CPU with AVX512_BF16 or AMX)",
    )


def run(args: argparse.Namespace) -> int:
    opts = SFTOptions(
        epochs=args.epochs,
        lr=args.lr,
        batch_size=args.batch_size,
        max_length=args.max_length,
        threshold=args.threshold,
        use_gpu=args.gpu,
        bf16=args.bf16,
    )
    print(json.dumps(run_sft(args.source, args.model, args.out, opts)))
    return 0
