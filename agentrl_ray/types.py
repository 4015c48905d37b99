"""Wire types: the only things that cross between roles (rollout → learner).

Each is validated on construction so a malformed trajectory fails where it was made, not three actors later.

Token roles (`TokenRole`), one 0/1 mask each in a `Trajectory`, all as long as `token_ids`:
- action: sampled by the policy (GRPO loss);
- env: the tool's own output text, or a turn-based environment's observation (ECHO loss);
- template: chat scaffolding around a tool result (no loss);
- prompt tokens are those in none of the three masks (no loss).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # annotations only: env hosts import this module and never need torch (~150 MB, 1.5 s each)
    import torch


class RunStopped(RuntimeError):
    """The run stops on purpose: a guard found that going on would train on garbage or cannot work (NaN/inf steps in
    a row, an actor past its restart bound, batches older than `sync.max_staleness`, a reward function failing on
    every sample). Unlike a crash, Ray Train must not retry it from a checkpoint, which would only meet it again: the
    learner records it with the driver's log actor before raising (`learner/loop.py`), a retried attempt ends at once,
    and the driver raises it with its own message."""


class TokenRole(enum.IntEnum):
    """Who produced a token: the one spelling used by the agent loop, the chat format and the masks."""

    PROMPT = 0
    ACTION = 1
    ENV = 2
    TEMPLATE = 3


def role_masks(roles: list[TokenRole]) -> dict[str, list[int]]:
    """The three 0/1 masks of a `Trajectory` from one role per token (prompt tokens are in none)."""
    return {
        "action_mask": [int(r == TokenRole.ACTION) for r in roles],
        "env_mask": [int(r == TokenRole.ENV) for r in roles],
        "template_mask": [int(r == TokenRole.TEMPLATE) for r in roles],
    }


# "answer": a tool episode's final answer; "done": a turn-based environment ended the episode (see rollout.agent_loop).
FINISH_REASONS = ("answer", "done", "max_turns", "length", "error")


@dataclass
class SequencePart:
    """An earlier training sequence of a trajectory whose agent rewrote its history (`rollout/endpoint/stitch.py`):
    trained with the trajectory's advantage, as a row of its own. Masks as in `Trajectory`."""

    token_ids: list[int]
    action_mask: list[int]
    env_mask: list[int]
    template_mask: list[int]
    rollout_logprobs: list[float]
    prompt_len: int

    def __post_init__(self) -> None:
        for name in ("action_mask", "env_mask", "template_mask", "rollout_logprobs"):
            if len(getattr(self, name)) != len(self.token_ids):
                n, want = len(getattr(self, name)), len(self.token_ids)
                raise ValueError(f"SequencePart: {name} has length {n}, token_ids has {want}")


