"""The torch backend (`rollout/torch_engine.py`) keeps the engine contract: greedy output and log-probs equal the
model's own forward pass, each request's sampling depends on its seed only, stops and budgets end requests as
vLLM's do, and in-place loads change what it generates."""

import pytest
import torch
from transformers import AutoModelForCausalLM, Qwen2Config

from agentrl_ray.rollout.backends import engine_class
from agentrl_ray.rollout.torch_engine import TorchEngine, check_engine_kwargs

VOCAB = 97


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random 2-layer Qwen2 model (no tokenizer: the engine takes and returns token ids)."""
    torch.manual_seed(0)
    config = Qwen2Config(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        tie_word_embeddings=True,
    )
    path = tmp_path_factory.mktemp("tiny_qwen2")
    AutoModelForCausalLM.from_config(config).save_pretrained(path)
    return str(path)


@pytest.fixture(scope="module")
def engine(model_dir):
    return TorchEngine(model_dir, dtype="float32", seed=0, max_model_len=128, max_num_seqs=8)


PROMPTS = [[5, 6, 7, 8, 9], [11, 12], [3, 4, 5, 6, 7, 8, 9, 10, 11]]


def reference_greedy(model_dir, prompt, n):
    """Token by token with a plain forward pass over the whole sequence: ids and the raw log-prob of each."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    ids, lps = list(prompt), []
    with torch.no_grad():
        for _ in range(n):
            logits = model(torch.tensor([ids])).logits[0, -1].float()
            token = int(logits.argmax())
            lps.append(float(torch.log_softmax(logits, -1)[token]))
            ids.append(token)
    return ids[len(prompt) :], lps


def test_backend_is_chosen_by_name():
    assert engine_class("torch") is TorchEngine
    with pytest.raises(ValueError, match="rollout.backend='sglang'"):
        engine_class("sglang")


def test_greedy_tokens_and_logprobs_equal_the_models_forward(engine, model_dir):
    gens = engine.generate(PROMPTS, [6, 6, 6], temperature=0.0, top_p=1.0, stop_token_ids=[], ignore_eos=True)
    for prompt, gen in zip(PROMPTS, gens):  # left padding in a batch of three lengths
        ids, lps = reference_greedy(model_dir, prompt, 6)
        assert gen.token_ids == ids
        assert gen.logprobs == pytest.approx(lps, abs=1e-4)
        assert gen.finish_reason == "length"


def test_static_cache_gives_the_same_greedy_output(model_dir, engine):
    static = TorchEngine(
        model_dir, dtype="float32", seed=0, max_model_len=128, max_num_seqs=8, cache_implementation="static"
    )
    kwargs = dict(temperature=0.0, top_p=1.0, stop_token_ids=[], ignore_eos=True)
    assert [g.token_ids for g in static.generate(PROMPTS, [5] * 3, **kwargs)] == [
        g.token_ids for g in engine.generate(PROMPTS, [5] * 3, **kwargs)
    ]


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
def test_a_requests_sample_depends_on_its_seed_not_its_batch(engine):
    kwargs = dict(temperature=1.0, top_p=1.0, stop_token_ids=[])
    together = engine.generate(PROMPTS, [12] * 3, seeds=[1, 2, 3], **kwargs)
    alone = engine.generate(PROMPTS[1:2], [12], seeds=[2], **kwargs)
    assert alone[0].token_ids == together[1].token_ids
    assert alone[0].logprobs == pytest.approx(together[1].logprobs, abs=1e-4)
    other = engine.generate(PROMPTS[1:2], [12], seeds=[99], **kwargs)
    assert other[0].token_ids != alone[0].token_ids  # 12 draws over 97 tokens: equal only by a fluke of ~1e-20


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
def test_sampling_follows_the_distribution(model_dir):
    """Many seeded draws of one first token: the empirical frequencies match softmax(logits / T), and top-p keeps
    only the nucleus."""
    engine = TorchEngine(model_dir, dtype="float32", seed=0, max_model_len=64, max_num_seqs=1000)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        logits = model(torch.tensor([PROMPTS[0]])).logits[0, -1]
    probs = torch.softmax(logits / 0.7, -1)
    n = 4000
    gens = engine.generate(
        [PROMPTS[0]] * n, [1] * n, temperature=0.7, top_p=1.0, stop_token_ids=[], seeds=list(range(n))
    )
    counts = torch.bincount(torch.tensor([g.token_ids[0] for g in gens]), minlength=VOCAB).float() / n
    assert (counts - probs).abs().max() < 0.03
    top = probs.sort(descending=True)
    nucleus = set(top.indices[: int((top.values.cumsum(0) < 0.5).sum()) + 1].tolist())
    picked = engine.generate(
        [PROMPTS[0]] * 200, [1] * 200, temperature=0.7, top_p=0.5, stop_token_ids=[], seeds=list(range(200))
    )
    assert {g.token_ids[0] for g in picked} <= nucleus


