"""GPU tier, learner side: the learner's own code on CUDA, without rollout engines. Skipped without a CUDA device.

Run on a GPU machine (README):  python -m pytest tests/gpu/test_gpu_learner.py -m gpu -v

These need Ray, DeepSpeed, peft and bitsandbytes but not vLLM, so they run wherever CUDA torch does; the end-to-end
tests beside this file add vLLM's CUDA engines.
- `hidden_token_logprobs` at a real vocabulary (Qwen2.5's 151,936) on CUDA: equal to the full-logits float32
  computation, values and gradients, while its peak memory stays far below what the (N, V) logits alone need.
- One real `update()` in a 1-worker Ray Train TorchTrainer on the GPU (NCCL backend), for each learner setting a GPU
  user runs: the GPU profile's DeepSpeed ZeRO-2 in bfloat16, LoRA under bf16 autocast (eager and compiled), and
  QLoRA (an NF4 base through bitsandbytes' CUDA kernels). Before the update, its log-probabilities equal a float32
  CPU reference computed here from the same weights (the `loss/mismatch_abs` metric, within bfloat16 rounding) and
  so does its ECHO cross-entropy on the tool-result tokens; after it, the trained tensors moved and the samples with
  a positive advantage gained log-probability against those with a negative one.
"""

from __future__ import annotations

import json
import tempfile
from pathlib import Path

import pytest
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

VOCAB = 151_936  # Qwen2.5's
PROMPT, ACTION, ENV = 8, 6, 5  # a trajectory: prompt, action, tool result, action


