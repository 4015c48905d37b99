"""What samples and what answers: the rollout engines (`rollout.*`), the environment (`env.*`) and the reward
functions (`reward.*`)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Literal

from agentrl_ray.config.checking import ConfigError, check_resources, need

MCP_PREFIX = "mcp:"  # how an env.mcp_servers entry travels in the tools tuple of envs.loading.env_class
MCP_STDIO_KEYS = {"command", "args", "env", "cwd", "shared"}


@dataclass
class RolloutConfig:
    """The rollout workers: one engine each (`rollout.*`)."""

    backend: Literal["vllm", "torch"] = "vllm"
    """Rollout engine: vllm (default, CPU and CUDA) or torch (transformers' generation on any device torch runs on:
    the fallback where vLLM does not run). Which supports what: docs/backends.md."""
    num_workers: int = 1
    """Rollout workers (one engine each); each step's prompts are split over them."""
    group_size: int = 8
    """Trajectories sampled per prompt (GRPO's group)."""
    prompts_per_step: int = 16
    """Prompts per optimizer step."""
    max_turns: int = 3
    """Assistant turns per episode."""
    tool_format: Literal["auto", "hermes", "llama3_json", "qwen3_xml", "openai", "mistral"] = "auto"
    """How the model writes tool calls and how results follow a turn (rollout/tool_format.py): hermes
    (<tool_call> JSON: Qwen2.5, SmolLM2, the built-in models), llama3_json (Llama 3.x), qwen3_xml (Qwen3-Coder,
    Qwen3.5+), openai (gpt-oss's harmony), mistral ([TOOL_CALLS], Mistral's tokenizers before v11); auto = read off
    the model's chat template. llama3_json, qwen3_xml and openai frame results as the template renders them,
    mistral as mistral_common encodes them."""
    max_tokens_per_turn: int = 48
    """Tokens the policy may generate in one turn."""
    max_total_tokens: int = 320
    """Token budget of a whole episode: prompt, turns and tool results."""
    temperature: float = 1.0
    """Sampling temperature of training rollouts."""
    top_p: float = 1.0
    """Nucleus sampling threshold of training rollouts."""
    eval_temperature: float = 1.0
    """Sampling temperature of held-out evaluation (pass@1 of the policy as it is trained; 0 = greedy)."""
    kv_cache_gib: float = 0.0
    """KV-cache memory of a CPU engine, GiB; 0 = sized to the run: room for every sequence of one rollout call (at
    most max_num_seqs) at max_total_tokens, at least 16 MiB. vLLM CPU holds the whole cache resident."""
    max_num_seqs: int = 256
    """Sequences an engine runs at once."""
    num_cpus_per_worker: float = 0.5
    """Ray CPUs reserved per rollout worker."""
    use_gpu: bool = False
    """Engines run on CUDA; how many GPUs each one gets is the placement plan's (`infra/placement.py`)."""
    tensor_parallel_size: int = 1
    """GPUs per engine (vLLM tensor parallelism), all on one node."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources every engine asks for (e.g. {"rollout_node": 1}) to pin engines to labelled nodes."""
    gpu_memory_utilization: float = 0.0
    """Fraction of a GPU's memory vLLM may take (weights + KV cache); 0 = from the placement mode (0.85 on a GPU
    of its own, 0.35 on a GPU shared with a learner rank)."""
    enable_prefix_caching: bool = True
    """Reuse KV blocks across the samples of a group and the turns of an episode."""
    engine_kwargs: dict[str, Any] = field(default_factory=dict)
    """Extra engine arguments we do not wrap, checked when the engine starts: names of vLLM's EngineArgs (vllm), or
    cache_implementation (dynamic|static) and compile (true|false) for the torch backend."""
    sleep_mode: Literal["auto", "always", "never"] = "auto"
    """Engine sleep between rollouts (vLLM's sleep mode level 1; the torch backend moves its weights to CPU memory),
    so a learner rank sharing the GPU gets its memory: auto = on when engines and learner ranks share GPUs
    (placement colocated) and sync.max_staleness=0; always needs GPU engines."""
    lora_mode: Literal["auto", "native", "merge"] = "auto"
    """How engines apply the synced LoRA adapter: native = vLLM's LoRA (a new LoRARequest per version), merge = into
    the base weights, read again from the model folder tensor by tensor at each update (the engine keeps no copy of
    them); auto = native on GPU engines, merge on CPU (rollout/engine_modes.py); the torch backend always merges."""
    enforce_eager: bool = True
    """Run vLLM without CUDA graphs (required on CPU)."""
    system_prompt: str = ""
    """System message put before every prompt that has none (the chat template lists the tools after it)."""
    num_threads: int = 0
    """CPU threads of each engine; 0 = from the node's cores (see agentrl_ray/infra/threads.py)."""

    def check(self) -> None:
        need(self.num_workers >= 0, "rollout.num_workers must be >= 0 (0 = sized from the cluster's GPUs)")
        need(self.tensor_parallel_size >= 1, "rollout.tensor_parallel_size must be at least 1")
        need(
            self.use_gpu or self.tensor_parallel_size == 1,
            "rollout.tensor_parallel_size > 1 needs rollout.use_gpu=true (tensor parallelism splits an engine over "
            "GPUs)",
        )
        need(
            self.sleep_mode != "always" or self.use_gpu,
            "rollout.sleep_mode=always needs rollout.use_gpu=true: engines sleep on accelerators only, not on CPU",
        )
        need(
            self.backend == "vllm" or self.tensor_parallel_size == 1,
            "rollout.tensor_parallel_size > 1 is vLLM's tensor parallelism: the torch backend runs one device per "
            "engine",
        )
        need(
            self.backend == "vllm" or self.lora_mode != "native",
            "rollout.lora_mode=native is vLLM's LoRA; the torch backend merges adapters: use rollout.lora_mode=merge",
        )
        need(
            0 <= self.gpu_memory_utilization <= 1,
            "rollout.gpu_memory_utilization must be in [0, 1] (0 = from placement)",
        )
        check_resources("rollout", self.resources)
        need(self.group_size >= 2, "rollout.group_size must be at least 2: GRPO normalizes rewards within a group")
        need(self.prompts_per_step >= 1, "rollout.prompts_per_step must be at least 1")
        need(self.max_turns >= 1, "rollout.max_turns must be at least 1")
        need(self.max_tokens_per_turn >= 1, "rollout.max_tokens_per_turn must be at least 1")
        need(
            self.max_total_tokens > self.max_tokens_per_turn,
            f"rollout.max_total_tokens ({self.max_total_tokens}) must exceed rollout.max_tokens_per_turn "
            f"({self.max_tokens_per_turn}): the prompt has to fit too",
        )
        need(self.temperature > 0, "rollout.temperature must be > 0 for training rollouts")
        need(self.eval_temperature >= 0, "rollout.eval_temperature must be >= 0 (0 = greedy)")
        need(0 < self.top_p <= 1, "rollout.top_p must be in (0, 1]")
        need(self.kv_cache_gib >= 0, "rollout.kv_cache_gib must be >= 0 (0 = sized to the run)")


