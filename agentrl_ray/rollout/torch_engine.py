"""The torch backend of the engine seam (`rollout.backend=torch`): `transformers`' own generation and cache on any
device torch runs on (CPU, CUDA, ROCm, Apple MPS), with no kernels of our own.

What it is for: the fallback where vLLM does not run (a GPU image whose torch vLLM's wheel does not match, an AMD
or Apple workstation), the reference for the learner-vs-engine log-prob gap (its forward pass is the learner's
model code), and what runs the whole loop on GPU machines that cannot take vLLM. It is slower than vLLM: no paged
attention and no prefix cache across calls, every call prefills its prompts (docs/backends.md has the numbers).

How it keeps the engine contract (`rollout/engine.py`) on top of `model.generate`:
- Sampling is ours, in a logits processor, so that each request has its own seed: every request draws its
  uniforms from a CPU generator seeded with its own seed (the same numbers on any device and in any batch), and a
  token is picked by inverting the (top-p truncated) CDF with them (`rollout/sampling.py`, as vLLM's CPU engine
  does). The processor hands `generate` a distribution with all mass on that token, which `generate` then takes
  greedily. Temperature 0 is the argmax.
- Log-probs: of the sampled token under the raw logits' log-softmax (float32), as vLLM reports them.
- Stops: a request ends at a stop token (kept in its output, as vLLM does) or at its own budget; a stopping
  criterion tells `generate`, which runs until every request has ended.
- Cache: `transformers`' dynamic cache by default; `rollout.engine_kwargs={"cache_implementation": "static",
  "compile": true}` takes its static cache, which `generate` compiles with `torch.compile` on accelerators.
- Weights: loaded in place into the model's own tensors by Hugging Face name (any subset, as a stream: a bucketed
  transport's tensors are copied as they arrive). LoRA adapters reach it merged (`sync/receiver.py`).
- Sleep (a GPU shared with a learner rank): the weights go to CPU memory and the cache allocator's blocks back to
  the device. A weight load while asleep writes the new tensors straight into fresh device memory instead of first
  bringing the old ones back.
"""

from __future__ import annotations

import gc
import logging
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from agentrl_ray.infra.allocator import allocator_env, release_freed_memory
from agentrl_ray.rollout.engine import Generation
from agentrl_ray.rollout.sampling import inverse_cdf

if TYPE_CHECKING:
    from agentrl_ray.config import ModelConfig, RolloutConfig
    from agentrl_ray.rollout.engine_modes import EngineModes

log = logging.getLogger("agentrl_ray")

# rollout.engine_kwargs this backend takes: name -> allowed values.
ENGINE_KWARGS: dict[str, tuple[Any, ...]] = {"cache_implementation": ("dynamic", "static"), "compile": (False, True)}


def check_engine_kwargs(extra: dict[str, Any]) -> dict[str, Any]:
    """`rollout.engine_kwargs` for the torch backend: a clear error for a name or value it does not take (a vLLM
    argument left over from a vLLM config included)."""
    for key, value in extra.items():
        if key not in ENGINE_KWARGS:
            raise ValueError(
                f"rollout.engine_kwargs.{key} is not an argument of the torch backend (it takes "
                f"{', '.join(ENGINE_KWARGS)}); vLLM's engine arguments apply to rollout.backend=vllm only"
            )
        if value not in ENGINE_KWARGS[key]:
            raise ValueError(f"rollout.engine_kwargs.{key}={value!r}: choose one of {ENGINE_KWARGS[key]}")
    return dict(extra)


def engine_device(use_gpu: bool) -> torch.device:
    """CPU, or the accelerator torch sees (CUDA and ROCm both answer as "cuda"; then Apple's MPS)."""
    if not use_gpu:
        return torch.device("cpu")
    if torch.cuda.is_available():
        return torch.device("cuda", torch.cuda.current_device())
    if torch.backends.mps.is_available():
        return torch.device("mps")
    raise RuntimeError("rollout.use_gpu=true, but torch sees no CUDA, ROCm or MPS device in the engine's process")


