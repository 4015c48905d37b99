"""A dry pass over the config and the data before any actor starts: bad input fails before step 1, naming its row,
column or key, instead of minutes into a run (an empty dataset was a ZeroDivisionError mid-run; a prompt over the
token budget, a column `reset` needs, or an `env.kwargs` typo failed the first rollout).

Before Ray starts (`resolve_user_code`, called by `driver.train` first): the user's code the config names is imported
(`env.name`, each of `env.tools`, each of `reward.functions`) and `env.kwargs` are bound to the environment's
constructor; a failure is one line naming the key and the cause.

What is checked (`check`, called by `driver.train` once Ray is up, with the tokenizer it loaded while Ray started):
- Each dataset (train and eval) is non-empty.
- `env.kwargs` bind to the environment's constructor (`inspect.signature(...).bind`).
- The environment's `reset(**row)` succeeds on a sample of rows (`SAMPLE_ROWS`, spread over the dataset): one
  environment per row, in this process, closed afterwards. The text it returns counts towards the prompt below.
- `rollout.max_total_tokens` fits the model's context (its config.json's `max_position_embeddings` and kin; vLLM
  refuses a longer one only once its engine starts).
- Every prompt, rendered with the model's chat template and the environment's tool schemas exactly as the rollout
  worker renders it, fits `rollout.max_total_tokens` (the worker needs room for at least one generated token).
- Every reward function's required parameters are columns of every row (or arguments the worker passes).
- A game of two players (`players = 2`, self-play) has an even `rollout.group_size` and `run.eval_samples`
  (checked before Ray starts, with `env.kwargs`).
"""

from __future__ import annotations

import asyncio
import inspect
import json
import traceback
from collections.abc import Callable
from pathlib import Path
from typing import Any

from agentrl_ray.chat_format import prompt_messages
from agentrl_ray.config import Config, ConfigError
from agentrl_ray.data import row_tools

SAMPLE_ROWS = 16
# What the rollout worker passes to reward functions besides the dataset columns (see rollout/worker.py, TRL's names).
_REWARD_ARGUMENTS = frozenset({"prompts", "completions", "episode_stats", "env_rewards"})
# Dataset columns the worker withholds from reward functions (TRL passes the prompts as `prompts` instead).
_WITHHELD = frozenset({"prompt", "completion", "completion_ids"})


def resolve_user_code(cfg: Config) -> None:
    """Import the environment class, its tools and the reward functions the config names, in this process, before
    Ray starts: a misspelled name or a module that fails to import raises ConfigError("<key>: <cause>")."""
    from agentrl_ray.envs.loading import env_class, import_object, load_env_class
    from agentrl_ray.rewards import load_reward_functions

    if cfg.env.name:
        _resolve("env.name", load_env_class, cfg.env.name)
    for i, spec in enumerate(cfg.env.tools):
        _resolve(f"env.tools[{i}]", import_object, spec, "tool")
    # names that clash, non-functions, an MCP server that does not start or lists nothing
    key = "env.mcp_servers" if cfg.env.mcp_servers else "env.tools"
    cls = _resolve(key, env_class, cfg.env.name, cfg.env.tool_specs())
    check_env_kwargs(cls, cfg.env.kwargs, cfg.env.name)
    check_players(cls, cfg)
    for i, name in enumerate(cfg.reward.functions):
        _resolve(f"reward.functions[{i}]", load_reward_functions, [name])
    if cfg.env.agent:
        agent = _resolve("env.agent", import_object, cfg.env.agent, "env.agent")
        if not inspect.iscoroutinefunction(agent):
            raise ConfigError(f"env.agent {cfg.env.agent[:60]!r} must be an async function run(client, row)")


def _resolve(key: str, load: Callable, *args: Any) -> Any:
    try:
        return load(*args)
    except Exception as e:  # the user's code, whatever it raises: one line, with where it was raised
        raise ConfigError(f"{key}: {_cause(e)}") from e


def _cause(e: BaseException) -> str:
    """The exception's type and message, and the last frame outside this package when that is where it was raised
    (a user's module that fails while it is imported)."""
    text = f"{type(e).__name__}: {e}"
    frames = [f for f in traceback.extract_tb(e.__traceback__) if "/agentrl_ray/" not in f.filename]
    frames = [f for f in frames if not f.filename.startswith("<frozen")]
    if frames and not isinstance(e, SyntaxError):  # a SyntaxError's message names its file and line already
        text += f" ({frames[-1].filename}:{frames[-1].lineno})"
    return text


