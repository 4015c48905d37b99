"""agentrl_ray: a Ray-distributed GRPO + ECHO trainer for tool-using LLM agents.

`agentrl_ray.train(...)` is the Python API (`agentrl_ray.api`); it is imported on first use, so `import agentrl_ray`
stays light (no torch, Ray or vLLM).
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import sys

__version__ = "0.1.0"
_API = ("train", "TrainResult")

# Modules that moved when the package was grouped into folders by role (docs/house.md), and the learner's speed
# levers when they got a folder of their own (learner/levers/). The built-in environments' old paths keep working,
# because configs and the config.json of earlier runs name them ("agentrl_ray.envs.calculator:CalculatorEnv");
# importing any other old path fails with its new place.
ALIASED = {f"envs.{name}": f"envs.builtin.{name}" for name in ("calculator", "code_exec", "grid")}
MOVED = {
    **{m: f"infra.{m}" for m in ("hardware", "threads", "allocator", "sizing", "profiles", "cluster_hardware")},
    **{m: f"infra.{m}" for m in ("placement", "cluster", "storage", "hub", "local_ray", "doctor", "plan_cmd")},
    **{m: f"run.{m}" for m in ("outputs", "resume", "preflight")},
    **{m: f"trained.{m}" for m in ("checkpoints", "inference", "evaluate", "chat", "export", "gguf_convert")},
    **{f"envs.{m}": f"envs.isolation.{m}" for m in ("cgroups", "child", "children", "confine", "sandbox", "zygote")},
    "envs.sandbox_uids": "envs.isolation.sandbox_uids",
    "config_help": "config.help",
    "stability": "config.stability",
    "sft": "traces.sft",
    "builtin_model": "builtin.model",
    "builtin_grid": "builtin.grid",
    "eval_stats": "rewards.eval_stats",
    "chunked_logprobs": "learner.levers.chunked_logprobs",
    "health": "learner.health",
    "engine_modes": "rollout.engine_modes",
    "deadlines": "rollout.deadlines",
    **{f"learner.{m}": f"learner.levers.{m}" for m in ("chunked_logprobs", "compilation", "cpu_attention")},
    **{f"learner.{m}": f"learner.levers.{m}" for m in ("linear_fusion", "qlora", "shared_prefix", "zero")},
}


class _Moved(importlib.abc.MetaPathFinder, importlib.abc.Loader):
    """Asked first, so an old name never reaches another copy of the package (an editable install elsewhere)."""

    def find_spec(self, fullname, path=None, target=None):
        old = fullname.removeprefix(__name__ + ".")
        head = next((m for m in MOVED if old == m or old.startswith(m + ".")), None)
        if old == fullname or (old not in ALIASED and head is None):
            return None
        if importlib.machinery.PathFinder.find_spec(fullname, path):  # a module of that name exists (again)
            return None
        if old in ALIASED:
            return importlib.util.spec_from_loader(fullname, self)
        raise ImportError(f"{fullname} moved to {__name__}.{MOVED[head]}{old.removeprefix(head)}", name=fullname)

    def create_module(self, spec):
        module = importlib.import_module(f"{__name__}.{ALIASED[spec.name.removeprefix(__name__ + '.')]}")
        self._spec = module.__spec__
        return module

    def exec_module(self, module):
        module.__spec__ = self._spec  # the import system set the old name's spec on the module: give it back


if not any(isinstance(f, _Moved) for f in sys.meta_path):
    sys.meta_path.insert(0, _Moved())


def __getattr__(name: str):
    if name in _API:
        from agentrl_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'agentrl_ray' has no attribute {name!r}")
