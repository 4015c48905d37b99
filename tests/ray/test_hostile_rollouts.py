"""A training step whose batch holds hostile rollouts completes, and the machine that ran them is unaffected.

Real EnvHost actors host CodeExecutionEnv instances (the real sandbox). In one concurrent batch, hostile tool calls
(an infinite loop, a fork bomb, 8 GB, a socket to a server of this process, writes outside the sandbox, a hunt for
a secret of the trainer's environment, 100 MB of output) run next to benign calls of other trajectories. Every
trajectory is then built token for token as the agent loop builds one, and goes through one real learner
`update()` in a 1-worker Ray Train TorchTrainer (DDP semantics on CPU).

Run: `.venv/bin/python -m pytest tests/ray/test_hostile_rollouts.py -v` (about a minute on 2 cores). It needs root
(writes outside the sandbox are refused only under the sandbox's own uid) and network namespaces.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
import shutil
import socket
import subprocess
import tempfile
import time
import zlib
from dataclasses import dataclass
from pathlib import Path

import pytest
import ray
import torch
from builders import hidden_from_sandbox

from agentrl_ray.chat_format import (
    END_OF_TURN,
    TOOL_CALL_CLOSE,
    TOOL_CALL_OPEN,
    ToolCall,
    encode_segments,
    parse_tool_calls,
    tool_response_segments,
)
from agentrl_ray.envs.host import EnvHost, ToolResult
from agentrl_ray.envs.isolation.sandbox import network_isolation_available
from agentrl_ray.types import TokenRole, Trajectory, TrajectoryGroup, role_masks

pytestmark = [
    pytest.mark.integration,
    pytest.mark.skipif(os.geteuid() != 0, reason="only root runs the sandbox under its own uid (no host writes)"),
    pytest.mark.skipif(not network_isolation_available(), reason="no network namespace here"),
]

CODE_EXEC = "agentrl_ray.envs.builtin.code_exec:CodeExecutionEnv"
# Modest limits keep the hostile runs short. One set for every instance, as one run's env.kwargs would be; the CPU
# limit sits above the wall clock so that loops always end by the (deterministic) wall-clock kill.
LIMITS = {"wall_time_s": 4.0, "cpu_time_s": 8, "max_processes": 8}
MAX_OUTPUT_CHARS = 240  # the host's cap on an observation; keeps the 100 MB run's trajectory short
# The hostile programs plus the tool-schema prompt run past the built-in model's 512 positions (its byte-level
# tokenizer spends about a token per character of code). The learner has no position table (RoPE), so the token
# budget is raised for this batch; a vLLM rollout of the same model would end these trajectories at 512 instead.
MAX_TOTAL_TOKENS = 1024
SECRET_NAME = "AGENTRL_TEST_SECRET"
REPO = Path(__file__).resolve().parents[2]

FORK_BOMB = """import os
first = os.getpid()
while True:
    try:
        os.fork()
    except OSError as e:
        if os.getpid() == first:
            print("fork refused:", e.strerror, flush=True)
            first = 0
"""

SECRET_HUNT = """import os
leaked = [k + "=" + v for k, v in os.environ.items() if "SECRET" in k]
denied = 0
for pid in filter(str.isdigit, os.listdir("/proc")):
    try:
        env = open("/proc/" + pid + "/environ", "rb").read()
    except OSError:
        denied += 1
        continue
    leaked += [e.decode() for e in env.split(b"\\0") if b"SECRET" in e]
