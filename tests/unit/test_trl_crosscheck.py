"""Our loss against TRL's GRPOTrainer (trl==1.16.0), on identical inputs: same loss (<= 1e-6) and same gradients.

TRL's own math runs: a real `GRPOTrainer` is built around a tiny Qwen2 model (saved to a temporary folder, with a
word-level tokenizer; no hub access) and its `_compute_loss(model, inputs)` is called on an `inputs` dict laid out
the way its `_generate_and_score_completions` lays one out. The only stand-in for its training loop is
`current_gradient_accumulation_steps`, which `Trainer` sets per accumulation window (the number of micro-batches).
Our side runs the same model's plain forward (TRL's patched forward keeps it when `fused_lm_head` is not passed)
through `token_logprobs_and_entropy` and `compute_loss`.

Mapping of TRL's loss types to our `loss_aggregation` (TRL loss per micro-batch, summed over the accumulation window):
- `dapo`:    sum over tokens / tokens of the whole generation batch              → `token_mean` (any split).
- `grpo`:    mean over the micro-batch's sequences of each one's token mean / #micro-batches
                                                                                  → `seq_mean_token_mean`; equal only
             when the micro-batches hold equally many sequences (TRL's always do).
- `dr_grpo`: sum / (micro-batch sequences * max_completion_length) / #micro-batches
                                                                                  → `seq_mean_token_sum_norm` with
             norm_constant = max_completion_length; again for equal-sized micro-batches.
- `bnpo`:    token mean of the MICRO-batch / #micro-batches                       → `token_mean` only when the step is
             one micro-batch: TRL normalizes by each micro-batch's own token count, we always by the step's (so our
             gradient does not depend on how the batch is split). Checked with one micro-batch.
- `importance_sampling_level="sequence"` → ours "sequence": TRL keeps one (B, 1) ratio exp(mean log-ratio) with its
  full gradient, ours is the GSPO-token form; values and gradients agree (checked with `grpo` and `dapo`).
- `beta > 0`: TRL's KL is k3 with the reference logprobs passed in `ref_per_token_logps` → ours `kl_estimator="k3"`.
Not cross-checked: TRL applies its truncated IS ratio (our `tis_cap`) only on its vLLM path, which needs a vLLM
generation backend; our TIS is covered by the hand-computed tests in test_algorithms.py. TRL has no ECHO term
(echo_coeff is 0 here).
"""

import pytest
import torch

pytest.importorskip("trl")

from datasets import Dataset  # noqa: E402
from tokenizers import Tokenizer, models, pre_tokenizers  # noqa: E402
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM  # noqa: E402
from trl import GRPOConfig, GRPOTrainer  # noqa: E402

from agentrl_ray.algorithms import LossNorm, compute_loss  # noqa: E402
from agentrl_ray.config import AlgorithmConfig  # noqa: E402
from agentrl_ray.learner.logprobs import token_logprobs_and_entropy  # noqa: E402
from agentrl_ray.types import TrainBatch  # noqa: E402

