"""Run folders for the viewer's tests, written by the run's own writers (MetricsLog, write_rollouts, group_records,
rollout_metrics, phase_times, the health monitor, eval_stats, the eval command's transcript and summary), so the
tests read the format a run writes and follow it when it changes. Only summary.json is written here by hand (the
driver writes it inline, from the same keys)."""

import json
from pathlib import Path

from agentrl_ray.chat_format import parse_tool_calls
from agentrl_ray.config import Config
from agentrl_ray.learner.health import HealthMonitor
from agentrl_ray.learner.integrity import Integrity
from agentrl_ray.learner.metrics import phase_times, rollout_metrics
from agentrl_ray.messages import assistant_message, tool_messages
from agentrl_ray.rewards.eval_stats import training_eval_metrics
from agentrl_ray.run.outputs import MetricsLog, atomic_write_text
from agentrl_ray.traces.records import group_records
from agentrl_ray.trained.evaluate import summarize
from agentrl_ray.trained.inference import transcript
from agentrl_ray.types import RolloutTimings, Trajectory, TrajectoryGroup

QUESTION = "What is 12 * 34?"
KNOWN_ANSWER = "The answer is 408."  # the text of every rewarded conversation
CALL = '<tool_call>\n{"name": "calculator", "arguments": {"expression": "12 * 34"}}\n</tool_call>'
TOOLS = [{"type": "function", "function": {"name": "calculator", "parameters": {"type": "object"}}}]
BROKEN_STEP, BROKEN = 3, "turn 2: token 3 is 4 of the trained sequence, the engine's prompt had 9"
ROWS = {"p1": {"id": "p1", "prompt": QUESTION, "answer": "408"}}


def trajectory(index: int, reward: float, tool_error: bool = False) -> Trajectory:
    first = assistant_message(CALL, parse_tool_calls(CALL), turn=0)
    result = "Error: division by zero" if tool_error else "408"
    answer = KNOWN_ANSWER if reward else "It is 400."
    completion = [first, *tool_messages(first, [result]), assistant_message(answer, parse_tool_calls(answer), turn=1)]
    return Trajectory(
        prompt_id="p1",
        sample_index=index,
        token_ids=[1, 2, 3, 4, 5],
        action_mask=[0, 1, 0, 1, 1],
        env_mask=[0, 0, 1, 0, 0],
        template_mask=[0, 0, 0, 0, 0],
        rollout_logprobs=[0.0, -1.0, 0.0, -1.0, -1.0],
        token_versions=[-1, 6, -1, 7, 7],  # the stream pipeline: new weights landed between the two turns
        reward=reward,
        policy_version=0,
        finish_reason="answer",
        prompt_len=1,
        reward_parts={"answer_match": reward},
        num_tool_calls=1,
        num_tool_errors=int(tool_error),
        prompt_messages=[{"role": "user", "content": QUESTION}],
        completion_messages=completion,
    )


def group(step: int) -> TrajectoryGroup:
    """Step `step`'s group: the first `step` of 4 samples rewarded (capped at 3), the last one's tool failing."""
    rewarded = min(step, 3)
    return TrajectoryGroup("p1", [trajectory(i, float(i < rewarded), tool_error=i == 3) for i in range(4)])


class FakeRun:
    """A run folder written step by step, as the learner and the driver write it."""

    def __init__(self, root: Path, name: str, steps: int, echo_coeff: float = 0.0, seed: int = 0) -> None:
        self.cfg = Config()
        self.cfg.run.name, self.cfg.run.output_dir, self.cfg.run.steps = name, str(root), steps
        self.cfg.run.eval_every, self.cfg.echo.coeff, self.cfg.run.seed = 2, echo_coeff, seed
        self.dir = self.cfg.run_dir
        self.dir.mkdir(parents=True)
        atomic_write_text(self.dir / "config.json", json.dumps(self.cfg.to_dict(), indent=2))
        self.log = MetricsLog(self.dir, self.cfg.run, self.cfg.to_dict(), steps)
        self.health = HealthMonitor()
        self.integrity = Integrity(self.cfg, None, [], rank=0)
        self.step = 0

    def metrics(self, step: int) -> dict:
        groups = [group(step)]
        m = rollout_metrics(groups, self.cfg, version=step - 1)
        m.update(phase_times(RolloutTimings(worker_s=0.5, generate_s=0.4), 0.5, 0.8, 0.01, 1.0 + 0.1 * step))
        m.update({"loss/entropy": 1.0 / step, "loss/kl": 0.001 * step, "loss/echo_ce": 3.0 - 0.2 * step})
        m["samples"] = 4 * step
        if step % self.cfg.run.eval_every == 0:
            m.update(training_eval_metrics(groups, 1.0))
        if step == BROKEN_STEP:  # a trajectory whose assembly lost a token of its second turn
            groups[0].trajectories[0].continuity_break = BROKEN
        m.update({"integrity/weights/mean_gap": 3e-6, "integrity/weights/band": 5e-5})
        self.integrity.report(step, groups, m)
        m.update(self.health.update(m).metrics())
        return m

    def advance(self) -> dict:
        """Write the next step: its rollouts (a whole group, the default sample) and its metrics line."""
        self.step += 1
        m = self.metrics(self.step)
        records = group_records([group(self.step)], self.step, ROWS, TOOLS)
        self.log.rollouts(self.step, records, len(records))
        self.log.log(self.step, m)
        return m

    def finish(self, evaluate: bool = True) -> None:
        last = [json.loads(x) for x in (self.dir / "metrics.jsonl").read_text().splitlines()][-1]
        summary = {"run_dir": str(self.dir), "checkpoint": None, **{k: v for k, v in last.items() if "eval/" in k}}
        summary.update(stop_reason="reached run.steps", steps_done=self.step)
        atomic_write_text(self.dir / "summary.json", json.dumps(summary))
        if evaluate:  # what `agentrl-ray eval RUN` leaves: eval_<step>/report.json and transcripts.jsonl
            out = self.dir / f"eval_{self.step:06d}"
            out.mkdir()
            groups = [group(3)]
            rows = [{**ROWS["p1"], "prompt": QUESTION}]
            lines = [json.dumps(transcript(rows[0], t, self.cfg)) for t in groups[0].trajectories]
            (out / "transcripts.jsonl").write_text("\n".join(lines) + "\n")
            (out / "report.json").write_text(json.dumps({**summarize(groups, 1.0), "step": self.step}))


def write_run(root: Path, name: str, steps: int, done: bool, **kwargs) -> FakeRun:
    run = FakeRun(root, name, steps if done else steps + 10, **kwargs)
    for _ in range(steps):
        run.advance()
    if done:
        run.finish()
    return run