print("leaked:", leaked, "| permission denied for", denied, "processes")
"""

BENIGN = {
    "print(6 * 7)": "42",
    "print(sum(range(101)))": "5050",
    "import math\nprint(math.factorial(10))": "3628800",
    "print(sorted([3, 1, 2]))": "[1, 2, 3]",
    "print('ok'.upper())": "OK",
}


@dataclass
class Rollout:
    key: str
    code: str
    expect: list[str]  # substrings of the observation (hostile), or [the exact observation] (benign)
    hostile: bool


def _write_error(target: Path) -> str:
    return "No such file or directory" if hidden_from_sandbox(target) else "Permission denied"


def rollouts(port: int, targets: list[Path]) -> list[Rollout]:
    writes = (
        f"for p in {[str(t) for t in targets]!r}:\n    try:\n        open(p, 'w').write('pwned')\n"
        "        print('wrote', p)\n    except OSError as e:\n        print('denied:', e.strerror)"
    )
    connect = (
        f"import socket\ntry:\n    socket.create_connection(('127.0.0.1', {port}), timeout=2)\n    print('connected')\n"
        "except OSError as e:\n    print('connect failed:', e.strerror)"
    )
    hostile = {
        "infinite_loop": ("while True:\n    pass", ["[error] killed: wall-clock timeout after 4.0s"]),
        "fork_bomb": (FORK_BOMB, ["fork refused: Resource temporarily unavailable", "wall-clock timeout"]),
        "allocate_8gb": ("x = bytearray(8 << 30)", ["MemoryError", "[error] memory limit 512 MB exceeded"]),
        "connect_host": (connect, ["connect failed: Network is unreachable"]),
        # A target under the host's /tmp, /var/tmp or /dev/shm cannot even be seen (the run has its own tmpfs
        # there); any other host path is seen but not writable. The repo itself may be a clone under /tmp.
        "write_outside": (writes, ["\n".join(f"denied: {_write_error(t)}" for t in targets)]),
        "read_secret": (SECRET_HUNT, ["leaked: [] | permission denied for"]),
        "print_100mb": ("import sys\nfor _ in range(100):\n    sys.stdout.write('x' * 1_000_000)", ["[truncated "]),
    }
    out = [Rollout(f"hostile-{name}", code, expect, True) for name, (code, expect) in hostile.items()]
    out += [Rollout(f"benign-{i}", code, [answer], False) for i, (code, answer) in enumerate(BENIGN.items())]
    return out


def tool_call_text(code: str) -> str:
    call = json.dumps({"name": "run_python", "arguments": {"code": code}})
    return f"{TOOL_CALL_OPEN}\n{call}\n{TOOL_CALL_CLOSE}"


def start_hosts(secret: str) -> list:
    # The secret is in the actors' own environment: the process that runs the sandboxes is the one to rob.
    actor = ray.remote(EnvHost).options(
        num_cpus=0.25, max_concurrency=1000, runtime_env={"env_vars": {SECRET_NAME: secret}}
    )
    hosts = [actor.remote(tool_timeout_s=30.0, max_output_chars=MAX_OUTPUT_CHARS) for _ in range(2)]
    ray.get([h.stats.remote() for h in hosts])
    return hosts


def processes_holding(secret: str) -> list[int]:
    """Other processes whose environment holds the secret (this test runs as root, so it may read them all)."""
    pids = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            env = Path(f"/proc/{pid}/environ").read_bytes()
        except OSError:
            continue
        if int(pid) != os.getpid() and f"{SECRET_NAME}={secret}".encode() in env:
            pids.append(int(pid))
    return pids


def run_batch(hosts: list, batch: list[Rollout]) -> tuple[dict[str, list[ToolResult]], dict[str, object]]:
    """Create every env, then send every turn's tool calls at once, as the agent loop does for a live batch."""
    owner = {r.key: hosts[zlib.crc32(r.key.encode()) % len(hosts)] for r in batch}
    ray.get([owner[r.key].create.remote(r.key, CODE_EXEC, LIMITS, {"id": r.key, "tests": ""}) for r in batch])
    refs = {}
    for r in batch:
        parsed = parse_tool_calls(tool_call_text(r.code))
        refs[r.key] = owner[r.key].call_tools.remote(r.key, parsed.calls, parsed.errors)
    return dict(zip(refs, ray.get(list(refs.values())))), owner


def check_observations(batch: list[Rollout], results: dict[str, list[ToolResult]], secret: str) -> None:
    for r in batch:
        (result,) = results[r.key]
        assert secret not in result.text, f"{r.key} leaked the secret: {result.text!r}"
        if not r.hostile:
            assert result == ToolResult(r.expect[0], error=False), r.key
            continue
        assert len(result.text) <= MAX_OUTPUT_CHARS + 40, r.key
        for piece in r.expect:
            assert piece in result.text, f"{r.key}: {piece!r} not in {result.text!r}"
    # 100 MB came back as the sandbox's first 16 KiB, cut again by the host: nothing near 100 MB was held.
    dropped = int(re.search(r"\[truncated (\d+) characters\]", results["hostile-print_100mb"][0].text).group(1))
    assert dropped < 17_000