@dataclass
class Trajectory:
    prompt_id: str
    sample_index: int
    token_ids: list[int]
    action_mask: list[int]
    env_mask: list[int]
    template_mask: list[int]
    rollout_logprobs: list[float]  # logprob of each action token under the rollout policy; 0.0 elsewhere
    reward: float
    policy_version: int
    finish_reason: str
    prompt_len: int
    reward_parts: dict[str, float] = field(default_factory=dict)
    num_tool_calls: int = 0  # tool calls, well-formed or not
    num_tool_errors: int = 0
    num_steps: int = 0  # a turn-based environment's `step` calls
    num_step_errors: int = 0
    # The conversation as structured chat messages (`messages.py`): the prompt as rendered (reset text included) and
    # the completion, for reward functions and saved traces (`run.save_rollouts`).
    prompt_messages: list[dict] = field(default_factory=list)
    completion_messages: list[dict] = field(default_factory=list)
    # An agent behind the OpenAI endpoint that rewrote its history: the sequences before this one (the last).
    earlier_parts: list[SequencePart] = field(default_factory=list)
    # "" when the trained ids hold every engine call's prompt and sample intact, else where they part
    # (`rollout/continuity.py`, checked where the trajectory is assembled; counted by `learner/integrity.py`).
    continuity_break: str = ""
    # The weights version that sampled each token (-1: a prompt or environment token), or [] where the engine calls
    # were not recorded; `policy_version` is the oldest sampled token's. Within one version in the batch pipeline; a
    # weight update lands between two turns of an episode in the streaming one (rollout/turn_scheduler.py).
    token_versions: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.earlier_parts = [p if isinstance(p, SequencePart) else SequencePart(**p) for p in self.earlier_parts]
        n = len(self.token_ids)
        for name in ("action_mask", "env_mask", "template_mask", "rollout_logprobs"):
            if len(getattr(self, name)) != n:
                raise ValueError(
                    f"Trajectory {self.prompt_id}/{self.sample_index}: {name} has length "
                    f"{len(getattr(self, name))}, token_ids has {n}"
                )
        for i, (a, e, t) in enumerate(zip(self.action_mask, self.env_mask, self.template_mask)):
            if a + e + t > 1:
                raise ValueError(f"Trajectory {self.prompt_id}/{self.sample_index}: token {i} is in two roles")
        if any(self.action_mask[: self.prompt_len]) or any(self.env_mask[: self.prompt_len]):
            raise ValueError(f"Trajectory {self.prompt_id}/{self.sample_index}: prompt tokens carry a loss mask")
        if self.finish_reason not in FINISH_REASONS:
            raise ValueError(f"Trajectory finish_reason {self.finish_reason!r} not in {FINISH_REASONS}")
        if self.policy_version < 0:
            raise ValueError("Trajectory policy_version must be >= 0")
        if self.token_versions and len(self.token_versions) != n:
            raise ValueError(
                f"Trajectory {self.prompt_id}/{self.sample_index}: token_versions has length "
                f"{len(self.token_versions)}, token_ids has {n}"
            )
        if not (self.reward == self.reward):  # NaN
            raise ValueError(f"Trajectory {self.prompt_id}/{self.sample_index}: reward is NaN")

    @property
    def num_action_tokens(self) -> int:
        return sum(self.action_mask)

    @property
    def num_env_tokens(self) -> int:
        return sum(self.env_mask)


@dataclass
class TrajectoryGroup:
    """The G samples of one prompt: the unit GRPO normalizes over."""

    prompt_id: str
    trajectories: list[Trajectory]

    def __post_init__(self) -> None:
        if not self.trajectories:
            raise ValueError(f"TrajectoryGroup {self.prompt_id} is empty")
        for t in self.trajectories:
            if t.prompt_id != self.prompt_id:
                raise ValueError(f"TrajectoryGroup {self.prompt_id} holds a trajectory of {t.prompt_id}")

    @property
    def rewards(self) -> list[float]:
        return [t.reward for t in self.trajectories]

    @property
    def min_policy_version(self) -> int:
        return min(t.policy_version for t in self.trajectories)


@dataclass
class TrainBatch:
    """Padded tensors for one learner step (or one micro-batch of it). Shapes: (B, T) unless noted."""

    input_ids: torch.Tensor
    attention_mask: torch.Tensor
    action_mask: torch.Tensor
    env_mask: torch.Tensor
    rollout_logprobs: torch.Tensor
    advantages: torch.Tensor  # (B,)
    truncated: torch.Tensor  # (B,) bool: the completion hit the token budget
    policy_version: torch.Tensor  # (B,)

    def __post_init__(self) -> None:
        b, t = self.input_ids.shape
        for name in ("attention_mask", "action_mask", "env_mask", "rollout_logprobs"):
            if tuple(getattr(self, name).shape) != (b, t):
                raise ValueError(f"TrainBatch.{name} has shape {tuple(getattr(self, name).shape)}, want {(b, t)}")
        for name in ("advantages", "truncated", "policy_version"):
            if tuple(getattr(self, name).shape) != (b,):
                raise ValueError(f"TrainBatch.{name} has shape {tuple(getattr(self, name).shape)}, want {(b,)}")

    def __len__(self) -> int:
        return self.input_ids.shape[0]

    def slice(self, start: int, stop: int) -> TrainBatch:
        return TrainBatch(**{k: v[start:stop] for k, v in self.__dict__.items()})

    def select(self, rows: torch.Tensor) -> TrainBatch:
        """The rows where `rows` (B,) bool is True, in order."""
        return TrainBatch(**{k: v[rows] for k, v in self.__dict__.items()})

    def to(self, device: torch.device | str) -> TrainBatch:
        return TrainBatch(**{k: v.to(device) for k, v in self.__dict__.items()})