def check(cfg: Config, model_path: str, train_rows: list[dict], eval_rows: list[dict], tokenizer: Any = None) -> None:
    """Raise ConfigError on the first problem found (see the module docstring). `tokenizer`: the model's, if the
    caller loaded it already (`load_tokenizer`)."""
    from agentrl_ray.envs.loading import env_class as make_env_class
    from agentrl_ray.rewards import load_reward_functions

    datasets = [("data.train", cfg.data.train, train_rows), ("data.eval", cfg.data.eval, eval_rows)]
    for key, spec, rows in datasets:
        if not rows:
            raise ConfigError(f"{key} {spec!r} has no rows: nothing to train or evaluate on")
    env_class = make_env_class(cfg.env.name, cfg.env.tool_specs())  # the class the env hosts build
    check_env_kwargs(env_class, cfg.env.kwargs, cfg.env.name)
    reward_funcs = load_reward_functions(cfg.reward.functions)
    check_context(cfg.rollout.max_total_tokens, model_path)
    tokenizer = tokenizer or load_tokenizer(model_path)
    for key, spec, rows in datasets:
        where = f"{key} {spec!r}"
        extras = check_reset(env_class, cfg.env.kwargs, rows, where)
        check_prompt_lengths(
            tokenizer, env_class, rows, extras, cfg.rollout.max_total_tokens, where, cfg.rollout.system_prompt
        )
        for name, fn in zip(cfg.reward.functions, reward_funcs, strict=True):
            check_reward_columns(fn, name, rows, where)


def check_env_kwargs(env_class: type, kwargs: dict[str, Any], name: str) -> None:
    try:
        inspect.signature(env_class).bind(**kwargs)
    except TypeError as e:
        raise ConfigError(
            f"env.kwargs {sorted(kwargs)} do not fit the constructor of {name} "
            f"{env_class.__name__}{inspect.signature(env_class)}: {e}"
        ) from None


def check_players(env_class: type, cfg: Config) -> None:
    """A game of two players (self-play, rollout/selfplay.py) pairs samples 2i and 2i+1 of each group."""
    from agentrl_ray.envs.base import players

    seats = _resolve("env.name", players, env_class)
    for key, n in (("rollout.group_size", cfg.rollout.group_size), ("run.eval_samples", cfg.run.eval_samples)):
        if n % seats:
            raise ConfigError(
                f"{key}={n} must be even: {cfg.env.name} is a game of two players, played by self-play with samples "
                "2i and 2i+1 of a group as its seats"
            )


def sample_indices(n: int, k: int = SAMPLE_ROWS) -> list[int]:
    """Up to `k` row indices spread evenly over `n` rows, first and last included."""
    if n <= k:
        return list(range(n))
    return sorted({round(i * (n - 1) / (k - 1)) for i in range(k)})


def check_reset(env_class: type, kwargs: dict[str, Any], rows: list[dict], where: str) -> dict[int, str]:
    """Call `reset(**row)` on a fresh environment for each sampled row; {row index: the text it returned}."""
    extras = {}
    for i in sample_indices(len(rows)):
        try:
            env = env_class(**kwargs)
        except Exception as e:
            raise ConfigError(
                f"{env_class.__name__}(**env.kwargs) raised {type(e).__name__}: {e} (env.kwargs: {kwargs})"
            ) from e
        try:
            text = _call(env.reset, **rows[i])
        except Exception as e:
            raise ConfigError(
                f"{where} row {i} (id {rows[i].get('id')!r}): {env_class.__name__}.reset(**row) raised "
                f"{type(e).__name__}: {e} (row columns: {sorted(rows[i])})"
            ) from e
        finally:
            if callable(getattr(env, "close", None)):
                _call(env.close)
        if text is not None and not isinstance(text, str):
            raise ConfigError(
                f"{where} row {i}: {env_class.__name__}.reset returned {type(text).__name__}, not str or None"
            )
        if text:
            extras[i] = text
    return extras


