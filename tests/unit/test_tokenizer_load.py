"""A folder the project made loads its tokenizer by the class it records, without `AutoTokenizer`'s ~10 CPU-seconds
of imports (builtin/tokenizer.py): the same class, ids and chat template as `AutoTokenizer` gives; any other folder
still goes through `AutoTokenizer`."""

import shutil
import subprocess
import sys

from transformers import AutoTokenizer

from agentrl_ray.builtin.tokenizer import load_tokenizer, recorded_class

TOOL = {
    "type": "function",
    "function": {
        "name": "calculator",
        "description": "Evaluate an arithmetic expression.",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}
CONVERSATION = [
    {"role": "user", "content": "What is 347 * 29?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "calculator", "arguments": {"expression": "347 * 29"}}}
        ],
    },
    {"role": "tool", "content": "10063"},
]
TEXTS = ["hello 123\n<|im_end|> world", " 90 * 43 = 3870\n\n", "naïve café ☕ <tool_call>{}</tool_call>"]


def same_as_auto(folder) -> None:
    ours, auto = load_tokenizer(str(folder)), AutoTokenizer.from_pretrained(folder)
    assert type(ours) is type(auto)
    assert ours(TEXTS, add_special_tokens=False)["input_ids"] == auto(TEXTS, add_special_tokens=False)["input_ids"]
    assert (ours.eos_token_id, ours.pad_token_id, ours.bos_token_id) == (
        auto.eos_token_id,
        auto.pad_token_id,
        auto.bos_token_id,
    )
    for kwargs in ({"tools": [TOOL], "add_generation_prompt": True}, {"add_generation_prompt": False}):
        assert ours.apply_chat_template(CONVERSATION, tokenize=False, **kwargs) == auto.apply_chat_template(
            CONVERSATION, tokenize=False, **kwargs
        )


def test_the_shipped_model_loads_its_recorded_class_as_auto_tokenizer_would(builtin_model_path):
    assert recorded_class(builtin_model_path) == "Qwen2Tokenizer"
    same_as_auto(builtin_model_path)


def test_the_converted_real_model_loads_its_recorded_class_as_auto_tokenizer_would(smollm2_path):
    assert recorded_class(str(smollm2_path)) is not None
    same_as_auto(smollm2_path)


def test_a_folder_the_project_did_not_make_goes_through_auto_tokenizer(builtin_model_path, tmp_path):
    copy = shutil.copytree(builtin_model_path, tmp_path / "users-model")
    assert recorded_class(str(copy)) is None
    same_as_auto(copy)


def test_the_drivers_tokenizer_imports_neither_torch_nor_the_auto_classes(builtin_model_path):
    probe = (
        "import sys\n"
        "from agentrl_ray.builtin.resolve import resolve_model\n"
        "from agentrl_ray.run import preflight\n"
        "preflight.load_tokenizer(resolve_model('builtin:tiny'))\n"
        "print(sorted(m for m in ('torch', 'transformers.models.auto.configuration_auto') if m in sys.modules))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"