@dataclass
class EnvConfig:
    """The environment and its host actors (`env.*`)."""

    name: str = "agentrl_ray.envs.builtin.calculator:CalculatorEnv"
    """Import path package.module:Class of the TRL-style environment (its public methods are the tools)."""
    tools: list[str] = field(default_factory=list)
    """Plain functions added as tools ("package.module:function"); with env.name "" they are the only tools."""
    mcp_servers: list[dict[str, Any]] = field(default_factory=list)
    """MCP tool servers whose tools are added: {command, args, env, cwd} (stdio, one per trajectory) or {url}
    (Streamable HTTP). Their list_tools gives the schemas; docs/environments.md."""
    kwargs: dict[str, Any] = field(default_factory=dict)
    """Keyword arguments of the environment's constructor."""
    num_actors: int = 1
    """Env host actors; each holds the environments of many trajectories."""
    num_cpus_per_actor: float = 0.25
    """Ray CPUs reserved per env host."""
    tool_timeout_s: float = 10.0
    """Seconds a tool call, step, reset, reward or constructor may take before it becomes the trajectory's error."""
    isolation: Literal["auto", "thread", "process", "sandbox"] = "auto"
    """Where each trajectory's environment runs: host threads, its own child process (killed on timeout or crash),
    that child sandboxed (own uid, no network, private /tmp; root only), or auto: thread for agentrl_ray.envs.*,
    process for any other environment. Costs and why: docs/reliability.md. An env.agent program runs sandboxed at
    sandbox (with its endpoint as its only way out), else at auto: its own process group, rlimits, TMPDIR
    (docs/openai_agent.md)."""
    resources: dict[str, float] = field(default_factory=dict)
    """Custom Ray resources every env host asks for (pins env hosts to labelled nodes)."""
    agent: str = ""
    """Import path package.module:function of an agent program, `async def run(client, row)` with an
    openai.AsyncOpenAI client pointed at the rollout engines (docs/openai_agent.md); set, it replaces env.name's
    environment: each trajectory is one run of it, in a process of its own, confined at env.isolation."""
    agent_timeout_s: float = 120.0
    """Seconds one run of env.agent may take before it is killed and its trajectory counts as an error."""
    agent_processes: int = 64
    """env.agent programs running at once per rollout worker."""

    def check(self) -> None:
        check_resources("env", self.resources)
        need(self.num_actors >= 0, "env.num_actors must be >= 0 (0 = one env host per engine)")
        need(self.tool_timeout_s > 0, "env.tool_timeout_s must be > 0")
        need(
            self.isolation in ("auto", "thread", "process", "sandbox"),
            f"env.isolation must be auto, thread, process or sandbox, got {self.isolation!r}",
        )
        need(self.agent == "" or ":" in self.agent, f"env.agent {self.agent[:60]!r} must be 'package.module:function'")
        need(self.agent_timeout_s > 0, "env.agent_timeout_s must be > 0")
        need(self.agent_processes >= 1, "env.agent_processes must be at least 1")
        need(
            bool(self.agent) or ":" in self.name or (self.name == "" and bool(self.tools or self.mcp_servers)),
            f"env.name {self.name!r} must be an import path 'package.module:Class' (or \"\" with env.tools or "
            "env.mcp_servers)",
        )
        for i, tool in enumerate(self.tools):
            need(":" in tool, f"env.tools[{i}] {tool[:60]!r} must be an import path 'package.module:function'")
        self.tool_specs()

    def tool_specs(self) -> tuple[str, ...]:
        """What `envs.loading.env_class` adds to env.name's class: env.tools, then each of env.mcp_servers as
        "mcp:{json}" (checked here: a malformed entry is a ConfigError naming it)."""
        servers = []
        for i, entry in enumerate(self.mcp_servers):
            try:
                servers.append(mcp_server_spec(entry, f"env.mcp_servers[{i}]"))
            except ValueError as e:
                raise ConfigError(str(e)) from None
        return (*self.tools, *servers)


