"""The integrity checks (learner/integrity.py, rollout/continuity.py), each broken on purpose and seen caught:
a trajectory two versions stale under k=1; a separator token dropped between turns; a turn re-tokenized from its
text; an endpoint sequence that lost a token; a weight sync that skips one tensor (each tensor in turn); a LoRA
adapter the engine never loaded; and what a violation does to the health verdict, summary and a strict run.

The engines here are real (`TorchEngine` on the built model) or scripted where the ids must be known; the learner is
the real `Policy` after a real optimizer step. The same checks in a whole run: tests/ray/test_integrity_runs.py.
"""

from __future__ import annotations

import asyncio

import pytest
import torch
from builders import as_ray_train_rank_zero, trajectory
from test_agent_loop import CALL, LocalHandle, ScriptedEngine

from agentrl_ray.config import RolloutConfig
from agentrl_ray.envs.client import EnvClient
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.learner.integrity import Integrity, behaviour_gap, probe_gap, stale_groups
from agentrl_ray.rollout.agent_loop import Episode, run_episodes
from agentrl_ray.rollout.continuity import continuity_break
from agentrl_ray.rollout.endpoint.calls import Call, Choice
from agentrl_ray.rollout.endpoint.stitch import stitch
from agentrl_ray.types import RolloutTimings, TokenRole, TrajectoryGroup, role_masks

ANSWER = "The answer is 408.<|im_end|>"
PROMPT = "<|im_start|>user\nWhat is 12 * 34?<|im_end|>\n<|im_start|>assistant\n"


