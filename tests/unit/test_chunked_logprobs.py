"""Chunked log-probabilities from hidden states equal the unchunked ones, values and gradients."""

import pytest
import torch

from agentrl_ray.learner.levers import chunked_logprobs
from agentrl_ray.learner.levers.chunked_logprobs import chunk_tokens_for, hidden_token_logprobs
from agentrl_ray.learner.logprobs import token_logprobs_and_entropy


def _case(dtype, bsz=3, seqlen=9, width=16, vocab=50, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(bsz, seqlen, width, generator=g, dtype=dtype, requires_grad=True)
    weight = torch.randn(vocab, width, generator=g, dtype=dtype, requires_grad=True)
    ids = torch.randint(0, vocab, (bsz, seqlen), generator=g)
    upstream = torch.randn(bsz, seqlen, generator=g, dtype=dtype)  # a loss weighting every position differently
    return hidden, weight, ids, upstream


def _grads(fn, hidden, weight, ids, upstream):
    logp, ent = fn(hidden, weight, ids)
    (logp * upstream).sum().backward()
    out = (logp.detach(), ent, hidden.grad.clone(), weight.grad.clone())
    hidden.grad = weight.grad = None
    return out


def _unchunked(temperature):
    return lambda h, w, ids: token_logprobs_and_entropy(h @ w.T, ids, True, temperature=temperature)


KEEP = pytest.mark.parametrize("keep_bytes", [None, 0], ids=["kept", "recomputed"])


@pytest.mark.parametrize("chunk", [1, 4, 7, 1000])
@pytest.mark.parametrize("temperature", [1.0, 0.7])
@KEEP
def test_equals_unchunked_in_float64(chunk, temperature, keep_bytes):
    case = _case(torch.float64)
    ref = _grads(_unchunked(temperature), *case)
    fn = lambda h, w, ids: hidden_token_logprobs(h, w, ids, temperature=temperature, chunk=chunk, keep_bytes=keep_bytes)  # noqa: E731
    got = _grads(fn, *case)
    for name, a, b in zip(("logprobs", "entropy", "d hidden", "d weight"), got, ref):
        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10, msg=name)
    assert got[0][:, 0].eq(0).all() and got[1][:, 0].eq(0).all()  # position 0 has no prediction