class SeededSampler:
    """The logits processor and stopping criterion of one `generate` call: per-request seeded sampling, the sampled
    tokens' log-probs, and when each request ends. Tensors on the model's device; nothing waits on the host."""

    def __init__(
        self,
        seeds: list[int],
        max_tokens: list[int],
        *,
        temperature: float,
        top_p: float,
        stop_token_ids: list[int],
        device: torch.device,
    ) -> None:
        steps = max(max_tokens)
        self.temperature, self.top_p = temperature, top_p
        # Uniforms per request from its own CPU generator: the same draws on any device and in any batch.
        self.uniforms = torch.stack(
            [torch.rand(steps, generator=torch.Generator().manual_seed(s), dtype=torch.float64) for s in seeds]
        ).to(device)  # (B, steps)
        self.budget = torch.tensor(max_tokens, device=device)  # (B,)
        self.stops = torch.tensor(stop_token_ids, dtype=torch.long, device=device)
        batch = len(seeds)
        self.done = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        self.hit_stop = torch.zeros(batch, dtype=torch.bool, device=device)  # (B,)
        self.length = torch.zeros(batch, dtype=torch.long, device=device)  # (B,) tokens of each request
        self.logprobs: list[torch.Tensor] = []  # one (B,) per step
        self.step = 0

    def __call__(self, input_ids: torch.Tensor, scores: torch.Tensor) -> torch.Tensor:  # (B, L), (B, V) -> (B, V)
        scores = scores.float()
        token = scores.argmax(-1) if self.temperature == 0 else self._sample(scores)  # (B,)
        self.logprobs.append(torch.log_softmax(scores, -1).gather(1, token[:, None]).squeeze(1))
        stop = torch.isin(token, self.stops)
        ending = ~self.done & (stop | (self.budget <= self.step + 1))
        self.length = torch.where(ending, self.step + 1, self.length)
        self.hit_stop |= ending & stop
        self.done |= ending
        self.step += 1
        chosen = torch.full_like(scores, float("-inf"))
        return chosen.scatter_(1, token[:, None], 0.0)

    def _sample(self, scores: torch.Tensor) -> torch.Tensor:
        probs = torch.softmax(scores / self.temperature, dim=-1)  # (B, V)
        order = None
        if self.top_p < 1.0:
            probs, order = probs.sort(dim=-1, descending=True)
            probs = probs * ((probs.cumsum(-1) - probs) < self.top_p)  # the smallest prefix holding top_p
        pick = inverse_cdf(probs, self.uniforms[:, self.step])  # (B,)
        return order.gather(1, pick[:, None]).squeeze(1) if order is not None else pick

    def stopping(self, input_ids: torch.Tensor, scores: torch.Tensor, **kwargs) -> torch.Tensor:
        return self.done.clone()


