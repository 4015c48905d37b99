"""agentrl_ray: a Ray-distributed GRPO + ECHO trainer for tool-using LLM agents.

`agentrl_ray.train(...)` is the Python API (`agentrl_ray.api`); it is imported on first use, so `import agentrl_ray`
stays light (no torch, Ray or vLLM).
"""

__version__ = "0.1.0"
_API = ("train", "TrainResult")


def __getattr__(name: str):
    if name in _API:
        from agentrl_ray import api

        return getattr(api, name)
    raise AttributeError(f"module 'agentrl_ray' has no attribute {name!r}")
