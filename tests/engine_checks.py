"""Shared check of the Ray and GPU tiers: every rollout engine holds exactly the weights the learner saved.

`pytest` puts this folder on sys.path (it holds the root conftest.py), so test modules import it as
`engine_checks`."""

from pathlib import Path

import torch

QUESTIONS = ("What is 12 * 34?", "What is 905 - 17?")


def chat_prompts(tok) -> list[list[int]]:
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in QUESTIONS
    ]


def hf_greedy(model, prompt: list[int], n: int) -> tuple[list[int], list[float]]:
    """`n` greedy tokens of a transformers model and their log-probabilities."""
    device = next(model.parameters()).device
    out = model.generate(
        torch.tensor([prompt], device=device),
        max_new_tokens=n,
        min_new_tokens=n,
        do_sample=False,
        eos_token_id=None,
        pad_token_id=0,
        output_scores=True,
        return_dict_in_generate=True,
    )
    ids = out.sequences[0, len(prompt) :].tolist()
    return ids, [float(torch.log_softmax(s[0].float(), -1)[i]) for s, i in zip(out.scores, ids)]


def assert_engines_hold(pool, model, base_model, tok, n: int = 16, tol: float = 1e-3) -> None:
    """Every engine's greedy tokens equal `model`'s and its log-probabilities are within `tol`, while `model` has
    moved further than `tol` from `base_model` (else the check would prove nothing)."""
    prompts = chat_prompts(tok)
    expected = [hf_greedy(model, p, n) for p in prompts]
    base = [hf_greedy(base_model, p, n) for p in prompts]
    moved = max(abs(a - b) for (_, lp), (_, lb) in zip(expected, base) for a, b in zip(lp, lb))
    for results in pool.greedy(prompts, n):
        for (ids, logps), (hf_ids, hf_logps) in zip(results, expected):
            assert ids == hf_ids
            gap = max(abs(a - b) for a, b in zip(logps, hf_logps))
            assert gap < tol < moved, f"engine vs learner weights {gap:.2e}, learner vs base model {moved:.2e}"


def load_hf(folder: Path, device: str = "cpu"):
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).to(device).eval()
