"""The learner's speed and memory levers: kernels and setup options that change how fast a step runs or how much
memory it holds, never what it computes (up to float rounding). The RL path (`loop`, `update`, `feed`, `policy`,
`batching`, ...) is the folder above; `policy.py` and `batching.py` call these levers, and no lever imports the RL
path. Each lever has one switch in config (agentrl_ray/config/learner.py), what it was measured to bring is in
docs/speed.md.

- `chunked_logprobs`, `learner.chunked_logprobs` (default true): log-probs straight from the last hidden states
  chunk by chunk, never the (B, T, V) logits (11.7 GB at Qwen2.5-0.5B's vocabulary for 64 x 300 tokens), and only
  at the positions a loss reads. false, and under ZeRO-3: full logits (`learner/logprobs.py`).
- `compilation`, `learner.compile` (auto: models of 200M parameters or more, where it can run): the decoder layers
  compiled by `torch.compile`, their non-matmul work fused (a GPU step 1.6-1.8x faster at 0.5-1.5B; on a CPU
  1.2-2.1 GiB less peak memory). `learner.compile_buckets` sets the shapes it compiles for.
- `linear_fusion`, inside `learner.compile`: a compiled layer's linears that read one input as one matmul (fewer
  kernel launches where a GPU step waits on the host). Off by default until a GPU measures it; no key of its own
  (`compilation.FUSE_SHARED_INPUT_LINEARS`).
- `shared_prefix`, `learner.shared_prefix` (auto: on for a CPU learner): the prefix every row of a micro-batch
  shares goes through the layers once (a CPU step 12-18% shorter with 58-token prompts, 42% with 512-token ones).
- `cpu_attention`, inside `learner.shared_prefix` on a CPU: the packed rows' masked attention as a few large GEMMs
  instead of SDPA's CPU flash kernel (~15% of the GEMM rate at these shapes). No key of its own
  (`shared_prefix.CPU_GEMM_ATTENTION`).
- `zero`, `learner.backend=deepspeed` (`learner.zero_stage` picks the stage): DeepSpeed ZeRO partitions optimizer
  state and gradients (and under ZeRO-3 the weights) over the ranks, for models that do not fit one rank's memory.
- `qlora`, `learner.lora.quantize=nf4` (under `learner.lora.enabled`): the frozen base in 4-bit NF4, 0.18 GB
  instead of 0.72 GB of weights at the 0.5B shape.
"""
