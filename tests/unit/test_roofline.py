"""The roofline benchmark's learner FLOPs against torch's own count of a real forward and backward.

The whole-step bound of docs/benchmarks.md ("how far 4x is") rests on `learner_flops`: 6 x params a token for a full
fine-tune, 4 x the frozen body + 6 x the adapters under LoRA, the head over the scored tokens only. Here a small
Qwen2 (tied head, q/k/v biases, grouped key/value heads) runs the learner's pattern, the head on the completion
positions only, under `torch.utils.flop_counter.FlopCounterMode`, full and with peft LoRA on the seven projections,
and every matmul it counts (attention aside) must be what the formula says."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from suite.roofline import roofline  # noqa: E402

ROWS, SEQ, SCORED = 3, 24, 16


def tiny_qwen2():
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=160,
        num_hidden_layers=3,
        num_attention_heads=4,
        num_key_value_heads=2,
        tie_word_embeddings=True,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    return Qwen2ForCausalLM(config)


def counted_matmul_flops(decoder, head: torch.Tensor) -> int:
    """FLOPs torch counts for the learner's step (hidden states of every position, log-probs of the last SCORED),
    every op but attention's."""
    from torch.utils.flop_counter import FlopCounterMode

    ids = torch.randint(0, head.shape[0], (ROWS, SEQ))
    with FlopCounterMode(display=False) as counter:
        hidden = decoder(input_ids=ids).last_hidden_state
        logits = torch.nn.functional.linear(hidden[:, -SCORED - 1 : -1], head).float()
        logp = torch.log_softmax(logits, -1).gather(-1, ids[:, -SCORED:, None])
        (-logp.mean()).backward()
    counts = counter.get_flop_counts()["Global"]
    return sum(v for op, v in counts.items() if "attention" not in str(op))


@pytest.mark.parametrize("lora_r", [0, 4], ids=["full", "lora-r4"])
def test_learner_flops_equal_torchs_count_of_a_real_forward_and_backward(lora_r):
    model = tiny_qwen2()
    m = roofline.shape_of(model)
    if lora_r:
        from peft import LoraConfig, get_peft_model

        targets = list(roofline.PROJECTIONS)
        model = get_peft_model(model, LoraConfig(r=lora_r, lora_alpha=8, lora_dropout=0.0, target_modules=targets))
        adapters = sum(p.numel() for n, p in model.named_parameters() if "lora_" in n)
        assert adapters == roofline.lora_params(m, lora_r)
        model = model.get_base_model()
    # The learner runs the head over the scored positions only, not the model's forward over all of them.
    counted = counted_matmul_flops(model.get_decoder(), model.get_output_embeddings().weight)
    parts = roofline.learner_flops(m, ROWS * SEQ, ROWS * SCORED, lora_r=lora_r)
    assert parts["body"] + parts["head"] + parts["adapters"] == counted


def test_the_whole_step_bound_prices_4x_against_another_trainers_step():
    """The side-by-side's shape: a 0.5B model's generation and LoRA learner at 2 x 413 GFLOP/s (Zen 4's bfloat16)."""
    m = {
        "params": 494_032_768,
        "head_params": 136_134_656,
        "body_params": 357_826_560,
        "layers": 24,
        "hidden": 896,
        "intermediate": 4864,
        "attn_dim": 896,
        "kv_dim": 128,
        "vocab": 151_936,
    }
    rate = {"gflops": 413.5, "gb_per_s": 47.2, "bytes_per_param": 2, "threads": 2, "dtype": "bf16"}
    step = {"samples": 64, "sampled_tokens": 16384, "completion_tokens": 16384, "generate_s": 69.4}
    step |= {"learner_s": 140.0, "step_s": 209.4}
    shared = roofline.bounds(m, step, {"generation": rate, "learner": rate}, 58.75, group=8, lora_r=16)
    alone = roofline.bounds(m, step, {"generation": rate, "learner": rate}, 58.75, group=1, lora_r=16)
    full = roofline.bounds(m, step, {"generation": rate, "learner": rate}, 58.75, group=8, lora_r=0)
    whole = shared["whole step"]["bound_s"]
    assert whole == pytest.approx(shared["generation"]["bound_s"] + shared["learner"]["bound_s"])
    assert alone["whole step"]["bound_s"] > whole  # each copy's own prompt costs more
    assert full["learner"]["bound_s"] > 1.4 * shared["learner"]["bound_s"]  # 6x against 4x of the body
    # Decode is FLOP-bound at 64 sequences: 2 x params a sampled token, the head included.
    assert shared["generation"]["flop_bound_s"] > shared["generation"]["byte_bound_s"]
    assert shared["generation"]["gflop"] > 16384 * 2 * m["params"] / 1e9