class TorchEngine:
    native_lora = False  # adapters arrive merged into full weights (sync/receiver.py)

    def __init__(
        self,
        model_path: str,
        *,
        dtype: str,
        seed: int,
        max_model_len: int,
        max_num_seqs: int,
        device: torch.device | str = "cpu",
        sleep: bool = False,
        cache_implementation: str = "dynamic",
        compile: bool = False,
    ) -> None:
        from transformers import AutoModelForCausalLM, GenerationConfig

        self.device = torch.device(device)
        self.model = AutoModelForCausalLM.from_pretrained(model_path, dtype=getattr(torch, dtype))
        self.model.to(self.device).eval()
        # A bare generation config: the model folder's (eos, temperature, top_k, ...) must not reach our sampling.
        self.model.generation_config = GenerationConfig(pad_token_id=0)
        self.max_model_len, self.max_num_seqs = max_model_len, max_num_seqs
        self.cache_implementation, self.compile = cache_implementation, compile
        self._seeds = torch.Generator().manual_seed(seed)  # for requests that come without a seed
        # Name -> the model's own tensor (tied names share one); what loads write into.
        self._targets = self.model.state_dict(keep_vars=True)
        if sleep and self.device.type == "cpu":
            raise ValueError("rollout.sleep_mode: an engine on the CPU has no device memory to give back")
        self.can_sleep = sleep
        self.asleep = False

    @classmethod
    def from_config(
        cls,
        model_path: str,
        model_cfg: ModelConfig,
        cfg: RolloutConfig,
        *,
        seed: int,
        use_gpu: bool,
        modes: EngineModes,
        kv_sequences: int,
    ) -> TorchEngine:
        return cls(
            model_path,
            dtype=model_cfg.dtype,
            seed=seed,
            max_model_len=cfg.max_total_tokens,
            max_num_seqs=cfg.max_num_seqs,
            device=engine_device(use_gpu),
            sleep=modes.sleep,
            **check_engine_kwargs(cfg.engine_kwargs),
        )

    @staticmethod
    def process_env(*, use_gpu: bool) -> dict[str, str]:
        # A CPU engine keeps each step's freed activations mapped (allocator.py); per-thread arenas, like a learner:
        # its OpenMP threads allocate as they compute.
        return {} if use_gpu else allocator_env(one_arena=False)

    def kv_cache_tokens(self) -> int:
        """The context one call may hold: its cache is made per call, for at most max_num_seqs requests."""
        return self.max_num_seqs * self.max_model_len

    # ---------------------------------------------------------------- generation

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
    ) -> list[Generation]:
        """`ignore_eos`: run every request to its budget (stop tokens ignored)."""
        for p, m in zip(prompts, max_tokens):
            if m < 1 or len(p) + m > self.max_model_len:
                raise ValueError(
                    f"a request of {len(p)} prompt tokens and {m} new tokens does not fit the engine's "
                    f"max_model_len={self.max_model_len} (rollout.max_total_tokens)"
                )
        if seeds is None:
            seeds = torch.randint(2**31, (len(prompts),), generator=self._seeds).tolist()
        stops = [] if ignore_eos else stop_token_ids
        self.wake()
        out: list[Generation] = []
        n = self.max_num_seqs
        for i in range(0, len(prompts), n):
            out += self._generate(
                prompts[i : i + n], max_tokens[i : i + n], seeds[i : i + n], temperature, top_p, stops
            )
        release_freed_memory()  # the call's cache and logits (allocator.py)
        return out

    @torch.inference_mode()
    def _generate(self, prompts, max_tokens, seeds, temperature, top_p, stops) -> list[Generation]:
        from transformers import LogitsProcessorList, StoppingCriteriaList

        width = max(map(len, prompts))
        ids = torch.zeros(len(prompts), width, dtype=torch.long)  # (B, width), left-padded
        mask = torch.zeros_like(ids)
        for row, p in enumerate(prompts):
            ids[row, width - len(p) :] = torch.tensor(p)
            mask[row, width - len(p) :] = 1
        sampler = SeededSampler(
            seeds, max_tokens, temperature=temperature, top_p=top_p, stop_token_ids=stops, device=self.device
        )
        options = {"cache_implementation": "static"} if self.cache_implementation == "static" else {}
        seqs = self.model.generate(
            input_ids=ids.to(self.device),
            attention_mask=mask.to(self.device),
            max_new_tokens=max(max_tokens),
            do_sample=False,
            logits_processor=LogitsProcessorList([sampler]),
            stopping_criteria=StoppingCriteriaList([sampler.stopping]),
            disable_compile=not self.compile,
            **options,
        )
        tokens = seqs[:, width:].tolist()  # (B, n)
        logprobs = torch.stack(sampler.logprobs, 1).tolist()  # (B, n)
        lengths, stopped = sampler.length.tolist(), sampler.hit_stop.tolist()
        return [
            Generation(tokens[r][: lengths[r]], logprobs[r][: lengths[r]], "stop" if stopped[r] else "length")
            for r in range(len(prompts))
        ]

    @torch.inference_mode()
    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Each sequence's token log-probs after its first token (len - 1 each), one right-padded forward."""
        self.wake()
        width = max(map(len, sequences))
        ids = torch.zeros(len(sequences), width, dtype=torch.long)  # (B, width), right-padded
        mask = torch.zeros_like(ids)
        for row, s in enumerate(sequences):
            ids[row, : len(s)] = torch.tensor(s)
            mask[row, : len(s)] = 1
        ids, mask = ids.to(self.device), mask.to(self.device)
        logits = self.model(input_ids=ids, attention_mask=mask, use_cache=False).logits[:, :-1].float()  # (B, w-1, V)
        picked = torch.log_softmax(logits, -1).gather(-1, ids[:, 1:, None])[..., 0].cpu()  # (B, w-1)
        return [picked[row, : len(s) - 1].tolist() for row, s in enumerate(sequences)]

    # ---------------------------------------------------------------- weights

    @torch.no_grad()
    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Copy each tensor into the model's tensor of that name, as they arrive. While asleep, each arriving tensor
        gets fresh device memory (its old value is never brought back), then the rest of the model wakes."""
        for name, tensor in named_tensors:
            target = self._targets.get(name)
            if target is None:
                raise ValueError(f"weight sync: the engine's model has no tensor named {name}")
            if tuple(target.shape) != tuple(tensor.shape):
                raise ValueError(
                    f"weight sync: {name} has shape {tuple(tensor.shape)}, the engine's is {tuple(target.shape)}"
                )
            if target.device != self.device:  # asleep: replace, do not wake the old value first
                target.data = torch.empty_like(target, device=self.device)
            target.data.copy_(tensor)
        self.wake()  # whatever the update left out

    # ---------------------------------------------------------------- sleep

    def sleep(self) -> None:
        """Give the device memory to a learner rank sharing it (weights to CPU memory); a no-op without sleep."""
        if self.can_sleep and not self.asleep:
            self.model.to("cpu")
            if self.device.type == "cuda":
                gc.collect()  # a generation's caches can sit in reference cycles, holding device memory until then
                torch.cuda.empty_cache()
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.model.to(self.device)  # tensors already on the device (a load while asleep) stay as they are
            self.asleep = False

    def set_adapter(self, folder: str) -> None:
        raise NotImplementedError("the torch backend takes LoRA adapters merged (rollout.lora_mode=merge)")