def check_host_unaffected(hosts: list, owner: dict, server: socket.socket, targets: list[Path]) -> None:
    with pytest.raises(BlockingIOError):
        server.accept()  # no sandbox reached it
    client = socket.create_connection(server.getsockname(), timeout=5)
    server.settimeout(5)
    conn, _ = server.accept()  # it still serves this process
    conn.close()
    client.close()
    assert not any(t.exists() for t in targets)
    assert subprocess.run(["true"]).returncode == 0  # this process can still fork
    again = owner["hostile-fork_bomb"].call_tools.remote(
        "hostile-fork_bomb", [ToolCall("run_python", {"code": "print(1)"})], []
    )
    assert ray.get(again) == [ToolResult("1", error=False)]  # the env that ran the bomb still works
    stats = ray.get([h.stats.remote() for h in hosts])
    assert sum(s["timeouts"] for s in stats) == 0  # the sandbox ended every run before the host had to give up


# ---------------------------------------------------------------- trajectories and the learner step


def token_roles(
    tokenizer, prompt_ids: list[int], r: Rollout, result: list[ToolResult]
) -> tuple[list[int], list[TokenRole]]:
    """Prompt, the tool call (sampled: action), the encoded tool result (env/template), the final answer (action)."""
    call = tokenizer.encode(tool_call_text(r.code) + END_OF_TURN, add_special_tokens=False)
    obs_ids, obs_roles = encode_segments(tokenizer, tool_response_segments([x.text for x in result]))
    answer = tokenizer.encode(
        ("It printed " + result[0].text if not r.hostile else "Blocked.") + END_OF_TURN, add_special_tokens=False
    )
    ids = [*prompt_ids, *call, *obs_ids, *answer]
    action = TokenRole.ACTION
    roles = [TokenRole.PROMPT] * len(prompt_ids) + [action] * len(call) + list(obs_roles) + [action] * len(answer)
    return ids, roles


def rollout_logprobs(model_path: str, sequences: list[list[int]]) -> list[list[float]]:
    """What the rollout engine would have reported: log-probs under the same weights (policy version 0)."""
    from transformers import AutoModelForCausalLM

    from agentrl_ray.learner.logprobs import token_logprobs_and_entropy

    model = AutoModelForCausalLM.from_pretrained(model_path, dtype=torch.float32).eval()
    out = []
    with torch.no_grad():
        for ids in sequences:
            x = torch.tensor([ids])  # (1, T)
            logprobs, _ = token_logprobs_and_entropy(model(input_ids=x).logits, x, False)
            out.append(logprobs[0].tolist())
    return out


def build_groups(tokenizer, model_path: str, batch: list[Rollout], results: dict, max_tokens: int) -> list:
    from agentrl_ray.envs.loading import load_env_class
    from agentrl_ray.envs.tools import tool_schemas

    tools = tool_schemas(load_env_class(CODE_EXEC))
    members = {"probe-0": batch[0::2], "probe-1": batch[1::2]}  # each group mixes hostile and benign samples
    built = []
    for prompt_id, rs in members.items():
        message = [{"role": "user", "content": f"Try the sandbox with run_python ({prompt_id})."}]
        prompt = tokenizer.apply_chat_template(
            message, tools=tools, add_generation_prompt=True, tokenize=True, return_dict=False
        )
        for index, r in enumerate(rs):
            built.append((prompt_id, index, r, len(prompt), *token_roles(tokenizer, list(prompt), r, results[r.key])))
    logprobs = rollout_logprobs(model_path, [ids for *_, ids, _ in built])
    groups: dict[str, list[Trajectory]] = {p: [] for p in members}
    for (prompt_id, index, r, prompt_len, ids, roles), lp in zip(built, logprobs):
        assert len(ids) <= max_tokens, f"{r.key}: {len(ids)} tokens"
        masks = role_masks(roles)
        action = masks["action_mask"]
        groups[prompt_id].append(
            Trajectory(
                prompt_id=prompt_id,
                sample_index=index,
                token_ids=ids,
                **masks,
                rollout_logprobs=[v if a else 0.0 for v, a in zip(lp, action)],
                reward=0.0 if r.hostile else 1.0,
                policy_version=0,
                finish_reason="answer",
                prompt_len=prompt_len,
                num_tool_calls=1,
                num_tool_errors=sum(x.error for x in results[r.key]),
            )
        )
    return [TrajectoryGroup(p, ts) for p, ts in groups.items()]


