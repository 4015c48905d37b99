"""`learner.compile`: each decoder layer compiled in place (torch.compile, inductor on this CPU) computes what the
eager layers compute, log-probabilities and LoRA gradients included, across sequence lengths, and keeps the
parameter names that checkpoints and weight sync read. Real inductor: it compiles C++ here."""

from __future__ import annotations

import pytest
import torch

from agentrl_ray.config import ConfigError, LoraConfig
from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner.levers import compilation
from agentrl_ray.learner.levers.chunked_logprobs import hidden_token_logprobs
from agentrl_ray.learner.levers.compilation import COMPILE_AUTO_PARAMS, compile_layers, wants_compile
from agentrl_ray.learner.policy import enable_gradient_checkpointing, hidden_states_out, model_head


def _lora_model(path: str, checkpointing: bool = False):
    from peft import LoraConfig as PeftLora
    from peft import get_peft_model
    from transformers import AutoModelForCausalLM

    torch.manual_seed(0)
    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)
    if checkpointing:  # as the learner does it: before PEFT wraps the model
        enable_gradient_checkpointing(model)
    ours = LoraConfig()
    model = get_peft_model(
        model, PeftLora(r=ours.r, lora_alpha=ours.alpha, lora_dropout=0.0, target_modules=ours.target_modules)
    )
    for name, p in model.named_parameters():  # B starts at 0: move it so the adapter changes the output
        if "lora_B" in name:
            torch.nn.init.normal_(p, std=0.02)
    model.config.use_cache = False
    return model


def _logprobs_and_grads(model, ids: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    head = model_head(model)
    needed = torch.zeros(ids.shape, dtype=torch.bool)
    needed[:, 4:] = True
    with hidden_states_out(head):
        hidden = model(input_ids=ids, attention_mask=torch.ones_like(ids), use_cache=False).logits
    logp, _ = hidden_token_logprobs(hidden, head.weight, ids, needed=needed)
    model.zero_grad(set_to_none=True)
    (-(logp * needed).sum()).backward()
    grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.requires_grad}
    return logp.detach(), grads


def _assert_same_logprobs_and_grads(eager, compiled, ids: torch.Tensor) -> None:
    want_logp, want_grads = _logprobs_and_grads(eager, ids)
    got_logp, got_grads = _logprobs_and_grads(compiled, ids)
    torch.testing.assert_close(got_logp, want_logp, rtol=1e-4, atol=1e-4)
    assert got_grads.keys() == want_grads.keys() and len(got_grads) > 0
    for name, want in want_grads.items():
        # float32 sums in another order: the noise scales with the gradient's size (up to ~16 on the shipped model)
        scale = max(1.0, float(want.abs().max()))
        torch.testing.assert_close(got_grads[name], want, rtol=1e-3, atol=1e-5 * scale, msg=name)
        assert (got_grads[name] - want).norm() <= 1e-4 * want.norm() + 1e-8, name


@pytest.mark.long  # minutes of compiling or a benchmark's run: make test-all (docs/testing.md)
def test_compiled_layers_compute_what_eager_layers_compute(builtin_model_path):
    eager, compiled = _lora_model(builtin_model_path), _lora_model(builtin_model_path)
    names = [n for n, _ in compiled.named_parameters()]
    layers = compile_layers(compiled, torch.device("cpu"))
    assert layers == compiled.get_base_model().config.num_hidden_layers
    assert [n for n, _ in compiled.named_parameters()] == names  # checkpoints and weight sync see the same names
    assert compiled.state_dict().keys() == eager.state_dict().keys()
    gen = torch.Generator().manual_seed(1)
    for shape in [(2, 24), (3, 37), (1, 9)]:  # dynamic shapes: micro-batches of other sizes and lengths
        ids = torch.randint(10, 300, shape, generator=gen)
        _assert_same_logprobs_and_grads(eager, compiled, ids)
    # Every decoder layer's call goes through its compiled wrapper (nn.Module.compile), none was left eager.
    assert all(getattr(m, "_compiled_call_impl", None) is not None for m in _decoder_layers(compiled))


@pytest.mark.long  # minutes of compiling or a benchmark's run: make test-all (docs/testing.md)
def test_the_compiled_stack_computes_what_eager_layers_compute(builtin_model_path, monkeypatch):
    """COMPILE_SCOPE="stack": the module holding the decoder layers compiled as one graph (the benchmark's `stack`
    lever) gives the eager log-probs and gradients, under the same parameter names."""
    monkeypatch.setattr(compilation, "COMPILE_SCOPE", "stack")
    eager, compiled = _lora_model(builtin_model_path), _lora_model(builtin_model_path)
    names = [n for n, _ in compiled.named_parameters()]
    assert compile_layers(compiled, torch.device("cpu")) == compiled.get_base_model().config.num_hidden_layers
    assert [n for n, _ in compiled.named_parameters()] == names
    stack = compilation._stack_of(compiled, _decoder_layers(compiled))
    assert stack is compiled.get_base_model().model and stack._compiled_call_impl is not None
    assert all(getattr(m, "_compiled_call_impl", None) is None for m in _decoder_layers(compiled))
    ids = torch.randint(10, 300, (2, 24), generator=torch.Generator().manual_seed(1))
    _assert_same_logprobs_and_grads(eager, compiled, ids)


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
def test_compiled_layers_under_gradient_checkpointing(builtin_model_path):
    """learner.compile with learner.gradient_checkpointing: checkpointing wraps each compiled layer's call and runs
    it again in backward. Log-probabilities and LoRA gradients equal the eager, unchecked model's."""
    eager = _lora_model(builtin_model_path)
    compiled = _lora_model(builtin_model_path, checkpointing=True)
    assert compiled.get_base_model().is_gradient_checkpointing
    compile_layers(compiled, torch.device("cpu"))
    ids = torch.randint(10, 300, (2, 29), generator=torch.Generator().manual_seed(2))
    _assert_same_logprobs_and_grads(eager, compiled, ids)


