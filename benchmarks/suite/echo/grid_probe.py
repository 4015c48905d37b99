"""Do a grid model's first and second moves depend on where the goal is? (docs/echo.md, rounds 3 and 5)

    python benchmarks/run.py echo --mode grid_probe                    # builtin:tiny-grid (built if missing)
    python benchmarks/run.py echo --mode grid_probe --observe cell     # builtin:tiny-grid-cells (cells only)
    python benchmarks/run.py echo --mode grid_probe --observe delayed  # builtin:tiny-grid-delayed (one move late)
    python benchmarks/run.py echo --mode grid_probe PATH [PATH ...]    # other model folders, e.g. another recipe's

For every (start, goal) pair of a split, the probability the model gives each of the four complete first-move calls
(`move(direction)` then <|im_end|>, scored with `transformers` in the warm-up's token layout), renormalized over the
four. Prints the mean probability of the moves that shorten the distance against what a uniform walker gives, and
how much the distribution varies between prompts (its largest spread over pairs, per direction). A policy that
uses the prompt has a spread well above 0; RL can only sharpen a preference that shows up here. The second move is
probed the same way after one move toward the goal (the first such direction, and its observation in the `--observe`
wording), over the pairs whose goal is still away: with cells-only observations it needs the offset tracked through
the first move. Last, the probability of stopping ("Done.") after that first move, on the goal and off it: with
delayed observations nothing the walker was told says it stands on the goal, so stopping right needs the prediction.
No Ray, no vLLM: seconds on one core.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from agentrl_ray.builtin import grid as builtin_grid
from agentrl_ray.builtin import model as builtin_model
from agentrl_ray.tasks import grid


def call(direction: str) -> dict:
    fn = {"type": "function", "function": {"name": "move", "arguments": {"direction": direction}}}
    return {"role": "assistant", "content": "", "tool_calls": [fn]}


def turn_logp(model, tokenizer, tools, before: list[dict], turn: dict) -> float:
    """log P(the assistant `turn`, whole) after the messages `before` (their own assistant turns are given)."""
    ids, mask = builtin_grid.messages_example(tokenizer, tools, [*before, turn])
    last = [0] * len(mask)  # score the last assistant turn only
    first = max(i for i in range(len(mask)) if mask[i] and (i == 0 or not mask[i - 1]))
    last[first:] = mask[first:]
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits[0, :-1]  # (T-1, V): position t predicts token t + 1
    token_logps = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
    return token_logps[torch.tensor(last[1:]).bool()].sum().item()


def dialogue(start, goal, history) -> list[dict]:
    before = [{"role": "user", "content": grid.question(start, goal)}]
    for direction, obs in history:
        before += [call(direction), {"role": "tool", "name": "move", "content": obs}]
    return before


def move_probs(model, tokenizer, tools, start, goal, history=()) -> dict[str, float]:
    """P(each complete move call) after the user's question and `history` [(direction, observation)], over the four."""
    before = dialogue(start, goal, history)
    logps = {d: turn_logp(model, tokenizer, tools, before, call(d)) for d in sorted(grid.DIRECTIONS)}
    total = sum(math.exp(v) for v in logps.values())
    return {d: math.exp(v) / total for d, v in logps.items()}


def stop_prob(model, tokenizer, tools, start, goal, history) -> float:
    """P(the final answer "Done.") against the four moves, after `history`."""
    before = dialogue(start, goal, history)
    done = math.exp(turn_logp(model, tokenizer, tools, before, {"role": "assistant", "content": grid.FINAL_ANSWER}))
    moves = sum(math.exp(turn_logp(model, tokenizer, tools, before, call(d))) for d in grid.DIRECTIONS)
    return done / (done + moves)


def closer(cell, goal) -> list[str]:
    return [
        d for d in sorted(grid.DIRECTIONS) if grid.distance(grid.step(cell, d)[0], goal) < grid.distance(cell, goal)
    ]


def probe(path: str, split: str, observe: str = "offset") -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tools = builtin_grid.grid_tools()
    toward, uniform, per_direction = [], [], {d: [] for d in grid.DIRECTIONS}
    second, second_uniform, stop_on, stop_off = [], [], [], []
    for start, goal in grid.all_problems(split):
        probs = move_probs(model, tokenizer, tools, start, goal)
        toward.append(sum(probs[d] for d in closer(start, goal)))
        uniform.append(len(closer(start, goal)) / len(probs))
        for d, p in probs.items():
            per_direction[d].append(p)
        first = closer(start, goal)[0]
        cell, blocked = grid.step(start, first)
        history = [(first, grid.observation(cell, blocked, goal, observe, start))]
        # Stop on the goal, go on off it: with delayed observations the last report never says "goal" here.
        (stop_on if cell == goal else stop_off).append(stop_prob(model, tokenizer, tools, start, goal, history))
        if cell == goal:
            continue
        probs = move_probs(model, tokenizer, tools, start, goal, history)
        second.append(sum(probs[d] for d in closer(cell, goal)))
        second_uniform.append(len(closer(cell, goal)) / len(probs))
    spread = max(max(ps) - min(ps) for ps in per_direction.values())
    return (
        f"{path} [{split}, {len(toward)} pairs, {observe} observations]: P(first move toward the goal) "
        f"{statistics.mean(toward):.3f} (uniform walker {statistics.mean(uniform):.3f}); largest spread of a "
        f"direction's probability over prompts {spread:.3f}; P(second move toward the goal) "
        f"{statistics.mean(second):.3f} over {len(second)} pairs (uniform {statistics.mean(second_uniform):.3f}); "
        f"P(Done.) after that move: on the goal {statistics.mean(stop_on):.3f} ({len(stop_on)} pairs), off it "
        f"{statistics.mean(stop_off):.3f}"
    )


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="model folders (default: builtin:tiny-grid)")
    p.add_argument("--split", choices=grid.SPLITS, default="eval")
    p.add_argument("--observe", choices=grid.OBSERVATIONS, default="offset", help="the observations' wording")
    args = p.parse_args(argv)
    torch.set_num_threads(1)
    default = "tiny-grid" if args.observe == "offset" else f"tiny-grid-{args.observe}"
    for path in args.paths or [str(builtin_model.ensure_builtin_model(size=default))]:
        print(probe(path, args.split, args.observe), flush=True)
