"""The rollout engine seam: one small interface, one file per backend, chosen by `rollout.backend`.

Tokens in, tokens out: prompts go in as token ids and come back as sampled token ids with the log-probability of
each sampled token under the unmodified distribution (the raw logits' log-softmax, before temperature and top-p: what
vLLM reports by default and what the learner's importance ratio compares against at temperature 1).

The worker, the agent loop and `sync/` (through the worker's load functions) speak only to `Engine`:
- `generate`: batched, seeded per request (a request's tokens depend on its own seed, not on its batch), stop token
  ids (the end-of-turn token; the tool-call close tag where a caller wants one), a budget per request;
- `score`: teacher forcing: the log-probability of each token of each given sequence after the tokens before it
  (raw logits, as `generate` reports), for the integrity probe that checks the engine holds the learner's weights
  (`learner/integrity.py`); under the current adapter where `native_lora`;
- `load_weights`: in-place, Hugging Face parameter names, full or any part, as a stream (bucketed transports hand
  one bucket at a time); `set_adapter` (only where `native_lora`): a PEFT folder served from now on;
- `sleep` / `wake`: give the device memory to a learner rank that shares it, and take it back;
- `kv_cache_tokens`: the context the engine holds at once.

Backends:
- `vllm` (`rollout/vllm_engine.py`): the default and the production path, CPU and CUDA. Everything vLLM-specific
  lives there: process environment variables, KV sizing, engine-argument checks, sleep mode, native LoRA.
- `torch` (`rollout/torch_engine.py`): `transformers`' own generation and cache on any device torch runs on (CPU,
  CUDA, ROCm, MPS); the fallback where vLLM does not run and the reference for the learner-vs-engine log-prob gap.
Adding a backend is one file with a `from_config`, a `process_env` and the methods below, plus its line in
`rollout/backends.py`, which picks the class by name.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass
from typing import Protocol

import torch


@dataclass
class Generation:
    token_ids: list[int]
    logprobs: list[float]
    finish_reason: str  # "stop" (hit a stop token) or "length"


class Engine(Protocol):
    native_lora: bool  # True: weight sync hands LoRA adapters to `set_adapter`; False: merged into full weights

    def generate(
        self,
        prompts: list[list[int]],
        max_tokens: list[int],
        *,
        temperature: float,
        top_p: float,
        stop_token_ids: list[int],
        seeds: list[int] | None = None,
        ignore_eos: bool = False,
    ) -> list[Generation]: ...

    def score(self, sequences: list[list[int]]) -> list[list[float]]: ...

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None: ...

    def set_adapter(self, folder: str) -> None: ...

    def sleep(self) -> None: ...

    def wake(self) -> None: ...

    def kv_cache_tokens(self) -> int: ...