def test_a_torch_without_the_compiler_search_skips_the_early_check(builtin_model_path, monkeypatch):
    """The early check uses a private torch function: a torch that has moved it must not make learner.compile fail
    at start with an ImportError; the layers are compiled all the same."""
    import sys

    monkeypatch.setitem(sys.modules, "torch._inductor.cpp_builder", None)  # `from ... import` raises ImportError
    model = _lora_model(builtin_model_path)
    assert compile_layers(model, torch.device("cpu")) == model.get_base_model().config.num_hidden_layers


def _decoder_layers(model):
    return list(model.get_base_model().model.layers)


def test_a_missing_cpp_compiler_is_reported_before_any_step(builtin_model_path):
    from torch._inductor import config as inductor_config
    from torch._inductor import cpp_builder

    # inductor's own patch(), not monkeypatch: monkeypatch's undo left `cpp.cxx` missing from inductor's config, and
    # every later CPU compile in the process failed ("torch._inductor.config.cpp.cxx does not exist")
    cpp_builder.cpp_compiler_search.cache_clear()
    try:
        with inductor_config.patch({"cpp.cxx": ("/nonexistent/g++",)}):
            with pytest.raises(RuntimeError, match="learner.compile=true on a CPU needs a C\\+\\+ compiler"):
                compile_layers(_lora_model(builtin_model_path), torch.device("cpu"))
    finally:
        cpp_builder.cpp_compiler_search.cache_clear()
    assert inductor_config.cpp.cxx != ("/nonexistent/g++",)


def test_compile_under_zero3_is_refused():
    with pytest.raises(ConfigError, match="learner.compile with DeepSpeed ZeRO-3 is not supported"):
        load_config(None, ["learner.compile=true", "learner.backend=deepspeed", "learner.zero_stage=3"])
    with pytest.raises(ConfigError, match="learner.compile with DeepSpeed ZeRO-3 is not supported"):
        load_config(None, ["learner.compile=1", "learner.backend=deepspeed", "learner.zero_stage=3"])  # 1 == True
    zero2 = load_config(None, ["learner.compile=true", "learner.backend=deepspeed", "learner.zero_stage=2"])
    assert zero2.learner.compile
    assert load_config(None, ["learner.backend=deepspeed", "learner.zero_stage=3"]).learner.compile == "auto"


def test_compile_auto_is_the_default_and_a_bad_value_is_named():
    assert load_config(None, []).learner.compile == "auto"
    with pytest.raises(ConfigError, match="learner.compile: 'sometimes' is not one of 'auto', True, False"):
        load_config(None, ["learner.compile=sometimes"])


def test_compile_auto_compiles_large_models_where_it_can_run(builtin_model_path, monkeypatch, caplog):
    """auto: the shipped model (a few million parameters) stays eager; the same model counted as large compiles on
    this CPU (a C++ compiler is here); a large one stays eager, saying why, without a compiler, under ZeRO-3 or on a
    4-bit base.
    true and false are as given."""
    model = _lora_model(builtin_model_path)
    cpu = torch.device("cpu")
    n = sum(p.numel() for p in model.parameters())
    assert n < COMPILE_AUTO_PARAMS
    assert not wants_compile("auto", model, cpu, partitioned=False, rank=0)
    assert wants_compile(True, model, cpu, partitioned=False, rank=0)
    assert not wants_compile(False, model, cpu, partitioned=False, rank=0)
    monkeypatch.setattr(compilation, "COMPILE_AUTO_PARAMS", n)  # as if it were a 0.5B model
    assert wants_compile("auto", model, cpu, partitioned=False, rank=0)
    with caplog.at_level("INFO", logger=compilation.log.name):
        assert not wants_compile("auto", model, cpu, partitioned=True, rank=0)
        assert not wants_compile("auto", model, cpu, partitioned=False, rank=0, quantized=True)
        monkeypatch.setattr(compilation, "_cpp_compiler_missing", lambda: True)
        assert not wants_compile("auto", model, cpu, partitioned=False, rank=0)
    assert "layers stay eager: DeepSpeed ZeRO-3" in caplog.text
    assert "layers stay eager: no C++ compiler" in caplog.text
    assert "layers stay eager: a 4-bit base" in caplog.text
