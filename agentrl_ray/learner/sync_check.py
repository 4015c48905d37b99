"""`run.sync_check=true`: after every weight push, every engine's greedy tokens against `transformers` on the very
tensors that were pushed, on learner rank 0.

Weight sync is where a GPU path breaks silently (a transport that drops a tensor, a device mix-up, a dtype
rounding the wrong way): the run goes on and learns worse. This check turns that into two metrics per step:
- `sync/greedy_match`: the fraction of (engine, prompt) pairs whose greedy tokens equal the reference's;
- `sync/logprob_gap`: the largest |log-prob difference| over the matching ones.
The reference is a `transformers` model in the engines' dtype on rank 0's device, loaded with the pushed tensors
(a LoRA adapter merged into the base as the engines merge it). With the torch backend the two run the same code, so
the match is exact up to batching; vLLM's kernels differ in the last bits (in bfloat16 a near-tie may flip a token).
"""

from __future__ import annotations

from typing import Any

import torch

from agentrl_ray.sync.lora import merged_stream

QUESTIONS = ("What is 12 * 34?", "What is 905 - 17?")
TOKENS = 16


class SyncCheck:
    def __init__(self, model_path: str, tokenizer, dtype: str, lora_scaling: float | None) -> None:
        from transformers import AutoModelForCausalLM

        device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype)).to(device).eval()
        self.model_path, self.lora_scaling = model_path, lora_scaling
        self.prompts = [
            tokenizer.apply_chat_template(
                [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
            )
            for q in QUESTIONS
        ]

    @torch.no_grad()
    def __call__(self, sender, pool: Any, named: list[tuple[str, torch.Tensor]]) -> dict[str, float]:
        sender.flush()  # the object store's update waits for the next rollout otherwise
        if self.lora_scaling is not None:
            named = merged_stream(self.model_path, dict(named), self.lora_scaling)
        params = self.model.state_dict()
        for name, tensor in named:
            params[name].copy_(tensor)
        expected = [self._greedy(p) for p in self.prompts]
        matches, total, gap = 0, 0, 0.0
        for results in pool.greedy(self.prompts, TOKENS):
            for (ids, lps), (ref_ids, ref_lps) in zip(results, expected):
                total += 1
                if ids == ref_ids:
                    matches += 1
                    gap = max(gap, *(abs(a - b) for a, b in zip(lps, ref_lps)))
        return {"sync/greedy_match": matches / total, "sync/logprob_gap": gap}

    def _greedy(self, prompt: list[int]) -> tuple[list[int], list[float]]:
        device = next(self.model.parameters()).device
        ids, lps = torch.tensor([prompt], device=device), []
        for _ in range(TOKENS):
            logp = torch.log_softmax(self.model(ids).logits[0, -1].float(), -1)
            token = int(logp.argmax())
            lps.append(float(logp[token]))
            ids = torch.cat([ids, torch.tensor([[token]], device=device)], 1)
        return ids[0, len(prompt) :].tolist(), lps
