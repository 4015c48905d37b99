"""The grid task (`builtin:grid`, `GridEnv`, `builtin:tiny-grid`'s warm-up dialogues), without Ray or a model."""

from __future__ import annotations

import asyncio
import random
import re

import pytest

from agentrl_ray.builtin import grid as builtin_grid
from agentrl_ray.builtin import model as builtin_model
from agentrl_ray.builtin import recipe as recipes
from agentrl_ray.chat_format import parse_tool_calls
from agentrl_ray.config import DataConfig
from agentrl_ray.data import load_rows
from agentrl_ray.envs.builtin.grid import GridEnv
from agentrl_ray.envs.host import EnvHost
from agentrl_ray.envs.loading import load_env_class
from agentrl_ray.envs.tools import tool_schemas
from agentrl_ray.tasks import grid


def _env(start: str, goal: str) -> GridEnv:
    env = GridEnv()
    env.reset(prompt="", start=start, goal=goal)
    return env


def test_observations_follow_from_the_moves():
    env = _env("0,0", "2,1")
    assert [env.move(d) for d in ("west", "east", "north", "east")] == [
        "blocked, at 0,0, goal 2 east 1 north",
        "at 1,0, goal 1 east 1 north",
        "at 1,1, goal 1 east",
        "at 2,1 goal",
    ]
    assert env.reward("Done.") == 1.0
    # Overshooting leaves the goal, and the observation says which way it now lies.
    assert env.move("east") == "at 3,1, goal 1 west" and env.reward("Done.") == 0.0
    # The same moves from the same start give the same observations: nothing hidden, nothing random.
    again = _env("0,0", "2,1")
    assert [again.move(d) for d in ("west", "east", "north", "east")] == [
        "blocked, at 0,0, goal 2 east 1 north",
        "at 1,0, goal 1 east 1 north",
        "at 1,1, goal 1 east",
        "at 2,1 goal",
    ]
    corner = _env("4,4", "3,3")
    assert corner.move("north") == "blocked, at 4,4, goal 1 west 1 south"
    assert corner.move("west") == "at 3,4, goal 1 south"
    assert corner.reward("") == 0.0


def test_bad_rows_and_bad_moves_are_named():
    with pytest.raises(ValueError, match="'start' and 'goal'"):
        GridEnv().reset(prompt="x")
    with pytest.raises(ValueError, match="goal '7,1' is off the 5 x 5 grid"):
        GridEnv().reset(start="0,0", goal="7,1")
    with pytest.raises(ValueError, match="start must be a cell"):
        GridEnv().reset(start="a,b", goal="1,1")
    with pytest.raises(ValueError, match="unknown direction 'up'"):
        _env("1,1", "2,2").move("up")


def test_bad_tool_calls_become_error_observations_and_the_walk_goes_on():
    asyncio.run(_bad_tool_calls())


async def _bad_tool_calls():
    host = EnvHost()  # the env host's own code, in this process (tests/ray run it as an actor)
    await host.create("k", "agentrl_ray.envs.builtin.grid:GridEnv", {}, {"prompt": "", "start": "1,1", "goal": "1,2"})
    text = '<tool_call>\n{"name": "move", "arguments": {"direction": "up"}}\n</tool_call>'
    parsed = parse_tool_calls(text)
    (bad,) = await host.call_tools("k", parsed.calls, parsed.errors)
    assert bad.error and bad.text.startswith("Error:") and "unknown direction 'up'" in bad.text
    (unknown,) = await host.call_tools("k", parse_tool_calls(text.replace("move", "jump")).calls, [])
    assert unknown.error and "jump" in unknown.text
    good = parse_tool_calls(text.replace("up", "north"))
    (ok,) = await host.call_tools("k", good.calls, good.errors)
    assert not ok.error and ok.text == "at 1,2 goal"
    assert await host.env_reward("k", "Done.") == 1.0
    await host.close("k")


