"""Imports point down: every module's imports (read with ast, including imports inside functions) go to a lower layer
or stay in their own, per the layer diagram in docs/architecture.md. `envs`, `rewards` and `sync` never import
`rollout` or `learner`."""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "agentrl_ray"

# Layer of each top-level part of the package (a subpackage or a module). A module may import its own part, a
# part of a lower layer, or (layer 0 only) another part of layer 0.
LAYERS = {
    # foundation: pure modules any role may use
    "__init__": 0,
    "types": 0,
    "config": 0,
    "config_help": 0,
    "profiles": 0,
    "threads": 0,
    "allocator": 0,  # glibc's malloc settings for the processes that run the model, malloc_trim where a phase ends
    "local_ray": 0,
    "chat_format": 0,
    "algorithms": 0,
    "chunked_logprobs": 0,
    "data": 0,
    "tasks": 0,
    "outputs": 0,
    "placement": 0,  # the plan: a pure function of (nodes, config)
    "storage": 0,
    "hub": 0,
    "hardware": 0,
    "cluster_hardware": 0,  # the hardware summary from ray.nodes() (imports Ray only when a cluster is in play)
    "engine_modes": 0,  # engine sleep and native LoRA, decided from the config and the placement mode
    "sizing": 0,
    "stability": 0,
    "eval_stats": 0,  # pass@1 with its interval and pass@k: training's evaluations and `agentrl-ray eval`
    "health": 0,
    "messages": 0,
    "gguf_convert": 0,  # llama.cpp's converter in a subprocess, the Ollama Modelfile: nothing of ours
    "resume": 0,  # repairs a run directory before Ray starts (config, outputs, torch)
    "deadlines": 0,  # how long each remote wait may take, from the config (pure)
    # roles, lowest first
    "envs": 1,
    "rewards": 2,
    "sync": 2,
    "cluster": 2,  # the plan on a live Ray cluster (placement groups, node checks); driver-side
    "traces": 2,  # trace records and dataset converters (messages, types)
    "rollout": 3,
    "builtin_model": 3,  # builds the default model from the calculator env's tools
    "builtin_grid": 3,  # the grid task's part of the built-in models (the grid env's tools)
    "preflight": 3,  # the driver's dry pass over the data with the env class and the reward functions
    "learner": 4,
    "checkpoints": 3,  # a run's checkpoints read back; LoRA merged as sync.receiver merges it
    "driver": 5,
    "plan_cmd": 5,
    "sft": 5,  # warm start on traces: builds the built-in model when asked for it
    "doctor": 5,
    # using a trained run: the rollout pool on a checkpoint, then eval / chat / export, and the Python API
    "inference": 6,
    "evaluate": 7,
    "chat": 7,
    "export": 7,
    "api": 8,
    "cli": 9,
    "__main__": 10,
}


def _part(module: str) -> str | None:
    """'agentrl_ray.rollout.pool' -> 'rollout'; None for a module outside the package."""
    parts = module.split(".")
    return (
        parts[1] if parts[0] == "agentrl_ray" and len(parts) > 1 else ("__init__" if module == "agentrl_ray" else None)
    )


def _imports(source: str) -> list[tuple[int, str]]:
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            out.append((node.lineno, node.module))
    return out


def violations(part: str, where: str, source: str) -> list[str]:
    bad = []
    for line, module in _imports(source):
        target = _part(module)
        if target is None or target == part:
            continue
        if target not in LAYERS:
            bad.append(f"{where}:{line} imports {module}: its part {target!r} has no layer in this test")
        elif not (LAYERS[target] < LAYERS[part] or LAYERS[target] == LAYERS[part] == 0):
            bad.append(f"{where}:{line}: {part} (layer {LAYERS[part]}) imports {module} (layer {LAYERS[target]})")
    return bad


def test_every_part_of_the_package_has_a_layer():
    parts = {
        p.stem if p.is_file() else p.name
        for p in PACKAGE.iterdir()
        if p.suffix == ".py" or (p / "__init__.py").exists()
    }
    assert parts <= set(LAYERS), f"new parts need a layer here and in docs/architecture.md: {parts - set(LAYERS)}"


def test_imports_point_down():
    bad = []
    for path in sorted(PACKAGE.rglob("*.py")):
        rel = path.relative_to(PACKAGE)
        part = rel.parts[0].removesuffix(".py")
        bad += violations(part, f"agentrl_ray/{rel}", path.read_text())
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_the_check_catches_an_upward_import():
    source = "import os\n\ndef f():\n    from agentrl_ray.rollout.pool import RolloutPool\n"
    assert violations("envs", "agentrl_ray/envs/x.py", source) == [
        "agentrl_ray/envs/x.py:4: envs (layer 1) imports agentrl_ray.rollout.pool (layer 3)"
    ]
    assert violations("sync", "s.py", "import agentrl_ray.learner.loop") != []
    assert violations("rollout", "r.py", "from agentrl_ray.sync.receiver import WeightReceiver") == []
