"""After a sync, through either transport, every rollout engine holds exactly the learner's weights.

Real Ray actors with real vLLM CPU engines. The test process plays learner rank 0: it changes the weights of a
transformers model (a few AdamW steps), pushes them, then compares token for token.
"""

from pathlib import Path

import pytest
import ray
import torch

from agentrl_ray.infra.allocator import allocator_env
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.rollout.pool import RolloutPool, sequences_per_engine
from agentrl_ray.rollout.vllm_engine import kv_bytes_per_token
from agentrl_ray.sync.collective import collective_backend
from agentrl_ray.sync.sender import CollectiveSender, ObjectStoreSender


@pytest.fixture(scope="module")
def setup(local_ray, builtin_model_path):
    from transformers import AutoModelForCausalLM, AutoTokenizer

    cfg = load_config(None, ["profile=cpu", "rollout.num_workers=2", "rollout.num_cpus_per_worker=1"])
    pool = RolloutPool.create(cfg, builtin_model_path)
    tok = AutoTokenizer.from_pretrained(builtin_model_path)
    model = AutoModelForCausalLM.from_pretrained(builtin_model_path, dtype=torch.float32)
    yield cfg, pool, tok, model
    pool.shutdown()


def _train_a_little(model, seed: int) -> None:
    """A few real optimizer steps so the weights move away from what the engines loaded."""
    torch.manual_seed(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3)
    ids = torch.randint(10, model.config.vocab_size, (4, 24))
    for _ in range(3):
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        opt.step()
        opt.zero_grad()


def _hf_greedy(model, prompt: list[int], n: int) -> list[int]:
    out = model.generate(
        torch.tensor([prompt]), max_new_tokens=n, min_new_tokens=n, do_sample=False, eos_token_id=None, pad_token_id=0
    )
    return out[0, len(prompt) :].tolist()


def _hf_logprobs(model, ids: list[int], positions: list[int]) -> list[float]:
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ids])).logits[0].float(), dim=-1)  # (T, V)
    return [float(logp[p - 1, ids[p]]) for p in positions]


@pytest.mark.integration
@pytest.mark.parametrize("transport", ["object_store", "collective"])
def test_sync_makes_engines_equal_to_learner(setup, transport):
    cfg, pool, tok, model = setup
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for q in ("What is 12 * 34?", "What is 905 - 17?")
    ]
    before = pool.greedy(prompts, 16)[0]
    _train_a_little(model, seed=0 if transport == "object_store" else 1)
    # A small bucket bound, so the collective update streams in many buckets.
    sync = ObjectStoreSender() if transport == "object_store" else CollectiveSender(collective_backend(cfg), 2**14)
    sync.setup(pool.workers)
    version = 11 if transport == "object_store" else 12
    sync.push([(n, t.detach().clone()) for n, t in model.state_dict().items()], version)

    # Sampled trajectories: the object-store weights travel with this rollout call (loaded before generating), the
    # collective ones were loaded at push; either way the rollout logprobs equal the learner's recomputation.
    rows = [
        {"id": "q1", "prompt": "What is 123 + 456?", "answer": "579"},
        {"id": "q2", "prompt": "What is 31 * 7?", "answer": "217"},
    ]
    groups, timings = pool.sample(rows, group_size=4, temperature=1.0, seed=3, weights=sync.take_pending())
    if transport == "object_store":
        assert timings.load_weights_s > 0
    for traj in [t for g in groups for t in g.trajectories]:
        assert traj.policy_version == version
        pos = [i for i, m in enumerate(traj.action_mask) if m]
        ours = _hf_logprobs(model, traj.token_ids, pos)
        theirs = [traj.rollout_logprobs[i] for i in pos]
        assert max(abs(a - b) for a, b in zip(ours, theirs)) < 2e-2
    assert pool.versions() == [version, version]

    expected = [_hf_greedy(model, p, 16) for p in prompts]
    per_worker = pool.greedy(prompts, 16)
    assert [ids for ids, _ in before] != expected, "the training steps did not change greedy output: weak test"
    for results in per_worker:
        assert [ids for ids, _ in results] == expected


@pytest.mark.integration
def test_lora_adapter_sync_matches_merged_model(setup, builtin_model_path):
    """LoRA: only A/B tensors travel; the engine merges them and then generates like the peft model."""
    from peft import LoraConfig, get_peft_model
    from transformers import AutoModelForCausalLM

    from agentrl_ray.learner.policy import lora_tensors

    cfg, pool, tok, _ = setup
    base = AutoModelForCausalLM.from_pretrained(builtin_model_path, dtype=torch.float32)
    model = get_peft_model(base, LoraConfig(r=4, lora_alpha=8, target_modules=["q_proj", "v_proj", "up_proj"]))
    _train_a_little(model, seed=2)
    adapter = lora_tensors(model)
    assert adapter and all(".lora_A" in n or ".lora_B" in n for n, _ in adapter)
    sync = ObjectStoreSender(lora_scaling=8 / 4)
    sync.setup(pool.workers)
    sync.push(adapter, 21)
    sync.flush()
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "What is 77 * 3?"}], add_generation_prompt=True, tokenize=True, return_dict=False
    )
    expected = _hf_greedy(model, prompt, 16)
    for results in pool.greedy([prompt], 16):
        assert results[0][0] == expected