def test_rows_are_deterministic_with_disjoint_splits_and_reachable_goals():
    cfg = DataConfig(train="builtin:grid", eval="builtin:grid")
    train = load_rows("builtin:grid", cfg, split="train", size=600)
    evals = load_rows("builtin:grid", cfg, split="eval", size=100)
    assert load_rows("builtin:grid", cfg, split="eval", size=100) == evals
    assert grid.make_grid_rows(100, 1, "eval") != grid.make_grid_rows(100, 0, "eval")
    pair = lambda r: (r["start"], r["goal"])  # noqa: E731
    assert not {pair(r) for r in train} & {pair(r) for r in evals}
    assert len({pair(r) for r in evals}) == len(grid.all_problems("eval"))  # 100 rows cycle through all 45 pairs
    assert len({r["id"] for r in train + evals}) == len(train) + len(evals)
    for row in train[:100] + evals:
        found = re.fullmatch(r"You are at (\d),(\d)\. Go to (\d),(\d): (.+)\.", row["prompt"][0]["content"])
        sx, sy, gx, gy = map(int, found.groups()[:4])
        assert (row["start"], row["goal"]) == (f"{sx},{sy}", f"{gx},{gy}")
        # The offset the prompt states is the one the coordinates give.
        steps = {d: int(n) for n, d in re.findall(r"(\d) (east|west|north|south)", found.group(5))}
        assert steps.get("east", 0) - steps.get("west", 0) == gx - sx
        assert steps.get("north", 0) - steps.get("south", 0) == gy - sy
        assert grid.MIN_DISTANCE <= abs(sx - gx) + abs(sy - gy) <= grid.MAX_DISTANCE
    with pytest.raises(ValueError, match="split"):
        grid.make_grid_rows(3, 0, "test")


def test_warmup_walks_are_random_stop_at_the_goal_and_match_the_env():
    rng = random.Random(0)
    first_moves, reached = [], 0
    for start, goal in grid.sample_problems(2000, 0, "train"):
        messages = grid.warmup_messages(start, goal, rng)
        env = _env(*(f"{c[0]},{c[1]}" for c in (start, goal)))
        calls = [m for m in messages if m.get("tool_calls")]
        assert 1 <= len(calls) <= grid.MAX_MOVES
        first_moves.append(calls[0]["tool_calls"][0]["function"]["arguments"]["direction"])
        for call, result in zip(calls, [m for m in messages if m["role"] == "tool"]):
            assert env.move(**call["tool_calls"][0]["function"]["arguments"]) == result["content"]
        reached += messages[-1]["content"] == grid.FINAL_ANSWER
        assert (messages[-1]["content"] == grid.FINAL_ANSWER) == (env.reward("") == 1.0)
    assert {d: first_moves.count(d) for d in set(first_moves)}.keys() == {"north", "south", "east", "west"}
    assert all(abs(first_moves.count(d) / 2000 - 0.25) < 0.04 for d in set(first_moves))
    assert 0.15 < reached / 2000 < 0.4  # a random walk: the warm-started model starts low


def test_warmup_ids_are_the_rendered_conversation_and_learn_only_assistant_turns():
    """The warm-up assembles a dialogue like a rollout does (prompt, sampled turns, encoded tool results); those ids
    must equal the chat template's rendering of the whole conversation, or the model learns a layout it never sees."""
    from transformers import Qwen2Tokenizer

    tools = builtin_grid.grid_tools()
    assert tools == tool_schemas(load_env_class("agentrl_ray.envs.builtin.grid:GridEnv"))
    recipe = recipes.GRID_RECIPE
    texts, make_examples = builtin_grid.texts_and_examples(
        recipes.Recipe(task="grid", sft_dialogues=300), tools, recipes.CHAT_TEMPLATE
    )
    tokenizer = builtin_model.train_tokenizer(recipe, texts)
    assert isinstance(tokenizer, Qwen2Tokenizer)
    rng = random.Random(3)
    for start, goal in grid.sample_problems(20, 0, "train"):
        messages = grid.warmup_messages(start, goal, rng)
        ids, mask = builtin_grid.messages_example(tokenizer, tools, messages)
        after_tool = messages[-1]["role"] == "tool"  # a walk that gave up: the rollout's next turn would follow
        rendered = tokenizer.apply_chat_template(
            messages, tools=tools, add_generation_prompt=after_tool, tokenize=True, return_dict=False
        )
        assert ids == list(rendered)[: len(ids)]
        learned = tokenizer.decode([i for i, m in zip(ids, mask) if m])
        assert "move" in learned and "at " not in learned  # calls are learned, observations are not
        _, with_obs = builtin_grid.messages_example(tokenizer, tools, messages, learn_observations=True)
        observed = tokenizer.decode([i for i, m, m0 in zip(ids, with_obs, mask) if m and not m0])
        assert observed == "".join(m["content"] for m in messages if m["role"] == "tool")  # results, no template
    assert len(make_examples(tokenizer)) == 300


