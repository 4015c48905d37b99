"""The project's own default model, built on first use and cached (no model hub is needed or reachable).

`ensure_builtin_model()` returns a Hugging Face model folder that `transformers` and vLLM both load:

1. a byte-level BPE tokenizer trained on synthetic calculator dialogues. Digits and newlines are always tokens of
   their own, so a tool result encoded on its own (as `chat_format.encode_segments` does during rollouts) gets the
   same ids as inside the fully rendered conversation;
2. our own chat template in the Qwen2.5 / hermes layout (`<tool_call>` JSON in assistant turns, tool results as
   `<tool_response>` blocks of a user turn, exactly the layout of `chat_format.tool_response_segments`);
3. a small `Qwen2ForCausalLM` (tied embeddings);
4. a short supervised warm-up on dialogues built token for token the way rollouts build them. A fraction
   `TOOL_FRACTION` of them call the calculator and copy its result; the rest answer at once with a plausible but
   wrong number. The model thus knows both behaviours and the copy skill, and starts with a held-out success near
   `TOOL_FRACTION`: low, but not zero, so GRPO has something to reinforce (it only has to move the first decision).

A folder is named by a hash of the recipe, so changing the recipe (or the calculator's tool schema, which the
system prompt shows) names a new one. The package ships the built models whose recipe has not changed since they were
built (`builtin/weights/<name>-<hash>/`, package data, ~2 MB each): the same bytes on every machine, where a build
differs with the CPU's float rounding (a build on one Intel Xeon had not learned to copy where builds on other CPUs
had) and costs minutes. Any other recipe, and `agentrl-ray build-model --rebuild`, builds into
`$AGENTRL_CACHE/models/` (default `~/.cache/agentrl_ray/models/`), in a temporary folder renamed into place under a
file lock: concurrent callers build it once. Every build writes `recipe.json` beside the weights (the recipe, its
hash, the CPU and library versions it was built with, how long it took).

`builtin:tiny-grid` (GRID_RECIPE) is the same shape and layout with its tokenizer and warm-up taken from the grid
task's random walks instead (`builtin/grid.py`, `examples/grid`).
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import os
import platform
import random
import re
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from agentrl_ray.builtin import grid as builtin_grid
from agentrl_ray.builtin.cache import SHIPPED, build_once, default_cache_root
from agentrl_ray.builtin.recipe import CHAT_TEMPLATE, NAME, RECIPE_VERSION, RECIPES, SPECIAL_TOKENS, Recipe
from agentrl_ray.chat_format import END_OF_TURN, ToolCall, encode_segments, render_tool_call, tool_response_segments
from agentrl_ray.envs.builtin.calculator import CalculatorEnv
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.infra.console import Progress
from agentrl_ray.tasks import arithmetic, grid

log = logging.getLogger(__name__)


def calculator_tools() -> list[dict[str, Any]]:
    """The tool schemas rollouts render for the default env: the model is warm-started on that very system prompt."""
    return tool_schemas(CalculatorEnv)


def recipe_hash(recipe: Recipe, tools: list[dict[str, Any]]) -> str:
    fields = asdict(recipe)
    if fields["task"] == "arithmetic":
        del fields["task"]  # the field came after the calculator models were built: keep their cache folders
    if not fields["sft_toward_share"]:
        del fields["sft_toward_share"]  # later still: the recipes that leave it at 0 keep their folders
    for late in ("grid_observations", "sft_learn_observations"):  # later again: the earlier models keep their folders
        if fields[late] == Recipe.__dataclass_fields__[late].default:
            del fields[late]
    if fields.get("task") == "grid":
        fields["grid_text"] = grid.TEXT_VERSION  # the dialogues' wording is not a field of the recipe
    blob = json.dumps(
        {"version": RECIPE_VERSION, "recipe": fields, "template": CHAT_TEMPLATE, "tools": tools},
        sort_keys=True,
    )
    return hashlib.sha256(blob.encode()).hexdigest()[:12]


def folder_name(size: str) -> str:
    """`<name>-<recipe hash>`: the folder of built-in model `size`, shipped or cached."""
    if size not in RECIPES:
        raise ValueError(f"unknown built-in model size {size!r}; choose one of {sorted(RECIPES)}")
    recipe = RECIPES[size]
    tools = calculator_tools() if recipe.task == "arithmetic" else builtin_grid.grid_tools()
    name = NAME if size == "tiny" else size if recipe.task != "arithmetic" else f"{size}-calculator"
    return f"{name}-{recipe_hash(recipe, tools)}"


def ensure_builtin_model(
    cache_dir: Path | None = None, *, force: bool = False, size: str = "tiny", shipped: bool = True
) -> Path:
    """Return the folder of a built-in model: `size` "tiny" (the default model, 0.44M parameters), "small" (~25M
    parameters, for benchmarks; see SMALL_RECIPE) or "tiny-grid".

    The folder shipped with the package when its recipe hash matches (unless `shipped=False` or `force=True`);
    otherwise built once (minutes on 2 CPU cores) into `<cache root>/models/<name>-<recipe hash>`, where `cache_dir`
    replaces the cache root (`$AGENTRL_CACHE`, default `~/.cache/agentrl_ray`). `force=True` rebuilds it even if it
    exists.
    """
    name = folder_name(size)
    if shipped and not force and (SHIPPED / name / "config.json").is_file():
        return SHIPPED / name
    recipe = RECIPES[size]
    tools = calculator_tools() if recipe.task == "arithmetic" else builtin_grid.grid_tools()
    models = (Path(cache_dir) if cache_dir is not None else default_cache_root()) / "models"
    return build_once(models / name, lambda tmp: build(tmp, recipe, tools), force=force)


def build(out_dir: Path, recipe: Recipe, tools: list[dict[str, Any]]) -> None:
    import torch  # here, not at the top: the driver resolves `builtin:` names without torch
    from transformers import Qwen2Config, Qwen2ForCausalLM, Qwen2Tokenizer

    start = time.perf_counter()
    random.seed(recipe.seed)
    torch.manual_seed(recipe.seed)
    if recipe.task == "grid":
        texts, make_examples = builtin_grid.texts_and_examples(recipe, tools, CHAT_TEMPLATE)
    else:
        problems = arithmetic.sample_problems(recipe.sft_dialogues, recipe.seed, "train")
        rng = random.Random(recipe.seed)
        renderer = Qwen2Tokenizer()  # only to render the training text with our template
        renderer.chat_template = CHAT_TEMPLATE
        texts = [render_dialogue(renderer, tools, p, rng, recipe.tool_fraction) for p in problems[:2000]]

        def make_examples(tokenizer):
            rng = random.Random(recipe.seed)
            return [sft_example(tokenizer, tools, p, rng, recipe) for p in problems]

    tokenizer = train_tokenizer(recipe, texts)
    log.info("built-in model: tokenizer of %d tokens", len(tokenizer))
    config = Qwen2Config(
        vocab_size=len(tokenizer),
        hidden_size=recipe.hidden_size,
        intermediate_size=recipe.intermediate_size,
        num_hidden_layers=recipe.num_layers,
        num_attention_heads=recipe.num_heads,
        num_key_value_heads=recipe.num_kv_heads,
        max_position_embeddings=recipe.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.convert_tokens_to_ids("<|endoftext|>"),
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
        torch_dtype="float32",
    )
    model = Qwen2ForCausalLM(config)
    n_params = sum(p.numel() for p in model.parameters())
    log.info(
        "built-in model: Qwen2 %d layers, hidden %d, %.2fM parameters",
        recipe.num_layers,
        recipe.hidden_size,
        n_params / 1e6,
    )
    examples = make_examples(tokenizer)
    supervised_warmup(model, examples, recipe, pad_id=tokenizer.pad_token_id)
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    model.save_pretrained(out_dir)
    tokenizer.save_pretrained(out_dir)
    seconds = time.perf_counter() - start
    provenance = {
        "recipe": asdict(recipe),
        "recipe_hash": recipe_hash(recipe, tools),
        "parameters": n_params,
        "built_on": {"cpu": cpu_name(), "cores": os.cpu_count(), "torch": torch.__version__},
        "build_seconds": round(seconds),
    }
    (out_dir / "recipe.json").write_text(json.dumps(provenance, indent=2) + "\n")
    log.info("built-in model: built in %.0f s -> %s", seconds, out_dir)


def cpu_name() -> str:
    """The CPU's model name (float rounding, and so a build, differs between CPU kinds)."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine()