def check_prompt_lengths(
    tokenizer: Any,
    env_class: type,
    rows: list[dict],
    extras: dict[int, str],
    max_total_tokens: int,
    where: str,
    system_prompt: str = "",
) -> None:
    """Every prompt as the rollout worker renders it (chat template, tool schemas, reset text) leaves room for at
    least one generated token within `max_total_tokens`."""
    from agentrl_ray.envs.tools import tool_schemas

    tools = tool_schemas(env_class)
    conversations = []
    for i, row in enumerate(rows):
        messages = prompt_messages(row["prompt"], system_prompt)  # as the worker renders it
        if i in extras:  # TRL convention, as in the worker: reset's text is appended to the last user message
            messages[-1]["content"] = f"{messages[-1]['content']}{extras[i]}"
        conversations.append(messages)
    # Rendered in one batch, then tokenized in one batch: the same ids as the worker's per-prompt
    # apply_chat_template(tokenize=True), about 6x faster (4000 prompts of the default task: ~2 s instead of ~18 s).
    if any(row.get("tools") is not None for row in rows):  # rows with tools of their own: rendered one by one
        texts = [
            tokenizer.apply_chat_template(c, tools=row_tools(row, tools), add_generation_prompt=True, tokenize=False)
            for c, row in zip(conversations, rows)
        ]
    else:
        texts = tokenizer.apply_chat_template(conversations, tools=tools, add_generation_prompt=True, tokenize=False)
    lengths = [len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]]
    for i, n in enumerate(lengths):
        if n + 1 >= max_total_tokens:
            raise ConfigError(
                f"{where} row {i} (id {rows[i].get('id')!r}): the prompt is {n} tokens with the chat template "
                f"and {len(row_tools(rows[i], tools))} tool schemas, but rollout.max_total_tokens={max_total_tokens} "
                "leaves no room to "
                "generate: raise rollout.max_total_tokens or shorten the prompt"
            )


# The keys a model's config.json may state its context under (the smallest one present binds, as vLLM reads them).
_CONTEXT_KEYS = ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length", "max_sequence_length")


def check_context(max_total_tokens: int, model_path: str) -> None:
    """`rollout.max_total_tokens` within the context the model's config.json states. Skipped where the model is not a
    local folder, states no context, or scales its positions (`rope_scaling`: its usable length is not one key)."""
    config = Path(model_path) / "config.json"
    if not config.is_file():
        return
    try:
        text = json.loads(config.read_text())
    except (OSError, ValueError):
        return  # the model's own loader reports a broken config.json better
    text = text.get("text_config", text)  # a multimodal model's language part
    stated = [text[k] for k in _CONTEXT_KEYS if isinstance(text.get(k), int) and text[k] > 0]
    if not stated or text.get("rope_scaling"):
        return
    context = min(stated)
    if max_total_tokens > context:
        raise ConfigError(
            f"rollout.max_total_tokens={max_total_tokens} is longer than the model's context ({context} tokens, "
            f"{config}): set rollout.max_total_tokens={context} or less"
        )


def check_reward_columns(fn: Callable, name: str, rows: list[dict], where: str) -> None:
    """The reward function's required parameters must be columns of every row (or the worker's own arguments)."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):  # a builtin or C callable without a signature: nothing to check
        return
    required = [
        p.name
        for p in params
        if p.default is inspect.Parameter.empty
        and p.kind in (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
        and p.name not in _REWARD_ARGUMENTS
    ]
    for column in required:
        if column in _WITHHELD:
            raise ConfigError(
                f"reward function {name!r} requires {column!r}, which is never passed to reward functions "
                "(the prompts come as `prompts`, the completions as `completions`)"
            )
        for i, row in enumerate(rows):
            if column not in row:
                raise ConfigError(
                    f"reward function {name!r} requires the column {column!r}, which {where} row {i} "
                    f"(id {row.get('id')!r}) lacks (its columns: {sorted(row)})"
                )


def load_tokenizer(model_path: str) -> Any:
    from agentrl_ray.builtin.tokenizer import load_tokenizer

    return load_tokenizer(model_path)


def _call(fn: Callable, *args: Any, **kwargs: Any) -> Any:
    out = fn(*args, **kwargs)
    return asyncio.run(out) if inspect.isawaitable(out) else out