def test_the_calculator_models_keep_their_cache_folders_and_the_grid_model_gets_its_own():
    """The recipe's `task` and `sft_toward_share` fields stay out of the calculator recipes' hash: adding them rebuilt
    no cached model."""
    import dataclasses
    import hashlib
    import json

    tools = builtin_model.calculator_tools()
    late = ("task", "sft_toward_share", "grid_observations", "sft_learn_observations")
    for recipe in (recipes.RECIPE, recipes.SMALL_RECIPE):
        fields = {k: v for k, v in dataclasses.asdict(recipe).items() if k not in late}
        blob = {"version": recipes.RECIPE_VERSION, "recipe": fields, "template": recipes.CHAT_TEMPLATE}
        old = hashlib.sha256(json.dumps({**blob, "tools": tools}, sort_keys=True).encode()).hexdigest()[:12]
        assert builtin_model.recipe_hash(recipe, tools) == old
    grid_recipe = dataclasses.replace(
        recipes.GRID_RECIPE, **{k: getattr(recipes.RECIPE, k) for k in ("sft_steps", "sft_batch")}
    )
    assert builtin_model.recipe_hash(grid_recipe, tools) != builtin_model.recipe_hash(recipes.RECIPE, tools)


def test_the_grid_models_cache_folder_follows_the_wording_of_its_dialogues(monkeypatch):
    """A model warm-started on other prompts and observations must not be found in the cache: the wording's version
    is part of the grid recipe's hash (and of no calculator recipe's)."""
    tools = builtin_grid.grid_tools()
    before = builtin_model.recipe_hash(recipes.GRID_RECIPE, tools)
    calculator = builtin_model.recipe_hash(recipes.RECIPE, tools)
    monkeypatch.setattr(grid, "TEXT_VERSION", grid.TEXT_VERSION + 1)
    assert builtin_model.recipe_hash(recipes.GRID_RECIPE, tools) != before
    assert builtin_model.recipe_hash(recipes.RECIPE, tools) == calculator


def test_cells_only_observations_leave_the_offset_out():
    """`observations="cell"` (round 5): the cell, "blocked" and "goal" as before, never where the goal lies."""
    env = GridEnv(observations="cell")
    env.reset(prompt="", start="0,0", goal="2,1")
    assert [env.move(d) for d in ("west", "east", "north", "east")] == [
        "blocked, at 0,0",
        "at 1,0",
        "at 1,1",
        "at 2,1 goal",
    ]
    assert env.reward("Done.") == 1.0
    with pytest.raises(ValueError, match="observations must be one of"):
        GridEnv(observations="offsets")


def test_delayed_observations_report_the_walker_one_move_late():
    """`observations="delayed"` (round 5): whether the move went through, and the cell and offset before it; standing
    on the goal shows only in the next observation, so the warm-up's "Done." follows a report that does not say it."""
    env = GridEnv(observations="delayed")
    env.reset(prompt="", start="0,0", goal="2,1")
    assert [env.move(d) for d in ("west", "east", "north", "east", "south")] == [
        "blocked, before: at 0,0, goal 2 east 1 north",
        "moved, before: at 0,0, goal 2 east 1 north",
        "moved, before: at 1,0, goal 1 east 1 north",
        "moved, before: at 1,1, goal 1 east",
        "moved, before: at 2,1 goal",
    ]
    assert env.reward("Done.") == 0.0 and env.cell == (2, 0)
    rng = random.Random(0)
    walks = [grid.warmup_messages(s, g, rng, 0.35, "delayed") for s, g in grid.sample_problems(300, 0, "train")]
    done = [w for w in walks if w[-1]["content"] == grid.FINAL_ANSWER]
    assert 60 < len(done) < 240 and all(not w[-2]["content"].endswith(" goal") for w in done)
    for walk in done:  # replaying the calls ends on the goal
        cell = grid.parse_cell(re.search(r"at (\d,\d)", walk[0]["content"]).group(1), "start")
        for m in walk[1:-1:2]:
            cell = grid.step(cell, m["tool_calls"][0]["function"]["arguments"]["direction"])[0]
        assert grid.cell_text(cell) == re.search(r"Go to (\d,\d)", walk[0]["content"]).group(1)


