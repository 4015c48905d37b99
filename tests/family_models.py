"""Model folders that speak another family's chat template, and the calculator conversations that teach them to call.

The built-in tiny model copied, its tokenizer given the template TRL ships for the family (`trl/chat_templates/`),
the family's special tokens added as single tokens (the embeddings resized where the vocabulary grows) and its turn's
end as the eos, saved with `save_pretrained`: vLLM and the learner load it as any Hugging Face folder. The families'
system prompts (the tools' JSON, the format's instructions) are 750-1000 tokens on the built-in tokenizer, past its
512 positions; RoPE has no learned positions, so the folder states 2048.

`pytest` puts this folder on sys.path (it holds the root conftest.py), so tests import it as `family_models`.
"""

from __future__ import annotations

import json
import random
from pathlib import Path

import trl

from agentrl_ray.tasks import arithmetic

TEMPLATES = Path(trl.__file__).parent / "chat_templates"
POSITIONS = 2048


def _family(template: str, tokens: list[str], eos: str) -> dict:
    return {"template": template, "tokens": tokens, "eos": eos}


# rollout.tool_format -> the template its test model carries, the special tokens it adds and the eos.
FAMILIES = {
    "llama3_json": _family(
        "llama3_2",
        ["<|begin_of_text|>", "<|start_header_id|>", "<|end_header_id|>", "<|eot_id|>", "<|python_tag|>"],
        "<|eot_id|>",
    ),
    "qwen3_xml": _family("qwen3_5_nothink", ["<|im_start|>", "<|im_end|>"], "<|im_end|>"),
    "openai": _family(
        "gptoss",
        ["<|start|>", "<|end|>", "<|message|>", "<|channel|>", "<|constrain|>", "<|return|>", "<|call|>"],
        "<|return|>",
    ),
}


def write_family_model(tool_format: str, out: Path) -> Path:
    """The built-in model as a `tool_format` model folder at `out` (see the module's docstring)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from agentrl_ray.builtin.model import ensure_builtin_model

    spec = FAMILIES[tool_format]
    source = str(ensure_builtin_model())
    tok = AutoTokenizer.from_pretrained(source)
    tok.chat_template = (TEMPLATES / f"{spec['template']}.jinja").read_text()
    tok.add_special_tokens({"additional_special_tokens": spec["tokens"]})
    tok.add_special_tokens({"eos_token": spec["eos"]})
    tok.model_max_length = POSITIONS
    model = AutoModelForCausalLM.from_pretrained(source)
    if len(tok) > model.get_input_embeddings().num_embeddings:
        model.resize_token_embeddings(len(tok))
    model.config.max_position_embeddings = POSITIONS
    model.config.eos_token_id = model.generation_config.eos_token_id = tok.eos_token_id
    model.save_pretrained(out)
    tok.save_pretrained(out)
    return out


def calculator_conversations(n: int, seed: int = 0) -> list[dict]:
    """`n` SFT rows on train questions of the built-in arithmetic task: `messages` (a structured calculator call, its
    result, the answer; the call's arguments a dict, as the families' templates read them, one type for Arrow since
    there is one tool) and `tools` (a JSON string, as TRL's SFTTrainer reads it). The template renders the call in
    its family's format."""
    from agentrl_ray.envs.builtin.calculator import CalculatorEnv
    from agentrl_ray.envs.tools import tool_schemas

    tools = tool_schemas(CalculatorEnv)
    rows = []
    for a, op, b in arithmetic.sample_problems(n, seed, "train"):
        value = arithmetic.evaluate(a, op, b)
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": f"{a} {op} {b}"}}}
        messages = [
            {"role": "user", "content": arithmetic.question(a, op, b)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": str(value)},
            {"role": "assistant", "content": f"The answer is {value}."},
        ]
        rows.append({"messages": messages, "tools": json.dumps(tools)})
    random.Random(seed).shuffle(rows)
    return rows


def write_calculator_sft(out: Path, n: int, seed: int = 0) -> Path:
    """`calculator_conversations` saved as the SFT dataset folder `agentrl-ray sft` reads."""
    from datasets import Dataset

    Dataset.from_list(calculator_conversations(n, seed)).save_to_disk(str(out))
    return out
