"""Does a grid model's first move depend on where the goal is? (docs/echo.md, "Round 3")

    python benchmarks/grid_probe.py                       # builtin:tiny-grid from the cache (built if missing)
    python benchmarks/grid_probe.py PATH [PATH ...]       # other model folders, e.g. builds with another recipe

For every (start, goal) pair of a split, the probability the model gives each of the four complete first-move calls
(`move(direction)` then <|im_end|>, scored with `transformers` in the warm-up's token layout), renormalized over the
four. Prints the mean probability of the moves that shorten the distance against what a uniform walker gives, and
how much the distribution varies between prompts (its largest spread over pairs, per direction). A policy that
uses the prompt has a spread well above 0; RL can only sharpen a preference that shows up here. No Ray, no vLLM:
seconds on one core.
"""

from __future__ import annotations

import argparse
import math
import statistics

import torch

from agentrl_ray.builtin import grid as builtin_grid
from agentrl_ray.builtin import model as builtin_model
from agentrl_ray.tasks import grid


def first_move_probs(model, tokenizer, tools, start, goal) -> dict[str, float]:
    logps = {}
    for direction in sorted(grid.DIRECTIONS):
        call = {"type": "function", "function": {"name": "move", "arguments": {"direction": direction}}}
        messages = [
            {"role": "user", "content": grid.question(start, goal)},
            {"role": "assistant", "content": "", "tool_calls": [call]},
        ]
        ids, mask = builtin_grid.messages_example(tokenizer, tools, messages)
        with torch.no_grad():
            logits = model(torch.tensor([ids])).logits[0, :-1]  # (T-1, V): position t predicts token t + 1
        token_logps = torch.log_softmax(logits, -1)[torch.arange(len(ids) - 1), torch.tensor(ids[1:])]
        logps[direction] = token_logps[torch.tensor(mask[1:]).bool()].sum().item()
    total = sum(math.exp(v) for v in logps.values())
    return {d: math.exp(v) / total for d, v in logps.items()}


def probe(path: str, split: str) -> str:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(path)
    model = AutoModelForCausalLM.from_pretrained(path).eval()
    tools = builtin_grid.grid_tools()
    toward, uniform, per_direction = [], [], {d: [] for d in grid.DIRECTIONS}
    for start, goal in grid.all_problems(split):
        probs = first_move_probs(model, tokenizer, tools, start, goal)
        closer = [d for d in probs if grid.distance(grid.step(start, d)[0], goal) < grid.distance(start, goal)]
        toward.append(sum(probs[d] for d in closer))
        uniform.append(len(closer) / len(probs))
        for d, p in probs.items():
            per_direction[d].append(p)
    spread = max(max(ps) - min(ps) for ps in per_direction.values())
    return (
        f"{path} [{split}, {len(toward)} pairs]: P(first move toward the goal) {statistics.mean(toward):.3f} "
        f"(uniform walker {statistics.mean(uniform):.3f}); largest spread of a direction's probability over "
        f"prompts {spread:.3f}"
    )


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("paths", nargs="*", help="model folders (default: builtin:tiny-grid)")
    p.add_argument("--split", choices=grid.SPLITS, default="eval")
    args = p.parse_args()
    torch.set_num_threads(1)
    for path in args.paths or [str(builtin_model.ensure_builtin_model(size="tiny-grid"))]:
        print(probe(path, args.split), flush=True)


if __name__ == "__main__":
    main()