def test_the_cells_model_is_warm_started_on_cells_only_walks_in_its_own_folder():
    """builtin:tiny-grid-cells learns the cells-only wording (no observation of its warm-up states an offset; the
    prompt still does), and has its own cache folder while builtin:tiny-grid keeps the one it had."""
    import dataclasses
    import hashlib
    import json

    tools = builtin_grid.grid_tools()
    recipe = dataclasses.replace(recipes.GRID_CELLS_RECIPE, sft_dialogues=200)
    texts, _ = builtin_grid.texts_and_examples(recipe, tools, recipes.CHAT_TEMPLATE)
    observations = [line for text in texts for line in re.findall(r"<tool_response>\n?(.*?)\n?</tool_response>", text)]
    assert len(observations) > 200
    assert all(re.fullmatch(r"(blocked, )?at \d,\d( goal)?", o) for o in observations), observations[:5]
    assert any(o.endswith(" goal") for o in observations) and any(o.startswith("blocked") for o in observations)
    assert all(re.search(r"Go to \d,\d: \d (east|west|north|south)", t) for t in texts)
    fields = dataclasses.asdict(recipes.GRID_RECIPE)
    del fields["grid_observations"], fields["sft_learn_observations"]
    fields["grid_text"] = grid.TEXT_VERSION
    blob = {"version": recipes.RECIPE_VERSION, "recipe": fields, "template": recipes.CHAT_TEMPLATE, "tools": tools}
    kept = hashlib.sha256(json.dumps(blob, sort_keys=True).encode()).hexdigest()[:12]
    assert builtin_model.folder_name("tiny-grid") == f"tiny-grid-{kept}"
    assert builtin_model.folder_name("tiny-grid-cells").startswith("tiny-grid-cells-")
    assert builtin_model.folder_name("tiny-grid-cells").rpartition("-")[2] != kept


def test_the_walker_goes_toward_the_goal_as_often_as_asked():
    """`toward` = 0.2: about 0.2 + 0.8 x chance of the moves shorten the distance, and the walker reaches the goal
    more often than a uniform one, still under half the time (a low start for RL)."""
    problems = grid.sample_problems(2000, 0, "train")

    def walks(toward: float) -> tuple[float, float]:
        rng = random.Random(1)
        closer = moves = reached = 0
        for start, goal in problems:
            cell = start
            for direction, _ in grid.random_walk(start, goal, rng, toward):
                nxt, _ = grid.step(cell, direction)
                closer += grid.distance(nxt, goal) < grid.distance(cell, goal)
                moves, cell = moves + 1, nxt
            reached += cell == goal
        return closer / moves, reached / len(problems)

    (closer0, reached0), (closer2, reached2) = walks(0.0), walks(0.2)
    assert 0.3 < closer0 < 0.45 and 0.15 < reached0 < 0.28  # uniform: 1-2 of 4 directions are closer
    assert closer2 > closer0 + 0.1 and reached0 + 0.08 < reached2 < 0.45


def test_progress_credit_rewards_distance_walked_off_and_only_the_goal_scores_one():
    env = GridEnv(progress_credit=0.5)
    env.reset(start="0,0", goal="2,1")  # 3 moves away
    assert env.reward("") == 0.0
    env.move("east")
    assert env.reward("") == pytest.approx(0.5 / 3)
    env.move("west")
    env.move("west")  # blocked: back at the start, no credit, never negative
    assert env.reward("") == 0.0
    for d in ("east", "east", "north"):
        env.move(d)
    assert env.reward("") == 1.0
    env.move("north")  # overshooting: 2 of 3 walked off
    assert env.reward("") == pytest.approx(0.5 * 2 / 3)
    with pytest.raises(ValueError, match="progress_credit must be in"):
        GridEnv(progress_credit=1.0)