# ---------------------------------------------------------------- weight sync (learner rank 0 → rollout engines)


@dataclass(frozen=True)
class TensorMeta:
    """One tensor of a weight update. `offset`/`nbytes` place it in the packed buffer of the object-store transport
    (`sync.packing`); the collective transport leaves them 0 (its tensors arrive in broadcast order)."""

    name: str
    dtype: str  # torch dtype name without the "torch." prefix, e.g. "float32"
    shape: tuple[int, ...]
    offset: int = 0
    nbytes: int = 0

    @property
    def numel(self) -> int:
        n = 1
        for d in self.shape:
            n *= d
        return n


WEIGHT_KINDS = ("full", "lora")
WEIGHT_TRANSPORTS = ("object_store", "collective", "ipc")


@dataclass
class WeightUpdate:
    """A weight update, the one message between `sync.sender` and `sync.receiver`.

    kind "full": Hugging Face named tensors of the whole model; "lora": the adapter's A/B tensors, which the
    receiver merges into its base weights with `lora_scaling`. Object store: `payload` is the reference of one packed
    buffer laid out by `tensors`. Collective: `payload` is None and the tensors arrive by broadcast, in order, in
    `buckets` (tensors per broadcast; each bucket is of one dtype). IPC: `payload` holds one `sync.ipc.IpcHandle`
    per bucket, a flat buffer on the learner's GPU that the engine opens in place (`sync/ipc.py`).
    """

    version: int
    kind: str
    tensors: list[TensorMeta]
    payload: Any = None
    lora_scaling: float = 0.0
    buckets: list[int] = field(default_factory=list)
    transport: str = "object_store"

    def __post_init__(self) -> None:
        if self.kind not in WEIGHT_KINDS:
            raise ValueError(f"WeightUpdate kind {self.kind!r} not in {WEIGHT_KINDS}")
        if self.version < 0:
            raise ValueError(f"WeightUpdate version must be >= 0, got {self.version}")
        if self.kind == "lora" and self.lora_scaling <= 0:
            raise ValueError("a LoRA WeightUpdate needs lora_scaling > 0")
        if self.buckets and sum(self.buckets) != len(self.tensors):
            raise ValueError(
                f"WeightUpdate buckets hold {sum(self.buckets)} tensors, the update has {len(self.tensors)}"
            )
        if self.transport not in WEIGHT_TRANSPORTS:
            raise ValueError(f"WeightUpdate transport {self.transport!r} not in {WEIGHT_TRANSPORTS}")
        if self.transport == "object_store" and self.payload is None and self.tensors:
            raise ValueError("an object-store WeightUpdate needs a payload (the packed buffer's reference)")
        if self.transport == "collective" and (self.payload is not None or (self.tensors and not self.buckets)):
            raise ValueError("a collective WeightUpdate has buckets and no payload (its tensors are broadcast)")
        if self.transport == "ipc" and len(self.payload or []) != len(self.buckets):
            raise ValueError(
                f"an ipc WeightUpdate needs one handle per bucket: {len(self.payload or [])} for {len(self.buckets)}"
            )

    @property
    def collective(self) -> bool:
        return self.transport == "collective"


@dataclass
class RolloutTimings:
    """Seconds spent in each phase of one rollout call (one worker), or of a step's rollouts (see `merge`)."""

    generate_s: float = 0.0
    env_s: float = 0.0
    reward_s: float = 0.0
    load_weights_s: float = 0.0
    worker_s: float = 0.0  # the call's wall time

    def slowest(self, other: RolloutTimings) -> RolloutTimings:
        """Workers run in parallel: per phase, the slowest one counts."""
        return RolloutTimings(**{k: max(v, getattr(other, k)) for k, v in self.__dict__.items()})

    def plus(self, other: RolloutTimings) -> RolloutTimings:
        """Rollout rounds run one after the other (dynamic-sampling refills): their times add up."""
        return RolloutTimings(**{k: v + getattr(other, k) for k, v in self.__dict__.items()})