@pytest.mark.long
def test_large_seeded_batch_is_scheduled_over_several_engine_steps(local_ray, builtin_model_path):
    """More prompt tokens than the engine prefills in one step, every request seeded (as rollouts are): vLLM CPU
    crashed on the partial prefill of a seeded request. A fresh engine, so no prompt prefix is cached yet."""
    from agentrl_ray.tasks.arithmetic import make_arithmetic_rows

    cfg = load_config(None, ["profile=cpu", "rollout.num_cpus_per_worker=1"])
    pool = RolloutPool.create(cfg, builtin_model_path)
    try:
        rows = make_arithmetic_rows(150, seed=5, split="eval")  # 300 sequences x ~58 prompt tokens > 4096
        groups, _ = pool.sample(rows, group_size=2, temperature=1.0, seed=9)
    finally:
        pool.shutdown()
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 300
    assert all(t.finish_reason in ("answer", "length", "max_turns") and sum(t.action_mask) > 0 for t in trajs)


@pytest.mark.integration
def test_engines_kv_cache_is_sized_to_the_run(setup, builtin_model_path):
    """vLLM allocated each engine the cache the run needs (its largest rollout call at the whole token budget), to
    the MiB: not vLLM CPU's most-of-RAM default, nor a fixed GiB of which most would stay unused."""
    cfg, pool = setup[0], setup[1]
    need = sequences_per_engine(cfg) * cfg.rollout.max_total_tokens
    tokens_per_mib = 2**20 // kv_bytes_per_token(builtin_model_path, cfg.model.dtype)
    for tokens in ray.get([w.kv_cache_tokens.remote() for w in pool.workers]):
        assert need <= tokens <= need + tokens_per_mib


@pytest.mark.integration
def test_cpu_engines_start_with_the_allocator_settings(setup):
    """Each engine's process started with allocator_env's variables (glibc reads them only then): a decode step's
    large tensors stay mapped for the next (allocator.py)."""
    want = allocator_env(one_arena=True)
    assert want  # the test's own environment sets no allocator of its own
    for pid in ray.get([w.pid.remote() for w in setup[1].workers]):
        environ = dict(
            item.split("=", 1) for item in Path(f"/proc/{pid}/environ").read_text().split("\0") if "=" in item
        )
        assert {k: environ.get(k) for k in want} == want


@pytest.mark.long
def test_a_short_kv_cache_queues_sequences(local_ray, builtin_model_path):
    """A cache set by hand far below what a call needs (16 MiB: ~50 of 300 sequences at the whole token budget) makes
    vLLM run the sequences in turns; every one of them still completes."""
    from agentrl_ray.tasks.arithmetic import make_arithmetic_rows

    cfg = load_config(None, ["profile=cpu", "rollout.num_cpus_per_worker=1", f"rollout.kv_cache_gib={1 / 64}"])
    pool = RolloutPool.create(cfg, builtin_model_path)
    try:
        (tokens,) = ray.get([w.kv_cache_tokens.remote() for w in pool.workers])
        rows = make_arithmetic_rows(150, seed=6, split="eval")
        groups, _ = pool.sample(rows, group_size=2, temperature=1.0, seed=3)
    finally:
        pool.shutdown()
    assert tokens * kv_bytes_per_token(builtin_model_path, cfg.model.dtype) == 16 * 2**20
    assert tokens < 300 * cfg.rollout.max_total_tokens / 5
    trajs = [t for g in groups for t in g.trajectories]
    assert len(trajs) == 300
    assert all(t.finish_reason in ("answer", "length", "max_turns") and sum(t.action_mask) > 0 for t in trajs)


@pytest.mark.integration
def test_the_same_row_twice_in_one_batch(setup):
    """A prompt window that crosses an epoch boundary can hold a row twice: each copy gets its own environments."""
    row = {"id": "dup", "prompt": "What is 12 + 30?", "answer": "42"}
    groups, _ = setup[1].sample([row, row], group_size=2, temperature=1.0, seed=4)
    assert [len(g.trajectories) for g in groups] == [2, 2]
    assert all(g.prompt_id == "dup" for g in groups)


@pytest.mark.long
def test_the_ipc_handoff_benchmark_runs_on_a_cpu(local_ray, tmp_path):
    """The weight_sync benchmark's ipc_handoff mode (the colocated handoff's s/GB, docs/learner_speed.md) at a small
    shape: both transports through the real sender, receiver and torch engine actor leave the engine holding the
    learner's weights. On a CPU the IPC reduction carries the bytes: this checks the path, the GPU run measures it."""
    import argparse
    import sys

    root = Path(__file__).resolve().parents[2]
    sys.path.insert(0, str(root / "benchmarks"))
    from suite.weight_sync import ipc_handoff  # its actor class travels by value: workers need not import it

    ipc_handoff.build_model(tmp_path / "model", "tiny", "cpu")
    args = argparse.Namespace(device="cpu", repeats=1, bucket_mb=1)
    out = ipc_handoff.handoffs(args, "tiny", tmp_path / "model")
    assert out["tensors"] > 20 and out["gb"] > 0
    for transport in ("ipc", "object_store"):
        assert out[transport]["engine_equals_learner"], out[transport]["mismatched"]
        assert len(out[transport]["s"]) == 1 and out[transport]["s_per_gb"] > 0
