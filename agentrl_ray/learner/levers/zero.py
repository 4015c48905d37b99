"""DeepSpeed ZeRO for the learner: the config we build, models built partitioned, and full weights out of partitions.

Under ZeRO-3 every parameter is split over the ranks: a rank's `param` is an empty placeholder (the real shape is
`param.ds_shape`) and DeepSpeed's forward/backward hooks gather the full tensor only while a layer runs. So:
- the model is built inside `deepspeed.zero.Init` (transformers does it under a live `HfDeepSpeedConfig`): no rank
  ever holds the whole model in accelerator memory, before or after `deepspeed.initialize`;
- anything that reads whole weights (the weight sync, the Hugging Face save) goes through `gathered_named_tensors`:
  a collective that every rank runs to the end, in groups of bounded size, so the extra memory is one group;
- every rank runs every forward (the eval's too), since each forward all-gathers parameters.
ZeRO-1/2 partition only optimizer state and gradients: the module holds full weights and reads them directly.

Only this module and `learner/policy.py` import DeepSpeed.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from typing import Any

import torch

from agentrl_ray.config import LearnerConfig, deep_merge

# Bytes gathered at once for the sync/save (per group of parameters): bounded peak memory on the accelerator.
GATHER_BUCKET_BYTES = 512 * 2**20


def deepspeed_config(cfg: LearnerConfig) -> dict[str, Any]:
    """The DeepSpeed config of a learner (pure: no DeepSpeed import), with `learner.deepspeed_config` merged over
    ours (it wins, key by key) for anything we do not wrap."""
    zero: dict[str, Any] = {"stage": cfg.zero_stage}
    # Pinned host memory speeds host<->GPU copies; on a CPU-only run there are none.
    if cfg.offload_optimizer:
        zero["offload_optimizer"] = {"device": "cpu", "pin_memory": cfg.use_gpu}
    if cfg.offload_params:
        zero["offload_param"] = {"device": "cpu", "pin_memory": cfg.use_gpu}
    ours: dict[str, Any] = {
        "train_micro_batch_size_per_gpu": cfg.micro_batch_size,
        "gradient_accumulation_steps": 1,  # accumulation is driven by hand (Policy.backward)
        "gradient_clipping": cfg.max_grad_norm,
        "zero_optimization": zero,
        "optimizer": {
            "type": "AdamW",
            "params": {"lr": cfg.lr, "betas": list(cfg.betas), "weight_decay": cfg.weight_decay},
        },
        "bf16": {"enabled": cfg.use_gpu},
        "steps_per_print": 10**9,
    }
    out = deep_merge(ours, copy.deepcopy(cfg.deepspeed_config))
    optimizer = out["optimizer"]
    adam = str(optimizer.get("type", "")).lower() in ("adam", "adamw")
    if not cfg.offload_optimizer and adam and optimizer["params"].get("torch_adam", True):
        # torch's fused AdamW kernel, which ships in the torch wheel. DeepSpeed's own FusedAdam compiles itself on
        # first use in each environment. On a GPU with nvcc: it needs the CUDA toolkit on every learner node
        # (runtime images have none), takes about a minute, and fails outright on an arch list with a suffix
        # (TORCH_CUDA_ARCH_LIST="9.0a", common on Hopper machines). On a CPU with g++: ~40 s on 2 cores, for no
        # gain (100M float32 parameters: 44 ms a step with torch's, 45 ms with DeepSpeed's, docs/deepspeed.md).
        # Decided after the merge: `learner.deepspeed_config.optimizer.params.torch_adam=false` brings FusedAdam
        # back (which takes no `fused`), and another optimizer type gets neither key.
        optimizer["params"] = {"torch_adam": True, "fused": True, **optimizer["params"]}
    return out


def inference_config(ds_config: dict[str, Any]) -> dict[str, Any]:
    """The same partitioning without an optimizer: for the frozen KL reference under ZeRO-3."""
    out = {k: v for k, v in ds_config.items() if k not in ("optimizer", "scheduler")}
    out["zero_optimization"] = {
        k: v for k, v in ds_config["zero_optimization"].items() if k not in ("offload_optimizer",)
    }
    return out


def _without_inference_comm_op() -> None:
    """Called before DeepSpeed starts its communication backend (`deepspeed.initialize`, `zero.Init`). On a CPU
    that backend compiles DeepSpeed's shared-memory all-reduce op with g++ the first time in each environment (~30 s
    on 2 cores), yet only `inference_all_reduce` (tensor-parallel inference) ever calls it, never training: marked
    unavailable, the op is not built and every collective goes through torch.distributed as before. (No such op
    exists for a GPU.)"""
    import deepspeed.ops

    deepspeed.ops.__compatible_ops__["deepspeed_shm_comm"] = False


def partitioned_init(ds_config: dict[str, Any]):
    """While the returned object is alive, `from_pretrained` builds models inside `deepspeed.zero.Init` and loads
    the checkpoint straight into the partitions (transformers keeps only a weak reference to it: hold it)."""
    from transformers.integrations import HfDeepSpeedConfig

    _without_inference_comm_op()

    return HfDeepSpeedConfig(ds_config)


def initialize(module: torch.nn.Module, params: list[torch.nn.Parameter] | None, ds_config: dict[str, Any]):
    """`deepspeed.initialize`; without `params`, an engine without optimizer (the partitioned KL reference)."""
    import deepspeed

    _without_inference_comm_op()
    if params is None:
        engine, *_ = deepspeed.initialize(model=module, config=inference_config(ds_config))
        return engine, None
    engine, optimizer, _, _ = deepspeed.initialize(model=module, model_parameters=params, config=ds_config)
    return engine, optimizer


def is_partitioned(module: torch.nn.Module) -> bool:
    return any(hasattr(p, "ds_id") for p in module.parameters())


def gathered_named_tensors(
    module: torch.nn.Module, bucket_bytes: int = GATHER_BUCKET_BYTES
) -> Iterator[tuple[str, torch.Tensor]]:
    """Every entry of `module.state_dict()` (Hugging Face names, what vLLM's loader and `save_pretrained` take) as a
    full-size CPU tensor.

    Partitioned (ZeRO-3): a collective. Every rank must iterate to the end, in the same order; each group of
    parameters up to `bucket_bytes` is all-gathered, copied to the CPU and released before the next. Tied weights
    (one parameter under two names) are gathered once and yielded under both names.
    """
    entries = list(module.state_dict(keep_vars=True).items())
    if not is_partitioned(module):
        for name, t in entries:
            yield name, t.detach().cpu()
        return
    import deepspeed

    def numel(t: torch.Tensor) -> int:
        return int(getattr(t, "ds_numel", t.numel()))

    group: list[tuple[str, torch.Tensor]] = []
    size = 0
    for i, (name, t) in enumerate(entries):
        group.append((name, t))
        size += numel(t) * t.element_size()
        if size < bucket_bytes and i < len(entries) - 1:
            continue
        params = list({id(p): p for _, p in group if hasattr(p, "ds_id")}.values())
        with deepspeed.zero.GatheredParameters(params, modifier_rank=None):
            # A copy (the gathered storage is freed again when the context exits), one per tensor: tied names
            # share it, so `save_pretrained` sees them tied.
            copies = {id(p): p.detach().to("cpu", copy=True) for _, p in group}
        yield from ((n, copies[id(p)]) for n, p in group)
        group, size = [], 0