def test_chunked_logprobs_at_a_real_vocabulary_equal_full_logits_in_bounded_memory():
    from agentrl_ray.learner.levers.chunked_logprobs import CHUNK_ELEMENTS, chunk_tokens_for, hidden_token_logprobs
    from agentrl_ray.learner.logprobs import token_logprobs_and_entropy

    dev = torch.device("cuda")
    g = torch.Generator(device=dev).manual_seed(0)
    bsz, seqlen, width = 8, 512, 896  # 4,096 tokens: (N, V) float32 logits are 2.3 GiB
    hidden = (torch.randn(bsz, seqlen, width, device=dev, generator=g) * 0.5).bfloat16().requires_grad_()
    weight = (torch.randn(VOCAB, width, device=dev, generator=g) * 0.05).bfloat16().requires_grad_()
    ids = torch.randint(0, VOCAB, (bsz, seqlen), device=dev, generator=g)
    upstream = torch.randn(bsz, seqlen, device=dev, generator=g)

    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    base = torch.cuda.memory_allocated()
    # The CPU's 64 MiB chunks (a GPU's default is 8x larger, which these 4,096 tokens could not show bounded)
    chunk = chunk_tokens_for(VOCAB, CHUNK_ELEMENTS)
    logp, ent = hidden_token_logprobs(hidden, weight, ids, compute_dtype=torch.bfloat16, chunk=chunk)
    (logp * upstream).sum().backward()
    torch.cuda.synchronize()
    peak = torch.cuda.max_memory_allocated() - base
    got = (logp.detach(), ent, hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None

    # Reference: the whole (B, T, V) logits from the same bfloat16 matmul, softmax math in float32.
    ref_logp, ref_ent = token_logprobs_and_entropy((hidden @ weight.T).float(), ids, True)
    (ref_logp * upstream).sum().backward()
    ref = (ref_logp.detach(), ref_ent, hidden.grad, weight.grad)

    logits_bytes = bsz * seqlen * VOCAB * 4
    print(f"chunked peak {peak / 2**20:.0f} MiB; float32 logits alone {logits_bytes / 2**20:.0f} MiB")
    # What the chunked path may hold: the head's gradient (its float32 accumulator and the bfloat16 result), the
    # hidden states' gradient and a few chunk-sized temporaries - never anything of (N, V).
    grads_bytes = weight.numel() * (4 + 2) + hidden.numel() * 2
    assert peak < grads_bytes + 4 * CHUNK_ELEMENTS * 4 < logits_bytes / 2
    for name, a, b in zip(("logprobs", "entropy"), got[:2], ref[:2]):
        torch.testing.assert_close(a, b, rtol=1e-3, atol=2e-3, msg=name)
    for name, a, b in zip(("d hidden", "d weight"), got[2:], ref[2:]):  # bfloat16 gradients: compare as a whole
        rel = (a.float() - b.float()).norm() / b.float().norm()
        assert rel < 2e-2, f"{name}: relative error {rel:.2e}"


# ---------------------------------------------------------------- one update in Ray Train on the GPU


def trajectories(tok_count: int, seed: int):
    """4 groups of 4: prompt, action, tool result, action; rewards 1, 0, 1, 0 in every group (non-zero advantages)."""
    from agentrl_ray.types import Trajectory, TrajectoryGroup

    g = torch.Generator().manual_seed(seed)
    roles = [0] * PROMPT + [1] * ACTION + [2] * ENV + [1] * ACTION
    groups = []
    for p in range(4):
        trajs = []
        for s in range(4):
            ids = torch.randint(3, tok_count, (len(roles),), generator=g).tolist()
            trajs.append(
                Trajectory(
                    prompt_id=f"p{p}",
                    sample_index=s,
                    token_ids=ids,
                    action_mask=[int(r == 1) for r in roles],
                    env_mask=[int(r == 2) for r in roles],
                    template_mask=[0] * len(roles),
                    rollout_logprobs=[0.0] * len(roles),  # filled in from the CPU reference
                    reward=float(s % 2 == 0),
                    policy_version=0,
                    finish_reason="answer",
                    prompt_len=PROMPT,
                )
            )
        groups.append(TrajectoryGroup(prompt_id=f"p{p}", trajectories=trajs))
    return groups


def cpu_reference(model_path: str, groups) -> tuple[float, float]:
    """Writes float32 CPU log-probs of the action tokens into the trajectories' rollout_logprobs (what an engine
    would report); returns their mean magnitude and the mean cross-entropy of the tool-result tokens."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    ce, act = [], []
    with torch.no_grad():
        for group in groups:
            for t in group.trajectories:
                ids = torch.tensor([t.token_ids])
                logp = torch.log_softmax(model(input_ids=ids).logits[0, :-1].float(), -1)
                tok = logp.gather(1, ids[0, 1:, None])[:, 0]  # log p(token t | tokens < t), t >= 1
                t.rollout_logprobs = [0.0] + [float(v) if a else 0.0 for v, a in zip(tok, t.action_mask[1:])]
                ce += [-float(v) for v, e in zip(tok, t.env_mask[1:]) if e]
                act += [-float(v) for v, a in zip(tok, t.action_mask[1:]) if a]
    return sum(act) / len(act), sum(ce) / len(ce)


def action_logprob_means(policy, groups, cfg, pad_id: int) -> list[float]:
    from agentrl_ray.learner.batching import build_batch

    batch = build_batch(groups, cfg.algorithm, pad_id, cfg.rollout.max_total_tokens)
    dev = policy.device
    mask = batch.action_mask.to(dev).float()
    with torch.no_grad():
        logp, _ = policy.token_logprobs(batch.input_ids.to(dev), batch.attention_mask.to(dev), False)
    return ((logp.float() * mask).sum(1) / mask.sum(1)).tolist()


def learner_step(config: dict) -> None:
    """Ray Train worker on the GPU: one real `update()`; reports what the test checks."""
    import ray.train

    from agentrl_ray.learner.policy import Policy
    from agentrl_ray.learner.update import update

    cfg, groups, pad_id = config["config"], config["groups"], config["pad_id"]
    torch.manual_seed(0)
    policy = Policy(config["model_path"], cfg.model, cfg.learner, need_reference=False)
    trained = {n: p.detach().clone() for n, p in policy.module.named_parameters() if p.requires_grad}
    before = action_logprob_means(policy, groups, cfg, pad_id)
    metrics = update(policy, groups, cfg, step=0, pad_id=pad_id)
    after = action_logprob_means(policy, groups, cfg, pad_id)
    named = dict(policy.module.named_parameters())
    metrics.update(
        device=str(policy.device),
        tensors_changed=sum(not torch.equal(v, named[n].detach()) for n, v in trained.items()),
        tensors_trained=len(trained),
        logprob_change=[a - b for a, b in zip(after, before)],
        four_bit_layers=sum(type(m).__name__ == "Linear4bit" for m in policy.module.modules()),
        peak_gpu_mib=torch.cuda.max_memory_allocated() / 2**20 if policy.device.type == "cuda" else 0.0,
    )
    # Ray Train (v2) hands the driver only metrics that came with a checkpoint.
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "metrics.json").write_text(json.dumps(metrics))
        ray.train.report({"done": 1}, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def run_on_gpu(cfg, groups, model_path: str, pad_id: int, storage: Path) -> dict:
    from builders import fit_one_learner_worker

    config = {"config": cfg, "groups": groups, "model_path": model_path, "pad_id": pad_id}
    result = fit_one_learner_worker(learner_step, config, storage, name="gpu_learner", use_gpu=cfg.learner.use_gpu)
    with result.checkpoint.as_directory() as folder:
        return json.loads(Path(folder, "metrics.json").read_text())


SETTINGS = {
    # The GPU profile's learner: DeepSpeed ZeRO-2, bfloat16 weights with DeepSpeed's float32 masters.
    "deepspeed_zero2": ["profile=gpu", "learner.num_workers=1"],
    # LoRA, bf16 base under autocast, the adapter in float32; then the same with the decoder layers compiled.
    "lora_bf16": ["profile=lora", "learner.use_gpu=true", "learner.bf16=true", "learner.lora.r=8"],
    "lora_bf16_compiled": ["profile=lora", "learner.use_gpu=true", "learner.bf16=true", "learner.lora.r=8"]
    + ["learner.compile=true"],
    # QLoRA: the base in NF4 on the GPU (bitsandbytes), the adapter in float32.
    "qlora_nf4": ["profile=lora", "learner.use_gpu=true", "learner.lora.r=8", "learner.lora.quantize=nf4"]
    + ["learner.backend=ddp"],
}


@pytest.mark.parametrize("setting", list(SETTINGS))
def test_learner_update_on_gpu(setting, local_ray, builtin_model_path, tmp_path):
    from transformers import AutoTokenizer

    from agentrl_ray.infra.profiles import load_config

    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    cfg = load_config(
        None,
        [
            *SETTINGS[setting],
            "learner.lr=1e-2",
            "learner.micro_batch_size=8",  # two micro-batches: accumulation across them is exercised
            "echo.coeff=0.05",  # in the loss, small enough that the policy term still decides the check below
            f"run.output_dir={tmp_path}",
            f"run.name={setting}",
        ],
    )
    groups = trajectories(len(tok), seed=0)
    ref_action_nll, ref_world_loss = cpu_reference(builtin_model_path, groups)
    m = run_on_gpu(cfg, groups, builtin_model_path, tok.pad_token_id, tmp_path / "ray")
    print(setting, {k: v for k, v in m.items() if k != "logprob_change"})

    assert m["device"].startswith("cuda")
    # Learner vs the float32 CPU reference before the update: bfloat16 rounding (2^-8 relative), not another model.
    # The tokens are random, so their log-probabilities are large (~ -16) and so is their absolute rounding.
    assert m["loss/mismatch_abs"] < 0.01 * ref_action_nll, (m["loss/mismatch_abs"], ref_action_nll)
    assert abs(m["loss/echo_ce"] - ref_world_loss) < 0.02 * ref_world_loss, (m["loss/echo_ce"], ref_world_loss)
    assert m["loss/skipped_nonfinite"] == 0
    # Every trained tensor moves, except LoRA's A matrices: their first gradient is 0 (B starts at 0).
    assert m["tensors_trained"] > 0 and m["tensors_changed"] >= m["tensors_trained"] // 2
    change = m["logprob_change"]
    rewarded = [c for i, c in enumerate(change) if i % 2 == 0]  # rewards 1, 0, 1, 0 in every group
    unrewarded = [c for i, c in enumerate(change) if i % 2 == 1]
    assert sum(rewarded) / len(rewarded) > sum(unrewarded) / len(unrewarded), change
    if setting == "qlora_nf4":
        assert m["four_bit_layers"] > 0


def test_the_ipc_sender_gets_the_learners_gpu_tensors_and_the_others_host_copies(builtin_model_path, monkeypatch):
    """learner/loop.py hands the IPC sender the model's own CUDA tensors (it packs them on the GPU: no trip through
    host memory, `benchmarks/run.py weight_sync --mode ipc_handoff`) and every other sender copies in host memory."""
    from builders import as_ray_train_rank_zero

    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.policy import Policy
    from agentrl_ray.sync.sender import IpcSender, ObjectStoreSender

    as_ray_train_rank_zero(monkeypatch, torch.device("cuda:0"))
    cfg = load_config(None, ["profile=gpu", "learner.backend=ddp", "learner.num_workers=1"])
    policy = Policy(builtin_model_path, cfg.model, cfg.learner, need_reference=False)
    own = {n: t.data_ptr() for n, t in policy.module.state_dict().items()}
    ipc = policy.named_tensors_for_sync(getattr(IpcSender(2**20), "device_tensors", False))
    host = policy.named_tensors_for_sync(getattr(ObjectStoreSender(), "device_tensors", False))
    assert [n for n, _ in ipc] == [n for n, _ in host] == list(own)
    assert all(t.is_cuda and t.data_ptr() == own[n] for n, t in ipc)
    assert all(t.device.type == "cpu" for _, t in host)
    assert all(torch.equal(a.cpu(), b) for (_, a), (_, b) in zip(ipc, host))


def test_shared_prefix_on_cuda_gives_the_unpacked_log_probs_and_gradients(builtin_model_path, monkeypatch):
    """learner.shared_prefix=true on a GPU (`auto` leaves it off there until measured): the packed micro-batch's
    attention (two SDPA calls, the second with a (C, P + C) mask) gives the unpacked rows' log-probs and LoRA
    gradients under bfloat16 autocast, to bfloat16 rounding."""
    from builders import as_ray_train_rank_zero

    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.policy import Policy

    as_ray_train_rank_zero(monkeypatch, torch.device("cuda:0"))
    cfg = load_config(None, ["profile=lora", "learner.shared_prefix=true", "learner.compile=false"])
    torch.manual_seed(0)
    policy = Policy(builtin_model_path, cfg.model, cfg.learner, need_reference=False)
    assert policy.shared_prefix
    for name, p in policy.module.named_parameters():
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    g = torch.Generator().manual_seed(0)
    vocab = policy.module.config.vocab_size
    prompt = torch.randint(3, vocab, (40,), generator=g)
    ids = torch.cat([prompt.expand(6, 40), torch.randint(3, vocab, (6, 88), generator=g)], dim=1)
    ids[2, 100:] = 0  # right-padded
    ids = ids.cuda()
    mask = (ids != 0).long()
    needed = mask.bool().clone()
    needed[:, :40] = False
    out = {}
    for share in (False, True):
        policy.shared_prefix = share
        logp, _ = policy.token_logprobs(ids, mask, needed=needed)
        policy.wrapped.zero_grad(set_to_none=True)
        (-(logp * needed).sum()).backward()
        grads = [p.grad.float().clone() for p in policy.module.parameters() if p.grad is not None]
        out[share] = ((logp * needed).detach().float(), grads)
    torch.testing.assert_close(out[True][0], out[False][0], rtol=2e-2, atol=3e-2)
    assert len(out[True][1]) == len(out[False][1]) > 0
    for a, b in zip(out[True][1], out[False][1]):
        assert (a - b).norm() <= 3e-2 * b.norm() + 1e-6


def test_fused_linears_and_compile_buckets_on_cuda_give_the_eager_log_probs_and_gradients(
    builtin_model_path, monkeypatch
):
    """The compiled layers as a GPU run would take them with learner.compile_buckets (fixed shapes) and the fusion of
    linears that share an input (learner/levers/linear_fusion.py; off by default until measured): LoRA under bfloat16
    autocast on CUDA gives the eager policy's log-probs and adapter gradients to bfloat16 rounding, at two padded
    lengths."""
    from builders import as_ray_train_rank_zero

    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.levers import compilation
    from agentrl_ray.learner.policy import Policy

    as_ray_train_rank_zero(monkeypatch, torch.device("cuda:0"))
    monkeypatch.setattr(compilation, "FUSE_SHARED_INPUT_LINEARS", True)
    out = {}
    for compiled in (False, True):
        extra = ["learner.compile=true", "learner.compile_buckets=32"] if compiled else ["learner.compile=false"]
        cfg = load_config(None, ["profile=lora", *extra])
        torch.manual_seed(0)
        policy = Policy(builtin_model_path, cfg.model, cfg.learner, need_reference=False)
        assert policy.compiled == compiled and policy.bucket == (32 if compiled else 0)
        for name, p in policy.module.named_parameters():
            if "lora_B" in name:
                torch.nn.init.normal_(p, std=0.02)
        g = torch.Generator().manual_seed(0)
        vocab = policy.module.config.vocab_size
        for rows, length in [(4, 50), (2, 77)]:
            ids = torch.randint(3, vocab, (rows, length), generator=g)
            ids[0, length - 9 :] = 0  # right-padded
            ids = ids.cuda()
            mask = (ids != 0).long()
            needed = mask.bool().clone()
            needed[:, :5] = False
            logp, _ = policy.token_logprobs(ids, mask, needed=needed)
            assert logp.shape == ids.shape
            policy.wrapped.zero_grad(set_to_none=True)
            (-(logp * needed).sum()).backward()
            grads = [p.grad.float().clone() for p in policy.module.parameters() if p.grad is not None]
            out[compiled, rows] = ((logp * needed).detach().float(), grads)
    for rows in (4, 2):
        torch.testing.assert_close(out[True, rows][0], out[False, rows][0], rtol=2e-2, atol=3e-2)
        assert len(out[True, rows][1]) == len(out[False, rows][1]) > 0
        for a, b in zip(out[True, rows][1], out[False, rows][1]):
            assert (a - b).norm() <= 3e-2 * b.norm() + 1e-6
