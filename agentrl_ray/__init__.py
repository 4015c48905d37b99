"""agentrl_ray: a Ray-distributed GRPO + ECHO trainer for tool-using LLM agents."""

__version__ = "0.1.0"