@pytest.fixture(scope="module")
def tok(builtin_model_path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(builtin_model_path)


def episode(tok, engine) -> Episode:
    """A real two-turn episode (a calculator call, its result, an answer) through the real agent loop."""
    host = EnvHost(tool_timeout_s=5)
    envs = EnvClient([LocalHandle(host)], "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {})
    prompt = tok.encode(PROMPT, add_special_tokens=False)
    cfg = RolloutConfig(max_turns=3, max_tokens_per_turn=64, max_total_tokens=400)

    async def go():
        await envs.create([("k", {})])
        ep = Episode("k", "p", 0, list(prompt), prompt_len=len(prompt))
        stops, timings = [tok.eos_token_id], RolloutTimings()
        await run_episodes([ep], engine, envs, tok, cfg, temperature=1.0, seed=0, stop_token_ids=stops, timings=timings)
        return ep

    return asyncio.run(go())


def check(ep: Episode, ids=None, roles=None, logprobs=None) -> str:
    ids, roles, logprobs = ids or ep.ids, roles or ep.roles, logprobs or ep.logprobs
    return continuity_break(ep.turns, ids, role_masks(roles)["action_mask"], logprobs)


# ---------------------------------------------------------------- policy version


def test_a_group_two_versions_stale_under_k1_is_dropped_and_named():
    fresh = TrajectoryGroup("p0", [trajectory("p0", policy_version=4)])
    one_behind = TrajectoryGroup("p1", [trajectory("p1", policy_version=4), trajectory("p1", 1, policy_version=3)])
    two_behind = TrajectoryGroup("p2", [trajectory("p2", policy_version=4), trajectory("p2", 1, policy_version=2)])
    kept, metrics, failure = stale_groups([fresh, one_behind, two_behind], version=4, max_staleness=1)
    assert [g.prompt_id for g in kept] == ["p0", "p1"]
    assert metrics == {"integrity/policy_version/max_lag": 2, "integrity/policy_version/dropped_groups": 1}
    assert "(p2)" in failure and "2 versions behind" in failure and "sync.max_staleness=1" in failure
    assert stale_groups([fresh, one_behind], version=4, max_staleness=1)[2] == ""
    assert stale_groups([one_behind], version=4, max_staleness=0)[1]["integrity/policy_version/dropped_groups"] == 1


# ---------------------------------------------------------------- token continuity


def test_the_agent_loop_keeps_every_turn_intact(tok):
    ep = episode(tok, ScriptedEngine(tok, [CALL, ANSWER]))
    assert len(ep.turns) == 2 and check(ep) == ""
    assert ep.turns[1].prompt[: len(ep.turns[0].prompt)] == ep.turns[0].prompt  # turn 2 extends turn 1


def test_a_separator_dropped_between_turns_is_caught_with_its_place(tok):
    ep = episode(tok, ScriptedEngine(tok, [CALL, ANSWER]))
    first = ep.turns[0]
    sep = len(first.prompt) + len(first.sampled)  # the first id after the sampled <|im_end|>: the template's "\n"
    assert tok.decode([ep.ids[sep]]) == "\n"
    drop = lambda xs: xs[:sep] + xs[sep + 1 :]  # noqa: E731
    found = check(ep, drop(ep.ids), drop(ep.roles), drop(ep.logprobs))
    assert found.startswith(f"turn 2: token {sep} is {ep.ids[sep + 1]} of the trained sequence")
    assert found.endswith(f"the engine's prompt had {ep.ids[sep]}")


def test_a_turn_re_tokenized_from_its_text_is_caught(tok):
    """The engine samples " answer" as two tokens (" ans" is not in the vocabulary: " " + "a" ...): a trainer that
    rebuilds the ids from the conversation's text gets the one-token spelling, not what was sampled."""
    canonical = tok.encode(ANSWER, add_special_tokens=False)
    split = tok.encode("The", add_special_tokens=False) + tok.encode(" ", add_special_tokens=False)
    split += tok.encode("answer", add_special_tokens=False) + canonical[2:]
    assert tok.decode(split) == tok.decode(canonical) and split != canonical

    class SplitAnswer(ScriptedEngine):
        def generate(self, prompts, max_tokens, **kw):
            if self.calls == 1:
                self.calls += 1
                return [type(g)(split, [-0.5] * len(split), "stop") for g in super().generate(prompts, max_tokens)]
            return super().generate(prompts, max_tokens, **kw)

    ep = episode(tok, SplitAnswer(tok, [CALL, ANSWER]))
    assert check(ep) == ""
    retokenized = tok.encode(tok.decode(ep.ids), add_special_tokens=False)
    assert len(retokenized) < len(ep.ids)
    n = len(ep.turns[1].prompt)
    roles = ep.roles[:n] + [TokenRole.ACTION] * (len(retokenized) - n)
    found = check(ep, retokenized, roles, ep.logprobs[: len(retokenized)])
    assert found.startswith(f"turn 2: token {n + 1} is") and "the engine sampled" in found


def test_shifted_log_probs_and_a_sampled_token_outside_the_loss_are_caught(tok):
    ep = episode(tok, ScriptedEngine(tok, [CALL, ANSWER]))
    shifted = ep.logprobs[1:] + [0.0]
    assert "the log-prob of token" in check(ep, logprobs=shifted)
    at = len(ep.turns[1].prompt) + 2
    roles = ep.roles[:at] + [TokenRole.TEMPLATE] + ep.roles[at + 1 :]
    found = check(ep, roles=roles)
    assert found == f"turn 2: token {at}, which the engine sampled, is not an action token of the trained sequence"


def test_the_endpoints_stitched_sequences_are_checked():
    def call(index, prompt, sampled, continues=None):
        choice = Choice(sampled, [-0.25] * len(sampled), "stop", {"role": "assistant", "content": ""}, True)
        roles = [TokenRole.PROMPT] * len(prompt)
        return Call(index, [], "null", prompt, roles, [0.0] * len(prompt), 0, [choice], continues)

    first = call(0, [1, 2, 3], [4, 5])
    second = call(1, [1, 2, 3, 4, 5, 6, 7], [8, 9], continues=(0, 0))  # + the tool result 6, 7
    (seq,) = stitch([first, second])
    assert seq.ids == [1, 2, 3, 4, 5, 6, 7, 8, 9] and seq.continuity_break() == ""
    seq.ids = seq.ids[:5] + seq.ids[6:]  # an assembly that loses the tool result's first token
    seq.roles, seq.logprobs = seq.roles[:5] + seq.roles[6:], seq.logprobs[:5] + seq.logprobs[6:]
    assert seq.continuity_break().startswith("turn 2: token 5 is 7 of the trained sequence, the engine's prompt had 6")


# ---------------------------------------------------------------- the weights probe


def _learner_and_engine(model_path, monkeypatch, overrides):
    from transformers import AutoTokenizer

    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.learner.policy import Policy
    from agentrl_ray.rollout.torch_engine import TorchEngine

    as_ray_train_rank_zero(monkeypatch, torch.device("cpu"))
    cfg = load_config("examples/calculator/config.yaml", ["learner.backend=ddp", *overrides])
    policy = Policy(model_path, cfg.model, cfg.learner, need_reference=False)
    engine = TorchEngine(model_path, dtype="float32", seed=0, max_model_len=256, max_num_seqs=4)
    rows = [{"prompt": "What is 12 * 34?"}, {"prompt": "What is 905 - 17?"}]
    integrity = Integrity(cfg, AutoTokenizer.from_pretrained(model_path), rows, rank=0)
    return cfg, policy, engine, integrity


def _one_step(policy, integrity, lr: float) -> None:
    """One real optimizer step (Adam moves every trainable element by ~lr on its first step)."""
    ids = torch.tensor([integrity.sequences[0]])  # (1, T)
    logprobs, _ = policy.token_logprobs(ids, torch.ones_like(ids), False)
    policy.backward(-logprobs[:, 1:].mean(), True)
    policy.step(lr)


def _gap(engine, integrity, policy) -> float:
    return probe_gap([engine.score(integrity.sequences)], integrity._learner_logprobs(policy))[0]


@pytest.mark.slow
def test_the_probe_catches_a_sync_that_skips_any_one_tensor(builtin_model_path, monkeypatch):
    cfg, policy, engine, integrity = _learner_and_engine(builtin_model_path, monkeypatch, [])
    assert integrity.band == 5e-5  # float32 on a CPU
    assert _gap(engine, integrity, policy) < integrity.band / 10  # the same weights
    before = {k: v.clone() for k, v in engine.model.state_dict().items()}
    _one_step(policy, integrity, cfg.learner.lr)
    named = policy.named_tensors_for_sync()
    engine.load_weights(named)
    assert _gap(engine, integrity, policy) < integrity.band / 10
    missed = []
    for name, _ in named:  # each tensor in turn is the one the sync left out
        engine.load_weights(named)
        engine.load_weights([(name, before[name])])
        if _gap(engine, integrity, policy) <= integrity.band:
            missed.append(name)
    assert not missed, missed


@pytest.mark.slow
def test_the_probe_catches_an_adapter_the_engine_never_loaded(builtin_model_path, monkeypatch):
    from agentrl_ray.sync.lora import merged_stream

    lora = ["learner.lora.enabled=true", "learner.lora.r=8"]
    cfg, policy, engine, integrity = _learner_and_engine(builtin_model_path, monkeypatch, lora)
    _one_step(policy, integrity, cfg.learner.lr)
    assert _gap(engine, integrity, policy) > integrity.band  # the base model: the adapter never applied
    engine.load_weights(merged_stream(builtin_model_path, dict(policy.named_tensors_for_sync()), policy.lora_scaling))
    assert _gap(engine, integrity, policy) < integrity.band


# ---------------------------------------------------------------- the behaviour gap, and what a violation does


def test_the_behaviour_gap_counts_only_the_on_policy_action_tokens():
    from types import SimpleNamespace

    batch = SimpleNamespace(
        policy_version=torch.tensor([3, 2]),
        action_mask=torch.tensor([[0, 1, 1], [0, 1, 1]]),
        rollout_logprobs=torch.tensor([[0.0, -1.0, -2.0], [0.0, -1.0, -2.0]]),
    )
    learner = torch.tensor([[-9.0, -1.5, -2.0], [0.0, -5.0, -5.0]])
    acc = [0.0, 0, 0.0]
    behaviour_gap(acc, learner, batch, version=3)
    assert acc == [0.5, 2, 0.5]  # row 1 was sampled by version 2: not judged; the prompt position never


def test_a_violation_warns_counts_and_under_strict_integrity_stops(tmp_path):
    from agentrl_ray.config import Config
    from agentrl_ray.learner.watch import RunWatch
    from agentrl_ray.types import RunStopped

    class Log:  # outputs.LogClient's rollouts(), dropped
        def rollouts(self, step, records, sample):
            pass

    for strict in (False, True):
        cfg = Config()
        cfg.run.output_dir, cfg.run.steps, cfg.run.strict_integrity = str(tmp_path), 5, strict
        cfg.run.rollout_sample_groups = 0
        rows = [{"id": "p0", "prompt": "q", "answer": "1"}]
        integrity = Integrity(cfg, None, [], rank=0)
        integrity.weights_failure = "mean |log-prob gap| 0.3 over the 5e-05 band on engine 0 after the sync"
        broken = trajectory("p0")
        broken.continuity_break = "turn 2: token 40 is 7 of the trained sequence, the engine's prompt had 6"
        watch = RunWatch(cfg, rows, Log(), integrity)
        metrics = {"reward/mean": 0.5}
        if strict:
            stop = r"^integrity check token_continuity: 1 trajectory\(ies\) .* prompt had 6 \(step 3; "
            with pytest.raises(RunStopped, match=stop):
                watch.after_step(3, [TrajectoryGroup("p0", [broken])], metrics)
        else:
            watch.after_step(3, [TrajectoryGroup("p0", [broken])], metrics)
        assert metrics["integrity/failures"] == 2 and metrics["integrity/token_continuity/broken"] == 1
        assert metrics["health/level"] == 1 and "; weights: mean |log-prob gap| 0.3" in metrics["health/reasons"]
        assert "integrity token_continuity: 1 trajectory(ies)" in metrics["health/reasons"]
        assert watch.finish(3, None)["first_integrity_failure"].startswith("step 3: token_continuity: 1")


@pytest.mark.slow
def test_the_probe_runs_on_a_bfloat16_lora_base(builtin_model_path, monkeypatch):
    """profile=lora with learner.bf16 keeps the frozen base in bfloat16 beside the float32 adapter: the probe's forward
    keeps the autocast there (without it the matmuls mixed dtypes and the 0.5B run stopped at its first probe)."""
    from agentrl_ray.sync.lora import merged_stream

    lora = ["learner.lora.enabled=true", "learner.lora.r=8", "learner.bf16=true"]
    cfg, policy, engine, integrity = _learner_and_engine(builtin_model_path, monkeypatch, lora)
    assert policy.mixed_weights and integrity.band == 0.15
    _one_step(policy, integrity, cfg.learner.lr)
    engine.load_weights(merged_stream(builtin_model_path, dict(policy.named_tensors_for_sync()), policy.lora_scaling))
    assert _gap(engine, integrity, policy) < integrity.band


def test_the_probe_gap_of_non_finite_log_probs_fails_instead_of_hiding():
    """A broken engine's NaN log-prob is an infinite gap (the check fails and the metric stays comparable, which a
    NaN mean would not); the same -inf on both sides is none."""
    inf = float("inf")
    assert probe_gap([[[-1.0, -inf]]], [[-1.0, -inf]]) == (0.0, 0.0, 0)
    mean, largest, engine = probe_gap([[[-1.0, -2.0]], [[float("nan"), -2.0]]], [[-1.0, -2.5]])
    assert mean == largest == inf and engine == 1
    assert probe_gap([[[-1.0, -inf]]], [[-1.0, -3.0]])[0] == inf
