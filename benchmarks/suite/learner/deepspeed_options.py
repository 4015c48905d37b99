"""The DeepSpeed learner options on this machine, for real: ZeRO-3 built partitioned with CPU optimizer offload,
with optimizer + parameter offload, and with gradient checkpointing; 2 steps each, then the bounded gather.

    python benchmarks/run.py learner --mode deepspeed_options   # CPU, one process over gloo; docs/deepspeed.md

Not a test in `make test`: DeepSpeed's CPU Adam (what optimizer offload runs) is JIT-compiled on first use (~1 min
on 2 cores). The configs it uses are the learner's own (`zero.deepspeed_config` of a validated `LearnerConfig`);
tests/unit/test_learner_options.py checks those configs and tests/ray/test_zero3.py the ZeRO-3 learner end to end.
"""

from __future__ import annotations

import argparse
import os
import time

OPTIONS = [
    ["learner.offload_optimizer=true"],
    ["learner.offload_optimizer=true", "learner.offload_params=true"],
    ["learner.gradient_checkpointing=true"],
]


def main(argv: list[str], prog: str) -> None:
    raw = argparse.RawDescriptionHelpFormatter
    parser = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=raw)
    parser.parse_args(argv)
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29533", RANK="0", WORLD_SIZE="1", LOCAL_RANK="0")
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed
    import torch
    from transformers import AutoModelForCausalLM

    from agentrl_ray.builtin.model import ensure_builtin_model
    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.levers import zero
    from agentrl_ray.learner.policy import enable_gradient_checkpointing

    deepspeed.init_distributed("gloo")
    path = str(ensure_builtin_model())
    base = ["profile=cpu", "learner.backend=deepspeed", "learner.zero_stage=3", "learner.micro_batch_size=4"]
    base.append("learner.deepspeed_config.zero_optimization.stage3_param_persistence_threshold=0")
    for overrides in OPTIONS:
        cfg = load_config(None, [*base, *overrides])
        ds = zero.deepspeed_config(cfg.learner)
        t0 = time.perf_counter()
        keep = zero.partitioned_init(ds)  # noqa: F841 (transformers holds it weakly while building)
        model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
        if cfg.learner.gradient_checkpointing:
            enable_gradient_checkpointing(model)
        engine, optimizer = zero.initialize(model, list(model.parameters()), ds)
        ids = torch.randint(10, 300, (4, 32))
        losses = []
        for _ in range(2):
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()
            losses.append(round(float(loss), 4))
        full = dict(zero.gathered_named_tensors(engine.module))
        inner = type(getattr(optimizer, "optimizer", optimizer)).__name__
        print(
            f"{' '.join(overrides)}: optimizer {inner}, losses {losses}, {len(full)} tensors gathered "
            f"(smallest {min(v.numel() for v in full.values())} elements), {time.perf_counter() - t0:.1f} s",
            flush=True,
        )