VOCAB, PROMPT_LEN, COMPLETION_LEN = 32, 3, 6
EPS_LOW, EPS_HIGH = 0.2, 0.28


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    folder = tmp_path_factory.mktemp("tiny_qwen2")
    vocab = {w: i for i, w in enumerate(["<pad>", "<eos>"] + [f"w{i}" for i in range(VOCAB - 2)])}
    tok = Tokenizer(models.WordLevel(vocab, unk_token="<pad>"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    PreTrainedTokenizerFast(tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>").save_pretrained(folder)
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=1,
    )
    Qwen2ForCausalLM(config).save_pretrained(folder)
    return str(folder)


def make_trainer(model_dir: str, tmp_path, loss_type: str, level: str, beta: float, accumulation: int) -> GRPOTrainer:
    args = GRPOConfig(
        output_dir=str(tmp_path / "trl"),
        report_to="none",
        use_cpu=True,
        bf16=False,  # TRL's default (bf16 autocast, on CPU too) would round the forward; ours runs in float32
        per_device_train_batch_size=4 // accumulation,
        gradient_accumulation_steps=accumulation,  # steps_per_generation defaults to the same
        num_generations=2,
        max_completion_length=COMPLETION_LEN,
        loss_type=loss_type,
        importance_sampling_level=level,
        beta=beta,
        use_bias_correction_kl=False,  # see the module docstring: GRPO's plain k3, not DeepSeek-V3.2's ratio * k3
        epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH,
    )
    trainer = GRPOTrainer(
        model=model_dir,
        reward_funcs=lambda completions, **kwargs: [0.0] * len(completions),
        args=args,
        train_dataset=Dataset.from_list([{"prompt": "w1 w2"}] * 4),
        processing_class=PreTrainedTokenizerFast.from_pretrained(model_dir),
    )
    trainer.model.train()
    trainer.current_gradient_accumulation_steps = accumulation  # what Trainer's loop sets for each window
    return trainer


def make_data(model) -> dict[str, torch.Tensor]:
    """Two prompts x two completions; completions of different lengths, some with tool-output tokens inside."""
    g = torch.Generator().manual_seed(1)
    b = 4
    prompt_ids = torch.randint(2, VOCAB, (b, PROMPT_LEN), generator=g)
    completion_ids = torch.randint(2, VOCAB, (b, COMPLETION_LEN), generator=g)
    lengths = torch.tensor([6, 2, 5, 3])
    completion_mask = (torch.arange(COMPLETION_LEN) < lengths.unsqueeze(1)).long()  # (B, C)
    completion_ids = completion_ids.masked_fill(completion_mask == 0, 0)
    tool_mask = torch.ones(b, COMPLETION_LEN, dtype=torch.long)  # 0 = tool output: not an action token
    tool_mask[0, 2:4] = 0
    tool_mask[2, 1] = 0
    input_ids = torch.cat([prompt_ids, completion_ids], dim=1)  # (B, P + C)
    attention_mask = torch.cat([torch.ones_like(prompt_ids), completion_mask], dim=1)
    with torch.no_grad():
        current, _ = token_logprobs_and_entropy(
            model(input_ids=input_ids, attention_mask=attention_mask).logits, input_ids
        )
    current = current[:, PROMPT_LEN:]  # (B, C)
    # Old and reference policies differ from the current one, enough to make some ratios clip at 0.8 / 1.28.
    old = current + 0.3 * torch.randn(b, COMPLETION_LEN, generator=g)
    ref = current + 0.3 * torch.randn(b, COMPLETION_LEN, generator=g)
    return dict(
        prompt_ids=prompt_ids,
        prompt_mask=torch.ones_like(prompt_ids),
        completion_ids=completion_ids,
        completion_mask=completion_mask,
        tool_mask=tool_mask,
        advantages=torch.tensor([0.8, -0.8, 1.1, -1.1]),
        old_per_token_logps=old,
        ref_per_token_logps=ref,
        num_items_in_batch=(completion_mask * tool_mask).sum(),
    )


def trl_loss_and_grads(trainer: GRPOTrainer, data: dict, beta: float, accumulation: int):
    """Run TRL's `_compute_loss` on each micro-batch of the accumulation window; sum losses, accumulate grads."""
    model = trainer.model
    model.zero_grad()
    total = 0.0
    for rows in torch.arange(4).chunk(accumulation):
        inputs = {k: (v if k == "num_items_in_batch" else v[rows]) for k, v in data.items()}
        if beta == 0:
            del inputs["ref_per_token_logps"]
        loss = trainer._compute_loss(model, inputs)
        loss.backward()
        total += loss.item()
    return total, {n: p.grad.clone() for n, p in model.named_parameters()}


def our_loss_and_grads(model, data: dict, cfg: AlgorithmConfig):
    """The full step as ONE micro-batch (split invariance is tested in test_algorithms.py)."""
    pad = torch.zeros(4, PROMPT_LEN)
    input_ids = torch.cat([data["prompt_ids"], data["completion_ids"]], dim=1)
    completion_action = (data["completion_mask"] * data["tool_mask"]).float()
    batch = TrainBatch(
        input_ids=input_ids,
        attention_mask=torch.cat([torch.ones_like(data["prompt_ids"]), data["completion_mask"]], dim=1),
        action_mask=torch.cat([pad, completion_action], dim=1),
        env_mask=torch.cat([pad, (data["completion_mask"] * (1 - data["tool_mask"])).float()], dim=1),
        rollout_logprobs=torch.cat([pad, data["old_per_token_logps"]], dim=1) * torch.cat([pad, completion_action], 1),
        advantages=data["advantages"],
        truncated=torch.zeros(4, dtype=torch.bool),
        policy_version=torch.zeros(4, dtype=torch.long),
    )
    norm = LossNorm(
        action_tokens=float(batch.action_mask.sum()),
        sequences=4.0,
        env_tokens=float(batch.env_mask.sum()),
        env_sequences=float((batch.env_mask.sum(1) > 0).sum()),
        norm_constant=float(COMPLETION_LEN),
        world_size=1,
    )
    model.zero_grad()
    logits = model(input_ids=input_ids, attention_mask=batch.attention_mask).logits
    logprobs, entropy = token_logprobs_and_entropy(logits, input_ids)
    ref = torch.cat([pad, data["ref_per_token_logps"]], dim=1)
    loss, metrics = compute_loss(
        logprobs, entropy, batch, cfg, norm, old_logprobs=batch.rollout_logprobs, echo_coeff=0.0, ref_logprobs=ref
    )
    loss.backward()
    return loss.item(), {n: p.grad.clone() for n, p in model.named_parameters()}, metrics


CASES = [
    # (TRL loss_type, importance_sampling_level, beta, micro-batches) → our loss_aggregation
    ("grpo", "token", 0.0, 2, "seq_mean_token_mean"),
    ("bnpo", "token", 0.0, 1, "token_mean"),
    ("dr_grpo", "token", 0.0, 2, "seq_mean_token_sum_norm"),
    ("dapo", "token", 0.0, 2, "token_mean"),
    ("grpo", "sequence", 0.0, 1, "seq_mean_token_mean"),
    ("dapo", "sequence", 0.0, 2, "token_mean"),
    ("dapo", "token", 0.04, 2, "token_mean"),
    ("bnpo", "token", 0.04, 1, "token_mean"),
    ("grpo", "sequence", 0.04, 2, "seq_mean_token_mean"),
]


@pytest.mark.parametrize("loss_type,level,beta,accumulation,aggregation", CASES, ids=lambda v: str(v))
def test_matches_trl(model_dir, tmp_path, loss_type, level, beta, accumulation, aggregation):
    trainer = make_trainer(model_dir, tmp_path, loss_type, level, beta, accumulation)
    data = make_data(trainer.model)
    trl_loss, trl_grads = trl_loss_and_grads(trainer, data, beta, accumulation)
    cfg = AlgorithmConfig(
        loss_aggregation=aggregation,
        importance_sampling_level=level,
        beta=beta,
        kl_estimator="k3",
        epsilon=EPS_LOW,
        epsilon_high=EPS_HIGH,
    )
    loss, grads, metrics = our_loss_and_grads(trainer.model, data, cfg)
    assert abs(loss - trl_loss) <= 1e-6, (loss, trl_loss)
    assert any(g.abs().sum() > 0 for g in grads.values())
    for name, grad in grads.items():
        torch.testing.assert_close(grad, trl_grads[name], atol=1e-6, rtol=1e-5, msg=name)
    if accumulation == 1 and level == "token":  # TRL logs one value per micro-batch; with one, it is the step's
        logged = {k: v[-1] for k, v in trainer._metrics["train"].items()}
        assert metrics["clip_frac_low"] == pytest.approx(logged["clip_ratio/low_mean"], abs=1e-6)
        assert metrics["clip_frac_high"] == pytest.approx(logged["clip_ratio/high_mean"], abs=1e-6)
        assert metrics["entropy"] == pytest.approx(logged["entropy"], abs=1e-5)
        if beta > 0:
            assert metrics["kl"] == pytest.approx(logged["kl"], abs=1e-6)


def test_clipping_is_exercised(model_dir):
    # The cross-check is only meaningful if some ratios leave [1 - eps, 1 + eps_high] on both sides.
    model = Qwen2ForCausalLM.from_pretrained(model_dir)
    data = make_data(model)
    input_ids = torch.cat([data["prompt_ids"], data["completion_ids"]], dim=1)
    with torch.no_grad():
        lp, _ = token_logprobs_and_entropy(model(input_ids=input_ids).logits, input_ids)
    mask = (data["completion_mask"] * data["tool_mask"]).bool()
    ratio = torch.exp(lp[:, PROMPT_LEN:] - data["old_per_token_logps"])[mask]
    assert (ratio < 1 - EPS_LOW).any() and (ratio > 1 + EPS_HIGH).any()