def learner_step(config: dict) -> None:
    """Ray Train worker: one real `update()`; reports its metrics and how many parameter tensors moved."""
    import ray.train

    from agentrl_ray.learner.policy import Policy
    from agentrl_ray.learner.update import update

    cfg = config["config"]
    torch.manual_seed(0)
    policy = Policy(config["model_path"], cfg.model, cfg.learner, need_reference=False)
    before = {n: p.detach().clone() for n, p in policy.module.named_parameters()}
    metrics = update(policy, config["groups"], cfg, step=0, pad_id=config["pad_id"])
    moved = sum(not torch.equal(before[n], p.detach()) for n, p in policy.module.named_parameters())
    metrics.update(tensors_changed=moved, tensors=len(before))
    # Ray Train (v2) hands the driver only metrics that came with a checkpoint, as the loop's own reports do.
    with tempfile.TemporaryDirectory() as tmp:
        Path(tmp, "metrics.json").write_text(json.dumps(metrics))
        ray.train.report(metrics, checkpoint=ray.train.Checkpoint.from_directory(tmp))


def run_learner(groups: list[TrajectoryGroup], cfg, model_path: str, pad_id: int, storage: Path) -> dict:
    from builders import fit_one_learner_worker

    config = {"config": cfg, "groups": groups, "model_path": model_path, "pad_id": pad_id}
    return dict(fit_one_learner_worker(learner_step, config, storage, name="hostile").metrics)


# ---------------------------------------------------------------- the test


def test_training_step_with_hostile_rollouts_completes(local_ray, builtin_model_path, tmp_path, monkeypatch):
    from transformers import AutoTokenizer

    from agentrl_ray.infra.profiles import load_config

    secret = secrets.token_hex(16)
    monkeypatch.setenv(SECRET_NAME, secret)  # the trainer's own environment holds it too
    server = socket.create_server(("127.0.0.1", 0))
    server.setblocking(False)
    outside = Path(tempfile.mkdtemp())
    outside.chmod(0o755)  # others may enter it, only root may write it
    targets = [outside / "pwned.txt", REPO / "hostile_pwned.txt"]
    assert not any(t.exists() for t in targets)  # so that cleaning up can never remove a file of someone else's
    batch = rollouts(server.getsockname()[1], targets)
    hosts, owner = start_hosts(secret), {}
    try:
        assert processes_holding(secret), "control: the env actors should hold the secret in their environment"
        t0 = time.perf_counter()
        results, owner = run_batch(hosts, batch)
        batch_s = time.perf_counter() - t0
        check_observations(batch, results, secret)
        check_host_unaffected(hosts, owner, server, targets)
        assert batch_s < 25, f"the batch took {batch_s:.1f} s: hostile runs held up the benign ones"
    finally:
        ray.get([h.close.remote(key) for key, h in owner.items()])
        server.close()
        shutil.rmtree(outside, ignore_errors=True)
        for t in targets:
            t.unlink(missing_ok=True)

    cfg = load_config(
        None,
        [
            "profile=cpu",
            f"env.name={CODE_EXEC}",
            f"rollout.max_total_tokens={MAX_TOTAL_TOKENS}",
            "echo.coeff=0.1",  # the hostile tool outputs are ECHO targets too
            "learner.lr=1e-3",
            "learner.num_cpus_per_worker=1",
        ],
    )
    tokenizer = AutoTokenizer.from_pretrained(builtin_model_path)
    groups = build_groups(tokenizer, builtin_model_path, batch, results, cfg.rollout.max_total_tokens)
    metrics = run_learner(groups, cfg, builtin_model_path, tokenizer.pad_token_id, tmp_path)
    losses = {k: v for k, v in metrics.items() if k.startswith("loss/")}
    assert losses and all(math.isfinite(v) for v in losses.values()), losses
    assert losses["loss/echo_ce"] > 0 and losses["loss/grad_norm"] > 0
    assert losses["loss/mismatch_abs"] < 1e-3  # the learner scored exactly the tokens the trajectories hold
    assert metrics["tensors_changed"] == metrics["tensors"], metrics  # every parameter tensor took the step