# ---------------------------------------------------------------------------------------------------- tokenizer


def train_tokenizer(recipe: Recipe, texts: list[str]):
    """Byte-level BPE trained on rendered dialogues, as a `Qwen2Tokenizer`.

    `AutoTokenizer` (and so vLLM) loads any qwen2 model's tokenizer as `Qwen2Tokenizer`, which rebuilds its own
    normalizer and pre-tokenizer whatever tokenizer.json says; so we train with exactly those, taken from the class.
    That pre-tokenizer already reads numbers digit by digit. Newlines are kept out of every merge (the trainer never
    sees one): the rollout format cuts segments at newlines (and special tokens), so a tool result encoded on its own
    then gets the same ids as inside the fully rendered conversation, whatever text the tool returns.
    """
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    from transformers import Qwen2Tokenizer

    reference = Qwen2Tokenizer().backend_tokenizer
    bpe = Tokenizer(models.BPE())
    bpe.normalizer = reference.normalizer
    bpe.pre_tokenizer = reference.pre_tokenizer
    trainer = trainers.BpeTrainer(
        vocab_size=recipe.vocab_size,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    # The trainer does not split at special tokens by itself (encoding does), nor do we want merges with newlines.
    cut = re.compile("|".join(re.escape(t) for t in SPECIAL_TOKENS) + "|\n")
    bpe.train_from_iterator((piece for text in texts for piece in cut.split(text) if piece), trainer)
    trained = json.loads(bpe.to_str())["model"]
    tokenizer = Qwen2Tokenizer(
        vocab=trained["vocab"],
        merges=[tuple(m) for m in trained["merges"]],
        eos_token=END_OF_TURN,
        pad_token="<|endoftext|>",
        unk_token=None,
        extra_special_tokens=SPECIAL_TOKENS[1:2] + SPECIAL_TOKENS[3:],
        model_max_length=recipe.max_positions,
        clean_up_tokenization_spaces=False,
    )
    tokenizer.chat_template = CHAT_TEMPLATE
    return tokenizer


# ---------------------------------------------------------------------------------------------------- dialogues


def tool_call_text(expression: str) -> str:
    return render_tool_call(ToolCall("calculator", {"expression": expression}))


def answer_text(value: int) -> str:
    return f"The answer is {value}."


def guess(value: int, rng: random.Random) -> int:
    """A plausible but wrong answer: right magnitude, wrong digits."""
    while True:
        wrong = max(0, round(value * rng.uniform(0.6, 1.4)) + rng.randint(-9, 9))
        if wrong != value:
            return wrong


def render_dialogue(tokenizer, tools, problem, rng: random.Random, tool_fraction: float) -> str:
    a, op, b = problem
    value = arithmetic.evaluate(a, op, b)
    messages: list[dict[str, Any]] = [{"role": "user", "content": arithmetic.question(a, op, b)}]
    if rng.random() < tool_fraction:
        call = {"type": "function", "function": {"name": "calculator", "arguments": {"expression": f"{a} {op} {b}"}}}
        messages += [
            {"role": "assistant", "content": "", "tool_calls": [call]},
            {"role": "tool", "name": "calculator", "content": str(value)},
            {"role": "assistant", "content": answer_text(value)},
        ]
    else:
        messages.append({"role": "assistant", "content": answer_text(guess(value, rng))})
    return tokenizer.apply_chat_template(messages, tools=tools, tokenize=False)


def sft_example(tokenizer, tools, problem, rng: random.Random, recipe: Recipe) -> tuple[list[int], list[int]]:
    """(ids, loss mask) of one dialogue, assembled exactly like a rollout: prompt ids from the chat template, the
    assistant's turns as the model would sample them (ending in <|im_end|>), tool results as encoded segments.

    A share `recipe.sft_tool_share` of dialogues use the tool, more than `recipe.tool_fraction`, so the copy skill
    gets enough examples; the first assistant token (the decision to call the tool or not) is trained on a subset
    in which exactly `tool_fraction` of the dialogues call it, so that is the probability the model learns.
    """
    a, op, b = problem
    value = arithmetic.evaluate(a, op, b)
    prompt = [{"role": "user", "content": arithmetic.question(a, op, b)}]
    ids = list(
        tokenizer.apply_chat_template(prompt, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False)
    )
    mask = [0] * len(ids)

    def turn(text: str, learn_first: bool = True) -> None:
        piece = tokenizer.encode(text + END_OF_TURN, add_special_tokens=False)
        ids.extend(piece)
        mask.extend([int(learn_first)] + [1] * (len(piece) - 1))

    q, p = recipe.sft_tool_share, recipe.tool_fraction
    if rng.random() < q:
        turn(tool_call_text(f"{a} {op} {b}"), learn_first=rng.random() < p * (1 - q) / (q * (1 - p)))
        seg_ids, _ = encode_segments(tokenizer, tool_response_segments([str(value)]))
        ids.extend(seg_ids)
        mask.extend([0] * len(seg_ids))
        turn(answer_text(value))
    else:
        turn(answer_text(guess(value, rng)))
    return ids, mask


# ---------------------------------------------------------------------------------------------------- warm-up


def supervised_warmup(model, examples: list[tuple[list[int], list[int]]], recipe: Recipe, *, pad_id: int) -> None:
    """AdamW with linear warm-up and cosine decay; loss on assistant tokens only.

    Every dialogue opens with the same system turn (~40% of its tokens), so each step runs that shared prefix once
    and lets the whole batch attend to its keys/values (gradients flow back through them): same loss, less compute.
    Batches are right-padded, so under causal attention no real token ever sees a pad and no mask is needed.
    """
    import torch

    shared = _common_prefix_len([ids for ids, _ in examples])
    if any(any(mask[: shared + 1]) for _, mask in examples):
        raise ValueError("the shared prefix of the warm-up dialogues (and the token after it) must carry no loss")
    prefix = torch.tensor(examples[0][0][:shared])[None]  # (1, P)
    gen = torch.Generator().manual_seed(recipe.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=recipe.sft_lr, betas=(0.9, 0.98), weight_decay=0.01)

    def lr_at(step: int) -> float:
        if step < recipe.sft_warmup:
            return (step + 1) / recipe.sft_warmup
        progress = (step - recipe.sft_warmup) / max(1, recipe.sft_steps - recipe.sft_warmup)
        return 0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * progress))

    sched = torch.optim.lr_scheduler.LambdaLR(opt, lr_at)
    model.train()
    running = None
    bar = Progress(recipe.sft_steps, "building the built-in model: SFT step", every=100)  # a bar with ETA
    for _ in range(recipe.sft_steps):
        batch = [examples[i] for i in torch.randint(len(examples), (recipe.sft_batch,), generator=gen).tolist()]
        width = max(len(ids) for ids, _ in batch) - shared
        input_ids = torch.full((len(batch), width), pad_id)  # (B, T), after the prefix, right-padded
        labels = torch.full((len(batch), width), -100)  # (B, T), -100 = no loss
        for row, (ids, mask) in enumerate(batch):
            rest = torch.tensor(ids[shared:])
            input_ids[row, : len(rest)] = rest
            labels[row, : len(rest)] = torch.where(torch.tensor(mask[shared:]) == 1, rest, -100)
        cache = model.model(input_ids=prefix, use_cache=True).past_key_values
        for layer in cache.layers:
            layer.keys = layer.keys.expand(len(batch), -1, -1, -1)  # (B, heads, P, head_dim)
            layer.values = layer.values.expand(len(batch), -1, -1, -1)
        positions = torch.arange(shared, shared + width).expand(len(batch), width)  # (B, T)
        logits = model(input_ids=input_ids, past_key_values=cache, position_ids=positions).logits  # (B, T, V)
        # Position t predicts token t + 1; the first token after the prefix is a prompt token (no loss).
        loss = torch.nn.functional.cross_entropy(
            logits[:, :-1].reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1), ignore_index=-100
        )
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        opt.zero_grad(set_to_none=True)
        running = loss.item() if running is None else 0.9 * running + 0.1 * loss.item()
        bar.update(1, note=f"loss {running:.4f}")
    bar.close()
    log.info("built-in model: %d SFT steps, loss %.4f", recipe.sft_steps, running)
    model.eval()


def _common_prefix_len(seqs: list[list[int]]) -> int:
    n = min(map(len, seqs))
    for seq in seqs:
        while seq[:n] != seqs[0][:n]:
            n -= 1
    return n
