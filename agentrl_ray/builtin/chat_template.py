"""Tool calling for a ChatML model whose chat template has no tool section (SmolLM2's renders `tools=` not at all).

The rollout speaks the hermes format (`chat_format.py`): calls in `<tool_call>` JSON, results in `<tool_response>`
blocks of a user turn. A template that ignores `tools` shows the model no tools, and one that renders a `tool`
message as `<|im_start|>tool` disagrees with the tokens the rollout appends. `tool_template_for(tokenizer)` returns
the project's own ChatML template for such a model, which keeps the model's default system message and adds:

- with tools, a section of the system message (below, `TOOLS_HEADER`/`TOOLS_FOOTER`) listing each tool's OpenAI
  schema as one JSON line inside `<tools>` and saying how to call one;
- an assistant message's `tool_calls` as `<tool_call>\\n{"name": ..., "arguments": {...}}\\n</tool_call>` lines;
- consecutive `tool` messages as one user turn of `<tool_response>` blocks, exactly the tokens
  `chat_format.tool_response_segments` appends during a rollout (a test renders both and compares).

Models whose template renders tools already (Qwen2.5, our built-in models) keep their own.
"""

from __future__ import annotations

import json

PROBE_TOOL = "agentrl_template_probe"
TOOLS_HEADER = (
    "\n\n# Tools\n\nYou can call these functions. Their JSON schemas, one per line, are inside <tools></tools>:\n"
    "<tools>"
)
# How to call, without an example call: a small model copies an example's placeholder name verbatim (SmolLM2 after a
# 32-row warm start called "function_name", docs/history/real_model.md).
TOOLS_FOOTER = (
    "\n</tools>\n\nTo call a function, write one block per call: <tool_call>, a new line, a JSON object whose "
    '"name" is the function\'s name exactly as listed above and whose "arguments" is an object of its arguments, a '
    "new line, </tool_call>.\nThe results come back inside <tool_response></tool_response>. Without a suitable "
    "function, answer in plain text."
)

_TEMPLATE = """\
{%- set default_system = DEFAULT_SYSTEM -%}
{%- if messages and messages[0]['role'] == 'system' -%}
  {%- set system = messages[0]['content'] -%}{%- set rest = messages[1:] -%}
{%- else -%}
  {%- set system = default_system -%}{%- set rest = messages -%}
{%- endif -%}
{%- if tools -%}
  {%- set ns = namespace(text=system ~ TOOLS_HEADER) -%}
  {%- for tool in tools -%}{%- set ns.text = ns.text ~ '\\n' ~ (tool | tojson) -%}{%- endfor -%}
  {%- set system = ns.text ~ TOOLS_FOOTER -%}
{%- endif -%}
{%- if system -%}{{- '<|im_start|>system\\n' ~ system ~ '<|im_end|>\\n' -}}{%- endif -%}
{%- for message in rest -%}
  {%- if message['role'] == 'tool' -%}
    {%- if loop.first or rest[loop.index0 - 1]['role'] != 'tool' -%}{{- '<|im_start|>user' -}}{%- endif -%}
    {{- '\\n<tool_response>\\n' ~ message['content'] ~ '\\n</tool_response>' -}}
    {%- if loop.last or rest[loop.index0 + 1]['role'] != 'tool' -%}{{- '<|im_end|>\\n' -}}{%- endif -%}
  {%- elif message['role'] == 'assistant' and message.get('tool_calls') -%}
    {{- '<|im_start|>assistant\\n' ~ (message['content'] or '') -}}
    {%- for call in message['tool_calls'] -%}
      {%- set call = call['function'] if call.get('function') else call -%}
      {%- if message['content'] or not loop.first -%}{{- '\\n' -}}{%- endif -%}
      {{- '<tool_call>\\n{"name": ' ~ (call['name'] | tojson) ~ ', "arguments": ' -}}
      {%- if call['arguments'] is string -%}{{- call['arguments'] -}}
      {%- else -%}{{- call['arguments'] | tojson -}}{%- endif -%}
      {{- '}\\n</tool_call>' -}}
    {%- endfor -%}
    {{- '<|im_end|>\\n' -}}
  {%- else -%}
    {{- '<|im_start|>' ~ message['role'] ~ '\\n' ~ (message['content'] or '') ~ '<|im_end|>\\n' -}}
  {%- endif -%}
{%- endfor -%}
{%- if add_generation_prompt -%}{{- '<|im_start|>assistant\\n' -}}{%- endif -%}"""


def renders_tools(tokenizer) -> bool:
    """Whether the tokenizer's chat template shows the model a tool passed as `tools=`."""
    tool = {"type": "function", "function": {"name": PROBE_TOOL, "description": "-", "parameters": {"type": "object"}}}
    try:
        text = tokenizer.apply_chat_template([{"role": "user", "content": "-"}], tools=[tool], tokenize=False)
    except Exception:  # a template that raises on tools (some do) cannot render them either
        return False
    return PROBE_TOOL in text


def chatml_tool_template(default_system: str) -> str:
    """The project's ChatML template with tools, keeping `default_system` for conversations without a system turn."""
    constants = {"DEFAULT_SYSTEM": default_system, "TOOLS_HEADER": TOOLS_HEADER, "TOOLS_FOOTER": TOOLS_FOOTER}
    text = _TEMPLATE
    for name, value in constants.items():
        text = text.replace(name, json.dumps(value))  # a JSON string literal is a Jinja string literal
    return text


def tool_template_for(tokenizer) -> str | None:
    """Our tool template for a ChatML tokenizer whose own template renders no tools; None when it needs none (it
    renders tools, or it is not ChatML: then the rollout's hermes segments would not match it either)."""
    if not tokenizer.chat_template or renders_tools(tokenizer):
        return None
    text = tokenizer.apply_chat_template([{"role": "user", "content": "-"}], tokenize=False)
    if "<|im_start|>user\n-<|im_end|>" not in text:
        return None
    head = text.split("<|im_start|>user\n", 1)[0]
    system = ""
    if head.startswith("<|im_start|>system\n") and head.endswith("<|im_end|>\n"):
        system = head.removeprefix("<|im_start|>system\n").removesuffix("<|im_end|>\n")
    return chatml_tool_template(system)