@pytest.mark.parametrize("chunk", [2, 1000])
@KEEP
def test_only_needed_positions_are_computed_and_they_equal_the_full_ones(chunk, keep_bytes, monkeypatch):
    """`needed` (a prompt and padding left out): the needed positions' values and every gradient equal those of the
    full computation read through the same mask; the others are 0 and the head sees only the needed rows."""
    hidden, weight, ids, upstream = _case(torch.float64)
    needed = torch.zeros(ids.shape, dtype=torch.bool)
    needed[0, 3:] = needed[1, 5:7] = True  # row 2 needs nothing (a filler micro-batch row)
    masked = upstream * needed
    ref = _grads(_unchunked(1.0), hidden, weight, ids, masked)
    fn = lambda h, w, i: hidden_token_logprobs(h, w, i, chunk=chunk, needed=needed, keep_bytes=keep_bytes)  # noqa: E731
    head_rows = []
    scaled = chunked_logprobs._scaled_logits
    monkeypatch.setattr(chunked_logprobs, "_scaled_logits", lambda h, *a: head_rows.append(len(h)) or scaled(h, *a))
    got = _grads(fn, hidden, weight, ids, masked)
    passes = 1 if keep_bytes is None else 2  # forward (and backward's recompute where nothing is kept)
    assert sum(head_rows) == passes * int(needed[:, 1:].sum())  # needed rows only
    torch.testing.assert_close(got[0][needed], ref[0][needed], rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(got[1][needed], ref[1][needed], rtol=1e-10, atol=1e-10)
    assert got[0][~needed].eq(0).all() and got[1][~needed].eq(0).all()
    torch.testing.assert_close(got[2], ref[2], rtol=1e-10, atol=1e-10, msg="d hidden")
    torch.testing.assert_close(got[3], ref[3], rtol=1e-10, atol=1e-10, msg="d weight")
    assert got[2][2].eq(0).all() and got[2][0, :2].eq(0).all()  # no gradient reaches what was not scored


def test_nothing_needed_gives_zeros_and_a_connected_graph():
    hidden, weight, ids, _ = _case(torch.float32)
    logp, _ = hidden_token_logprobs(hidden, weight, ids, False, needed=torch.zeros(ids.shape, dtype=torch.bool))
    logp.sum().backward()
    assert logp.eq(0).all() and hidden.grad.eq(0).all()


@KEEP
def test_gradcheck(keep_bytes):
    h, w, ids, _ = _case(torch.float64, bsz=2, seqlen=4, width=5, vocab=7)
    fn = lambda h, w: hidden_token_logprobs(h, w, ids, False, temperature=0.9, chunk=3, keep_bytes=keep_bytes)[0]  # noqa: E731
    assert torch.autograd.gradcheck(fn, (h, w))


def test_probabilities_are_kept_only_within_the_budget_and_only_for_training(monkeypatch):
    """Forward keeps the (n, V) probabilities when they fit `keep_bytes` and a gradient will be taken; else
    backward recomputes the logits (counted through the head's matmul)."""
    h, w, ids, up = _case(torch.float32, bsz=2, seqlen=5, vocab=40)
    n = 2 * 4  # scored rows
    calls = []
    scaled = chunked_logprobs._scaled_logits
    monkeypatch.setattr(chunked_logprobs, "_scaled_logits", lambda x, *a: calls.append(len(x)) or scaled(x, *a))
    for budget, passes in ((n * 40 * 4, 1), (n * 40 * 4 - 1, 2)):
        calls.clear()
        (hidden_token_logprobs(h, w, ids, chunk=3, keep_bytes=budget)[0] * up).sum().backward()
        assert sum(calls) == passes * n, (budget, calls)
    with torch.no_grad():  # nothing to keep for: no (n, V) buffer is built
        calls.clear()
        logp, ent = hidden_token_logprobs(h, w, ids, chunk=3, keep_bytes=1 << 30)
    assert sum(calls) == n and not logp.requires_grad
    assert chunked_logprobs.keep_bytes_for(torch.device("cpu")) > 0


def test_a_gpu_keeps_at_most_a_quarter_of_its_free_memory(monkeypatch):
    """On a GPU the kept probabilities' budget is CUDA_KEEP_BYTES, or a quarter of the memory free at the call (the
    driver's free bytes and the caching allocator's unused blocks) where that is less; CUDA_KEEP_BYTES = 0 turns
    keeping off. The CUDA queries are stood in for: this checks the rule, a GPU run checks the rest."""
    gib = 1 << 30
    state = {"free": 60 * gib, "reserved": 30 * gib, "allocated": 26 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (state["free"], 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: state["reserved"])
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: state["allocated"])
    cuda = torch.device("cuda", 0)
    assert chunked_logprobs.keep_bytes_for(cuda) == chunked_logprobs.CUDA_KEEP_BYTES == 8 * gib
    state["free"] = 10 * gib  # (10 + 4) / 4
    assert chunked_logprobs.keep_bytes_for(cuda) == int(3.5 * gib)
    state["free"], state["allocated"] = 0, 30 * gib
    assert chunked_logprobs.keep_bytes_for(cuda) == 0
    monkeypatch.setattr(chunked_logprobs, "CUDA_KEEP_BYTES", 0)
    state["free"] = 60 * gib
    assert chunked_logprobs.keep_bytes_for(cuda) == 0


def test_kept_bf16_probabilities_give_a_confident_token_its_gradient():
    """With bfloat16 kept probabilities a confident target's 1 - p(y) (~1e-3, below bfloat16's resolution at 1)
    still comes from the float32 log-prob: the hidden states' gradient matches the recomputing path's to bfloat16
    rounding, also at the confident token."""
    g = torch.Generator().manual_seed(3)
    vocab, width = 300, 32
    w = torch.randn(vocab, width, generator=g)
    h = torch.randn(1, 6, width, generator=g)
    ids = torch.randint(0, vocab, (1, 6), generator=g)
    h[0, 2] = w[ids[0, 3]] * 0.5  # position 2 predicts token 3 with p ~ 1 - 1e-3
    out = []
    for keep_bytes in (0, 1 << 30):
        hh = h.clone().requires_grad_(True)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logp, _ = hidden_token_logprobs(hh, w, ids, chunk=4, keep_bytes=keep_bytes)
        logp.sum().backward()
        out.append((logp.detach(), hh.grad))
    (ref_logp, ref_grad), (logp, grad) = out
    assert -5e-3 < ref_logp[0, 3] < -1e-4  # confident, and 1 - p(y) is not 0 in float32
    torch.testing.assert_close(logp, ref_logp, rtol=0, atol=0)  # forward is the same computation
    torch.testing.assert_close(grad, ref_grad, rtol=2e-2, atol=1e-3)
    # at the confident token the gradient is tiny but must keep its size and direction: bf16(p(y)) rounds to 1
    rel = (grad[0, 2] - ref_grad[0, 2]).norm() / ref_grad[0, 2].norm()
    assert rel < 0.05, rel


def test_frozen_head_gets_no_gradient():
    h, w, ids, up = _case(torch.float32)
    w.requires_grad_(False)
    logp, _ = hidden_token_logprobs(h, w, ids, chunk=5)
    (logp * up).sum().backward()
    assert w.grad is None and h.grad is not None and h.grad.abs().sum() > 0


def test_bf16_autocast_matches_the_model_head_under_autocast():
    """Under autocast the head matmul runs in bfloat16, as the model's own lm_head would: same values as the
    unchunked path on bf16 logits, softmax math in float32."""
    h, w, ids, up = _case(torch.float32, vocab=300)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        ref = _grads(_unchunked(1.0), h, w, ids, up)
        got = _grads(lambda h, w, ids: hidden_token_logprobs(h, w, ids, chunk=5), h, w, ids, up)
    assert got[0].dtype == torch.float32
    for name, a, b in zip(("logprobs", "entropy", "d hidden", "d weight"), got, ref):
        torch.testing.assert_close(a, b, rtol=2e-2, atol=2e-2, msg=name)


def test_chunk_size_bounds_temporaries():
    assert chunk_tokens_for(151936) == (1 << 24) // 151936
    assert chunk_tokens_for(10**9) == 16


def test_policy_hook_on_a_lora_model_equals_its_full_logits():
    """The learner's path (head made the identity, chunked head on the hidden states) on a real PEFT-wrapped Qwen2
    gives the model's own full-logits log-probs, and the same LoRA gradients."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl_ray.learner.policy import hidden_states_out, model_head

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = get_peft_model(Qwen2ForCausalLM(cfg), LoraConfig(r=4, target_modules=["q_proj", "v_proj"]))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)  # a nonzero adapter, so that its effect is checked
    ids, mask = torch.randint(0, 97, (3, 11)), torch.ones(3, 11, dtype=torch.long)
    head = model_head(model)
    assert head is not None and not head.weight.requires_grad

    def run(chunked):
        if chunked:
            with hidden_states_out(head):
                hidden = model(input_ids=ids, attention_mask=mask).logits
            out = hidden_token_logprobs(hidden, head.weight, ids, chunk=4)
        else:
            out = token_logprobs_and_entropy(model(input_ids=ids, attention_mask=mask).logits, ids)
        out[0].sum().backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        model.zero_grad()
        return out, grads

    (lp_a, ent_a), grads_a = run(True)
    (lp_b, ent_b), grads_b = run(False)
    assert head.forward.__func__ is torch.nn.Linear.forward  # the identity is gone after the call
    torch.testing.assert_close(lp_a, lp_b, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(ent_a, ent_b, rtol=1e-5, atol=1e-5)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 8
    for n in grads_a:
        torch.testing.assert_close(grads_a[n], grads_b[n], rtol=1e-4, atol=1e-5, msg=n)


def test_lora_on_a_bf16_base_trains_a_float32_adapter():
    """The learner loads a LoRA run's frozen base in bfloat16 (learner.bf16): PEFT must keep the trained adapter in
    float32, and the chunked path must give it float32 gradients."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl_ray.learner.policy import hidden_states_out, model_head

    cfg = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=1, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = get_peft_model(Qwen2ForCausalLM(cfg).to(torch.bfloat16), LoraConfig(r=4, target_modules=["q_proj"]))
    trained = [p for p in model.parameters() if p.requires_grad]
    assert trained and all(p.dtype == torch.float32 for p in trained)
    ids = torch.randint(0, 97, (2, 7))
    head = model_head(model)
    with torch.autocast("cpu", dtype=torch.bfloat16), hidden_states_out(head):
        hidden = model(input_ids=ids).logits
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logp, _ = hidden_token_logprobs(hidden, head.weight, ids)
    logp.sum().backward()
    assert logp.dtype == torch.float32 and torch.isfinite(logp).all()
    assert all(p.grad is not None and p.grad.dtype == torch.float32 for p in trained)


def test_fused_chunks_equal_the_eager_ones():
    """`fused` (learner.compile): each chunk's softmax math compiled by torch.compile gives the eager path's
    log-probs, entropy and gradients, at a temperature, with a short last chunk (dynamic shapes) and `needed`."""
    case = _case(torch.float32, bsz=2, seqlen=13, width=16, vocab=60)
    needed = torch.rand(2, 13, generator=torch.Generator().manual_seed(1)) > 0.3

    def run(fused):
        return lambda h, w, ids: hidden_token_logprobs(h, w, ids, temperature=0.8, chunk=5, needed=needed, fused=fused)

    ref = _grads(run(False), *case)
    got = _grads(run(True), *case)
    # float32 sums in another order; the entropy (lse - sum p*z, |z| ~ 10 here) loses the most to cancellation
    for name, a, b, tol in zip(("logprobs", "entropy", "d hidden", "d weight"), got, ref, (1e-5, 3e-4, 1e-5, 1e-5)):
        torch.testing.assert_close(a, b, rtol=tol, atol=tol, msg=name)


def test_chunks_are_larger_on_a_gpu_and_an_amx_cpu():
    """A GPU's chunk keeps the head's matmul large (883 tokens at Qwen2.5's vocabulary), and so does a CPU with AMX's;
    another CPU's is 110 tokens. Without `amx` it is read from this machine's /proc/cpuinfo."""
    from agentrl_ray.infra.hardware import this_cpu

    cpu = torch.device("cpu")
    assert chunk_tokens_for(151936, chunked_logprobs.chunk_elements_for(torch.device("cuda"))) == 883
    assert chunk_tokens_for(151936, chunked_logprobs.chunk_elements_for(cpu, amx=True)) == 883
    assert chunk_tokens_for(151936, chunked_logprobs.chunk_elements_for(cpu, amx=False)) == 110
    here = chunked_logprobs.chunk_elements_for(cpu)
    assert here == chunked_logprobs.chunk_elements_for(cpu, amx="amx_tile" in this_cpu().flags)


def test_a_right_padded_batch_needs_no_mask():
    """What the learner relies on to drop the mask: under causal attention, a right-padded batch's real
    positions get the same log-probs with and without the attention mask; other paddings are not `right_padded`."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    from agentrl_ray.learner.policy import right_padded

    torch.manual_seed(0)
    cfg = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    model = Qwen2ForCausalLM(cfg).eval()
    lengths = torch.tensor([11, 6, 9])
    mask = (torch.arange(11)[None] < lengths[:, None]).long()  # (3, 11): ones, then zeros
    ids = torch.randint(1, 97, (3, 11)) * mask
    assert right_padded(mask)
    assert not right_padded(mask.flip(1))  # left padding
    assert not right_padded(torch.tensor([[1, 0, 1, 1]]))
    with torch.no_grad():
        masked = token_logprobs_and_entropy(model(input_ids=ids, attention_mask=mask).logits, ids)[0]
        unmasked = token_logprobs_and_entropy(model(input_ids=ids).logits, ids)[0]
    torch.testing.assert_close(unmasked[mask.bool()], masked[mask.bool()], rtol=1e-5, atol=1e-5)


def _tiny_lora_bf16(seed=0):
    """A 2-layer Qwen2 in bfloat16 with a nonzero float32 LoRA on every linear kind (the CPU learner's lorabf16)."""
    from peft import LoraConfig, get_peft_model
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(seed)
    cfg = Qwen2Config(
        vocab_size=97, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, tie_word_embeddings=True,
    )  # fmt: skip
    kinds = ["q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"]
    model = get_peft_model(Qwen2ForCausalLM(cfg).to(torch.bfloat16), LoraConfig(r=4, target_modules=kinds))
    for n, p in model.named_parameters():
        if "lora_B" in n:
            torch.nn.init.normal_(p, std=0.1)
    return model


def _lora_logprobs_and_grads(model, ids, mask, upstream):
    """The learner's bf16 LoRA path (autocast, chunked head on the hidden states): log-probs and adapter grads."""
    from agentrl_ray.learner.policy import hidden_states_out, model_head

    head = model_head(model)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        with hidden_states_out(head):
            hidden = model(input_ids=ids, attention_mask=mask).logits
        logp, _ = hidden_token_logprobs(hidden, head.weight, ids, chunk=5)
    (logp * upstream).sum().backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
    model.zero_grad()
    return logp.detach(), grads


def test_uncast_adapter_inputs_compute_the_same_numbers():
    """`keep_adapter_inputs_uncast` (the learner under bf16 autocast): PEFT no longer casts each adapted layer's
    bfloat16 input to float32 for autocast to cast back, and log-probs and every adapter gradient are bit-identical
    to PEFT's casting path (both casts are exact)."""
    from peft.tuners.tuners_utils import BaseTunerLayer

    from agentrl_ray.learner.policy import keep_adapter_inputs_uncast

    model = _tiny_lora_bf16()
    ids, mask = torch.randint(1, 97, (3, 11)), torch.ones(3, 11, dtype=torch.long)
    upstream = torch.randn(3, 11)
    logp_a, grads_a = _lora_logprobs_and_grads(model, ids, mask, upstream)
    keep_adapter_inputs_uncast(model)
    layers = [m for m in model.modules() if isinstance(m, BaseTunerLayer)]
    assert len(layers) == 14 and not any(m.cast_input_dtype_enabled for m in layers)
    logp_b, grads_b = _lora_logprobs_and_grads(model, ids, mask, upstream)
    assert torch.equal(logp_a, logp_b)
    assert grads_a.keys() == grads_b.keys() and len(grads_a) == 28
    for n in grads_a:
        assert grads_a[n].dtype == torch.float32 and torch.equal(grads_a[n], grads_b[n]), n


def test_a_right_padded_bf16_lora_batch_trains_the_same_without_its_mask():
    """The CPU learner drops a right-padded batch's mask: in bfloat16 under autocast, with LoRA, the log-probs at
    real positions and the adapter gradients of a loss over them are the masked run's (float rounding aside)."""
    model = _tiny_lora_bf16(seed=1)
    lengths = torch.tensor([11, 8, 10])
    mask = (torch.arange(11)[None] < lengths[:, None]).long()  # (3, 11)
    ids = torch.randint(1, 97, (3, 11)) * mask
    upstream = torch.randn(3, 11) * mask  # a loss over the real positions only, as the learner's
    logp_m, grads_m = _lora_logprobs_and_grads(model, ids, mask, upstream)
    logp_u, grads_u = _lora_logprobs_and_grads(model, ids, None, upstream)
    real = mask.bool()
    torch.testing.assert_close(logp_u[real], logp_m[real], rtol=1e-2, atol=1e-2)
    for n in grads_m:
        gm, gu = grads_m[n], grads_u[n]
        assert (gu - gm).norm() <= 1e-2 * gm.norm() + 1e-6, n