def mcp_server_spec(entry: dict[str, Any], where: str = "env.mcp_servers") -> str:
    """One `env.mcp_servers` entry, checked, as the string that names it in the tools tuple."""
    if not isinstance(entry, dict):
        raise ValueError(f"{where}: each server is a mapping ({{command, args}} or {{url}}), got {entry!r}")
    if "url" in entry:
        unknown = set(entry) - {"url", "shared"}
        if unknown or not isinstance(entry["url"], str) or not entry["url"].startswith(("http://", "https://")):
            raise ValueError(f"{where}: a URL server is {{url: http(s)://..., shared: bool}}, got {entry!r}")
    else:
        unknown = set(entry) - MCP_STDIO_KEYS
        if unknown:
            raise ValueError(f"{where}: unknown keys {sorted(unknown)}; a stdio server takes {sorted(MCP_STDIO_KEYS)}")
        if not isinstance(entry.get("command"), str) or not entry["command"]:
            raise ValueError(f"{where}: a stdio server needs command: <executable>, got {entry!r}")
        if not all(isinstance(a, str) for a in entry.get("args", [])):
            raise ValueError(f"{where}: args must be a list of strings, got {entry.get('args')!r}")
    if not isinstance(entry.get("shared", False), bool):
        raise ValueError(f"{where}: shared must be true or false, got {entry['shared']!r}")
    return MCP_PREFIX + json.dumps(entry, sort_keys=True)


@dataclass
class RewardConfig:
    """Reward functions and their weights (`reward.*`)."""

    functions: list[str] = field(default_factory=lambda: ["answer_match"])
    """Built-in names (answer_match, format, tool_success, efficiency, env_reward) or import paths pkg.mod:function."""
    weights: list[float] = field(default_factory=lambda: [1.0])
    """One weight per reward function; the reward is their weighted sum."""
    max_failing_steps: int = 3
    """Stop the run when one reward function fails on every sample of this many steps in a row."""

    def check(self) -> None:
        need(
            len(self.functions) == len(self.weights),
            f"reward.functions has {len(self.functions)} entries but reward.weights has "
            f"{len(self.weights)}: give one weight per function",
        )
        need(self.max_failing_steps >= 1, "reward.max_failing_steps must be at least 1")