def test_stop_tokens_and_budgets_end_requests_like_vllm(engine):
    free = engine.generate(PROMPTS, [10] * 3, temperature=1.0, top_p=1.0, stop_token_ids=[], seeds=[7, 8, 9])
    stop = free[0].token_ids[3]  # a token request 0 samples at its 4th step
    gens = engine.generate(PROMPTS, [10, 4, 2], temperature=1.0, top_p=1.0, stop_token_ids=[stop], seeds=[7, 8, 9])
    first = free[0].token_ids.index(stop)
    assert gens[0].token_ids == free[0].token_ids[: first + 1]  # the stop token is kept, as vLLM does
    assert gens[0].finish_reason == "stop"
    for gen, budget, f in zip(gens[1:], (4, 2), free[1:]):
        expected = f.token_ids[:budget]
        if stop in expected:
            expected = expected[: expected.index(stop) + 1]
        assert gen.token_ids == expected
        assert len(gen.logprobs) == len(gen.token_ids)
        assert gen.finish_reason == ("stop" if expected[-1] == stop else "length")


def test_a_request_over_the_context_is_refused(engine):
    with pytest.raises(ValueError, match="max_model_len=128"):
        engine.generate([[1] * 120], [10], temperature=1.0, top_p=1.0, stop_token_ids=[])


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
def test_load_weights_in_place_changes_generation(model_dir):
    engine = TorchEngine(model_dir, dtype="float32", seed=0, max_model_len=128, max_num_seqs=8)
    kwargs = dict(temperature=0.0, top_p=1.0, stop_token_ids=[], ignore_eos=True)
    before = engine.generate(PROMPTS, [6] * 3, **kwargs)
    other = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    torch.manual_seed(1)
    with torch.no_grad():
        for p in other.parameters():
            p.add_(torch.randn_like(p))
    engine.load_weights(iter(other.state_dict().items()))  # a stream, lm_head.weight (tied) included
    after = engine.generate(PROMPTS, [6] * 3, **kwargs)
    assert [g.token_ids for g in after] != [g.token_ids for g in before]
    with torch.no_grad():
        for prompt, gen in zip(PROMPTS, after):
            ids = torch.tensor([prompt])
            for token in gen.token_ids:
                nxt = int(other(ids).logits[0, -1].argmax())
                assert nxt == token
                ids = torch.cat([ids, torch.tensor([[nxt]])], 1)
    with pytest.raises(ValueError, match="no tensor named model.layers.9"):
        engine.load_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(1))])
    with pytest.raises(ValueError, match="has shape"):
        engine.load_weights([("model.norm.weight", torch.zeros(3))])


def test_engine_kwargs_are_checked():
    assert check_engine_kwargs({"cache_implementation": "static", "compile": True}) == {
        "cache_implementation": "static",
        "compile": True,
    }
    with pytest.raises(ValueError, match="engine_kwargs.block_size is not an argument of the torch backend"):
        check_engine_kwargs({"block_size": 32})
    with pytest.raises(ValueError, match="cache_implementation='paged'"):
        check_engine_kwargs({"cache_implementation": "paged"})


def test_sleep_needs_a_device(model_dir):
    with pytest.raises(ValueError, match="no device memory"):
        TorchEngine(model_dir, dtype="float32", seed=0, max_model_len=64, max_num_seqs=2, sleep=True)
