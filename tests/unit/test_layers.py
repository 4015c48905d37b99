"""The house keeps its shape: imports point down the layers of docs/architecture.md, no module imports itself back
through others, no file grows past 400 lines, and the package's top level holds at most 12 modules.

Imports are read with ast, those inside functions and under `if TYPE_CHECKING:` included: a deferred import is still
a dependency. `envs`, `rewards` and `sync` never import `rollout` or `learner`; nothing imports `driver` but the
entry points.
"""

import ast
from pathlib import Path

PACKAGE = Path(__file__).resolve().parents[2] / "agentrl_ray"

# Layer of each part of the package (a top-level module or folder). A module may import its own part or a part of a
# lower layer.
LAYERS = {
    # foundations
    "types": 0,  # wire types and the token-role enum
    "tasks": 0,  # the built-in tasks' prompts, answers and grid dynamics (pure)
    "config": 1,  # the schema: one section per role, each with its checks
    "chat_format": 1,  # the hermes format, both directions
    "messages": 2,  # chat messages of an episode (OpenAI style)
    "algorithms": 2,  # pure tensor functions of the RL loss
    "data": 2,  # prompt datasets
    "infra": 2,  # where things run: hardware, threads, profiles (and the layered config loader), placement, cluster
    # roles, lowest first
    "envs": 3,
    "rewards": 4,
    "sync": 4,
    "builtin": 4,  # the built-in models (the calculator and grid envs' tools) and resolve_model
    "traces": 5,  # trace records, converters, SFT warm start
    "run": 5,  # the run's folder: outputs, resume repair, the driver's preflight
    "rollout": 5,
    "learner": 6,
    # entry points and using a trained model
    "driver": 7,
    "trained": 7,  # checkpoints, inference, eval, chat, export: the rollout pool on a checkpoint
    "view": 7,  # agentrl-ray view: a web page over run folders (reads them; imports config for its errors)
    "api": 8,
    "cli": 9,
    "__main__": 10,
    "__init__": 11,  # the package's face: `agentrl_ray.train` is `api.train`, imported on first use
}
NEVER = [("envs", "rollout"), ("envs", "learner"), ("rewards", "rollout"), ("rewards", "learner")]
NEVER += [("sync", "rollout"), ("sync", "learner")]
DRIVER_USERS = {"api", "cli"}  # the entry points
MAX_LINES = 400
MAX_TOP_LEVEL_MODULES = 12


def _modules() -> dict[str, Path]:
    """{'agentrl_ray.rollout.pool': path} for every module of the package ('agentrl_ray.envs' for its __init__)."""
    out = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        parts = ("agentrl_ray", *path.relative_to(PACKAGE).with_suffix("").parts)
        out[".".join(parts[:-1] if parts[-1] == "__init__" else parts)] = path
    return out


def _part(module: str) -> str | None:
    """'agentrl_ray.rollout.pool' -> 'rollout'; None for a module outside the package."""
    parts = module.split(".")
    if parts[0] != "agentrl_ray":
        return None
    return parts[1] if len(parts) > 1 else "__init__"


def _imports(source: str, modules=()) -> list[tuple[int, str]]:
    """(line, module) of every import of `source`; `from pkg import sub` counts as an import of the module
    `pkg.sub` when that is one of `modules`."""
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            subs = [f"{node.module}.{a.name}" for a in node.names if f"{node.module}.{a.name}" in modules]
            out += [(node.lineno, m) for m in subs]
            if len(subs) < len(node.names):
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
        elif LAYERS[target] >= LAYERS[part]:
            bad.append(f"{where}:{line}: {part} (layer {LAYERS[part]}) imports {module} (layer {LAYERS[target]})")
        elif (part, target) in NEVER or (target == "driver" and part not in DRIVER_USERS):
            bad.append(f"{where}:{line}: {part} must never import {module}")
    return bad


def cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """The import cycles of `graph` (its strongly connected components of more than one module), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    found = []

    def visit(v: str) -> None:
        index[v] = low[v] = len(index)
        stack.append(v)
        for w in graph.get(v, ()):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in stack:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            component = []
            while True:
                w = stack.pop()
                component.append(w)
                if w == v:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for v in sorted(graph):
        if v not in index:
            visit(v)
    return found


def test_every_part_of_the_package_has_a_layer():
    parts = {_part(m) for m in _modules()}
    assert parts <= set(LAYERS), f"new parts need a layer here and in docs/architecture.md: {parts - set(LAYERS)}"


def test_imports_point_down():
    bad = []
    for module, path in _modules().items():
        bad += violations(_part(module), f"agentrl_ray/{path.relative_to(PACKAGE)}", path.read_text())
    assert not bad, "imports against the layers:\n" + "\n".join(bad)


def test_no_import_cycle():
    modules = _modules()
    graph = {
        m: {dep for _, dep in _imports(path.read_text(), modules) if dep in modules and dep != m}
        for m, path in modules.items()
    }
    assert cycles(graph) == []


def test_no_file_over_400_lines():
    long = {str(p.relative_to(PACKAGE)): n for p in PACKAGE.rglob("*.py") if (n := len(p.read_text().splitlines()))}
    assert {p: n for p, n in long.items() if n > MAX_LINES} == {}


def test_a_short_top_level():
    top = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(top) <= MAX_TOP_LEVEL_MODULES, f"{len(top)} modules at the top level: {top}"


def test_the_checks_catch_an_upward_import_and_a_cycle():
    source = "import os\n\ndef f():\n    from agentrl_ray.rollout.pool import RolloutPool\n"
    assert violations("envs", "agentrl_ray/envs/x.py", source) == [
        "agentrl_ray/envs/x.py:4: envs (layer 3) imports agentrl_ray.rollout.pool (layer 5)"
    ]
    assert violations("sync", "s.py", "import agentrl_ray.learner.loop") != []
    assert violations("trained", "t.py", "from agentrl_ray.driver import train") != []
    assert violations("cli", "c.py", "from agentrl_ray.driver import train") == []
    assert violations("rollout", "r.py", "from agentrl_ray.sync.receiver import WeightReceiver") == []
    assert violations("builtin", "b.py", "from agentrl_ray.tasks import grid") == []
    assert violations("tasks", "t.py", "from agentrl_ray.builtin.model import RECIPES") != []
    assert cycles({"a": {"b"}, "b": {"c"}, "c": {"a"}, "d": {"a"}}) == [["a", "b", "c"]]
    assert cycles({"a": {"b"}, "b": set()}) == []


def test_the_learners_levers_sit_below_its_rl_path():
    """learner/levers/ (the speed and memory levers) import each other, config and the foundations, never the
    learner's RL path (loop, update, feed, policy, ...), so that the algorithm reads without them."""
    modules = _modules()
    bad = []
    for name, path in modules.items():
        if not name.startswith("agentrl_ray.learner.levers"):
            continue
        for line, module in _imports(path.read_text(), modules):
            if module.startswith("agentrl_ray.learner.") and not module.startswith("agentrl_ray.learner.levers"):
                bad.append(f"{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert not bad, bad
    assert any(n.startswith("agentrl_ray.learner.levers.") for n in modules)  # the room is there
