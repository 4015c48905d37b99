"""A discrete-event simulator of the rollout/learner pipeline (docs/async.md): the batch pipeline (k = 0, 1) and the
stream pipeline (any k) on a multi-turn workload with heavy-tailed tool latency, driven by measured per-phase costs.
`rollout --mode pipeline_timeline --project` (its helper; not a mode) calibrates it here, checks it against the
modes it has just measured on the small cluster, then runs it at a cluster's shape to project what each pipeline
gives there.

What it models (each a measured number or a written assumption):
- episodes: a group is G episodes of one prompt; each episode takes n turns, n drawn from the measured turns per
  episode; between two turns it waits for its environment, a log-normal time (median, sigma from the config);
- an engine runs one batched call at a time; a call of b sequences takes t(b) = t0 + t1 * b (fitted to the measured
  calls). The batch pipeline's calls are turn-synchronous (a call's episodes all wait for the turn's slowest
  environment); the stream pipeline batches whatever turns wait when the engine frees (rollout/turn_scheduler.py);
- the learner's update of a step takes L; weight sync is instantaneous at a turn boundary (measured: 5 ms);
- on the small machine the engine and the learner share 2 cores: while both run, each runs slower by the measured
  factor (1 + rho); on a cluster they are apart (rho = 0);
- the pipelines' rules are the code's: batch k=0 (sample, then train), batch k=1 (sample step t+1 while step t
  trains; weights change between batches), stream k (max(k, 1) * P slots out, the P complete groups of the lowest
  slots back, a group past k versions dropped; learner/stream.py).
"""

from __future__ import annotations

import heapq
import json
import math
import random
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from results_path import ROOT


@dataclass
class Costs:
    t0: float  # s per batched engine call
    t1: float  # s per sequence in it
    learner_s: float  # one step's update, alone
    rho: float  # slowdown of each of engine and learner while the other runs (shared cores); 0 apart
    turns: list[int]  # measured turns per episode (drawn from)
    env_median_s: float
    env_sigma: float
    max_seqs: int = 256  # an engine's batch cap (rollout.max_num_seqs)


@dataclass
class Shape:
    engines: int
    prompts_per_step: int
    group_size: int
    learner_scale: float = 1.0  # the update's time relative to the calibration's (data parallel: < 1)


@dataclass(order=True)
class _Event:
    t: float
    seq: int
    kind: str = field(compare=False)
    data: object = field(compare=False, default=None)


class Sim:
    def __init__(self, costs: Costs, shape: Shape, mode: str, k: int, steps: int, seed: int = 0) -> None:
        self.c, self.s, self.mode, self.k, self.steps = costs, shape, mode, k, steps
        self.rng = random.Random(seed)
        self.now, self.seq, self.events = 0.0, 0, []
        self.version = 0
        self.learner_busy = False
        self.engine_busy = [False] * shape.engines
        self.queues: list[list] = [[] for _ in range(shape.engines)]  # stream: waiting turns (episode)
        self.step_times: list[float] = []
        self.trained = self.dropped = 0
        self.learner_busy_s = 0.0

    # -------------------------------------------------------------- event plumbing
    def at(self, t: float, kind: str, data=None) -> None:
        self.seq += 1
        heapq.heappush(self.events, _Event(t, self.seq, kind, data))

    def env_wait(self) -> float:
        return self.c.env_median_s * math.exp(self.c.env_sigma * self.rng.gauss(0.0, 1.0))

    def call_time(self, b: int) -> float:
        slow = 1.0 + (self.c.rho if self.learner_busy else 0.0)
        return (self.c.t0 + self.c.t1 * b) * slow

    def learn_time(self) -> float:
        slow = 1.0 + (self.c.rho if any(self.engine_busy) else 0.0)
        return self.c.learner_s * self.s.learner_scale * slow

    def new_group(self, slot: int) -> dict:
        return {
            "slot": slot,
            "left": self.s.group_size,
            "first_version": None,
            "episodes": [{"turns": self.rng.choice(self.c.turns), "done_turns": 0} for _ in range(self.s.group_size)],
            # The environment seeds its waits by the row: a group's G episodes wait the same at the same step.
            "waits": [self.env_wait() for _ in range(max(self.c.turns))],
        }

    # -------------------------------------------------------------- the stream pipeline
    def run_stream(self) -> None:
        p = self.s.prompts_per_step
        ahead = max(self.k, 1) * p
        self.next_slot, self.consumed, self.back, self.load = 0, 0, {}, [0] * self.s.engines
        self.partial: list = []
        self.waiting_learner = True

        def issue():
            end = min(self.consumed + ahead, self.steps * p + self.dropped)
            while self.next_slot < end:
                g = self.new_group(self.next_slot)
                e = min(range(self.s.engines), key=lambda i: (self.load[i], i))
                g["engine"] = e
                self.load[e] += 1
                for ep in g["episodes"]:
                    ep["group"] = g
                    self.queues[e].append(ep)
                self.next_slot += 1
                self.kick(e)

        self.issue = issue
        issue()
        step_start = 0.0
        while self.events or any(self.queues):
            ev = heapq.heappop(self.events)
            self.now = ev.t
            if ev.kind == "call_done":
                self.call_done(*ev.data)
            elif ev.kind == "env_done":
                ep = ev.data
                self.queues[ep["group"]["engine"]].append(ep)
                self.kick(ep["group"]["engine"])
            elif ev.kind == "learn_done":
                self.learner_busy = False
                self.version += 1
                self.step_times.append(self.now - step_start)
                step_start = self.now
                if self.version == self.steps:
                    return
                self.waiting_learner = True
            if self.waiting_learner and not self.learner_busy:
                self.try_take()

    def try_take(self) -> None:
        """As StreamFeed.take: the lowest slots back first, a stale group dropped (its slot consumed), a new slot sent
        after each; the update starts once P groups are taken."""
        p = self.s.prompts_per_step
        while len(self.partial) < p and self.back:
            g = self.back.pop(min(self.back))
            self.consumed += 1
            if self.version - g["first_version"] > self.k:
                self.dropped += 1
            else:
                self.partial.append(g)
            self.issue()
        if len(self.partial) < p:
            return
        self.trained += p
        self.partial = []
        self.waiting_learner = False
        self.learner_busy = True
        d = self.learn_time()
        self.learner_busy_s += d
        self.at(self.now + d, "learn_done")

    def kick(self, e: int) -> None:
        if self.engine_busy[e] or not self.queues[e]:
            return
        batch, self.queues[e] = self.queues[e][: self.c.max_seqs], self.queues[e][self.c.max_seqs :]
        self.engine_busy[e] = True
        for ep in batch:
            g = ep["group"]
            if g["first_version"] is None:
                g["first_version"] = self.version
        self.at(self.now + self.call_time(len(batch)), "call_done", (e, batch))

    def call_done(self, e: int, batch: list) -> None:
        self.engine_busy[e] = False
        for ep in batch:
            ep["done_turns"] += 1
            g = ep["group"]
            if ep["done_turns"] < ep["turns"]:
                self.at(self.now + g["waits"][ep["done_turns"] - 1], "env_done", ep)
            else:
                g["left"] -= 1
                if g["left"] == 0:
                    self.load[g["engine"]] -= 1
                    self.back[g["slot"]] = g
        self.kick(e)

    # -------------------------------------------------------------- the batch pipeline
    def rollout_batch(self, t_start: float, groups: list, learner_until: float = 0.0) -> tuple[float, list]:
        """A batch's end from `t_start`: each engine runs its shard turn by turn, every turn waiting for the turn's
        slowest environment. A call that starts before `learner_until` (the update beside it) runs slower by rho.
        Returns the slowest engine's end and every call's (start, end)."""
        shards = [groups[i :: self.s.engines] for i in range(self.s.engines)]
        ends, calls = [], []
        for shard in shards:
            t = t_start
            live = [(g, ep) for g in shard for ep in g["episodes"]]
            turn = 0
            while live:
                d = (self.c.t0 + self.c.t1 * len(live)) * (1.0 + (self.c.rho if t < learner_until else 0.0))
                calls.append((t, t + d))
                t += d
                turn += 1
                live = [(g, ep) for g, ep in live if ep["turns"] > turn]
                if live:
                    t += max(g["waits"][turn - 1] for g, _ in live)
            ends.append(t)
        return max(ends), calls

    def run_batch(self) -> None:
        p = self.s.prompts_per_step
        alone = self.c.learner_s * self.s.learner_scale
        t = 0.0
        if self.k == 0:  # sample, then train: never both at once
            for _ in range(self.steps):
                start = t
                t, _ = self.rollout_batch(t, [self.new_group(i) for i in range(p)])
                t += alone
                self.learner_busy_s += alone
                self.trained += p
                self.step_times.append(t - start)
            return
        ready, _ = self.rollout_batch(0.0, [self.new_group(i) for i in range(p)])  # step 0's batch
        for _ in range(self.steps):
            start = t = max(t, ready)  # take step t's batch
            # step t+1's batch goes out now (old weights) while step t trains beside it: the update slows by rho for
            # the share of it the engines' calls overlap, and those calls by rho (two passes settle both)
            groups = [self.new_group(i) for i in range(p)]
            d = alone * (1.0 + self.c.rho)
            for _ in range(2):
                next_ready, calls = self.rollout_batch(t, groups, learner_until=t + d)
                overlap = sum(max(0.0, min(b, t + d) - max(a, t)) for a, b in calls) / self.s.engines
                d = alone * (1.0 + self.c.rho * min(1.0, overlap / d))
            self.learner_busy_s += d
            t = max(t + d, next_ready)  # settle before the push
            ready = next_ready
            self.trained += p
            self.step_times.append(t - start)

    def run(self) -> dict:
        (self.run_stream if self.mode == "stream" else self.run_batch)()
        steps = self.step_times[1:]  # step 1 pays the pipeline's fill, as the measured runs leave it out
        return {
            "step_s": statistics.median(steps),
            "trajectories_per_s": self.s.prompts_per_step * self.s.group_size * len(steps) / sum(steps),
            "dropped_groups": self.dropped,
            "learner_busy_frac": self.learner_busy_s / max(1e-9, self.now or sum(self.step_times)),
        }


MODES = [("batch", 0, "sync"), ("batch", 1, "one_step_off"), ("stream", 2, "stream_k2"), ("stream", 4, "stream_k4")]


def simulate(costs: Costs, shape: Shape, steps: int, seeds: int = 5) -> dict:
    out = {}
    for mode, k, name in MODES:
        runs = [Sim(costs, shape, mode, k, steps, seed).run() for seed in range(seeds)]
        out[name] = {key: statistics.fmean(r[key] for r in runs) for key in runs[0]}
    for name in out:
        out[name]["speedup_vs_sync"] = out[name]["trajectories_per_s"] / out["sync"]["trajectories_per_s"]
        out[name]["speedup_vs_one_step_off"] = (
            out[name]["trajectories_per_s"] / out["one_step_off"]["trajectories_per_s"]
        )
    return out


# ------------------------------------------------------------------ calibration: the costs measured here


def calibrate(config: str, timeline: Path) -> dict:
    """The engine's batched call t(b) (vLLM, the config's model and budgets, in this process), the learner's update
    alone and the contention factor (from the measured timeline's sync and stream runs), the turns per episode (a
    short run's saved rollouts)."""
    import os

    import torch

    from agentrl_ray.builtin.resolve import resolve_model
    from agentrl_ray.infra.profiles import load_config
    from agentrl_ray.infra.threads import ThreadPolicy
    from agentrl_ray.rollout.backends import engine_process_env, make_engine
    from agentrl_ray.rollout.engine_modes import EngineModes

    cfg = load_config(config, ["profile=cpu"])
    r = cfg.rollout
    os.environ.update(engine_process_env(r.backend, use_gpu=False))  # what the worker's process gets
    torch.set_num_threads(ThreadPolicy.of(cfg).engine_threads())
    model = resolve_model(cfg.model.path)
    engine = make_engine(r.backend, model, cfg.model, r, seed=0, use_gpu=False, modes=EngineModes(), kv_sequences=256)
    turns, lengths = _measured_turns(config, model)
    # A batched call decodes until its longest turn ends: the measured turns' 90th percentile, each call that long.
    decode = max(1, sorted(lengths)[int(0.9 * (len(lengths) - 1))])
    prompt = list(range(10, 110))  # 100 tokens, the workload's prompts' length
    sizes, times = [1, 8, 32, 64, 128], []
    for b in sizes:
        args = ([prompt] * b, [decode] * b)
        kwargs = dict(temperature=1.0, top_p=1.0, stop_token_ids=[], ignore_eos=True)
        engine.generate(*args, **kwargs)
        t0 = time.perf_counter()
        for _ in range(3):
            engine.generate(*args, seeds=list(range(b)), **kwargs)
        times.append((time.perf_counter() - t0) / 3)
    mean_b, mean_t = statistics.fmean(sizes), statistics.fmean(times)
    t1 = sum((b - mean_b) * (t - mean_t) for b, t in zip(sizes, times)) / sum((b - mean_b) ** 2 for b in sizes)
    del engine
    measured = json.loads(timeline.read_text())
    modes = measured["modes"]
    learner = modes["sync"]["learner_busy_s"]["median"]
    together = statistics.fmean(modes[m]["learner_busy_s"]["median"] for m in ("stream_k2", "stream_k4"))
    return {
        "engine_call": {
            "batch_sizes": sizes,
            "decode_tokens": decode,
            "seconds": times,
            "t0": mean_t - t1 * mean_b,
            "t1": t1,
        },
        "learner_s": learner,
        "rho": together / learner - 1.0,
        "env": measured["env_latency"],
        "turns": turns,
        "timeline": str(timeline.resolve().relative_to(ROOT)),
        "measured": {m: v["trajectories_per_s"] for m, v in modes.items()},
    }


def project(config: str, timeline: Path, steps: int = 12, calibration: dict | None = None) -> dict:
    """Calibrate here against `timeline` (a pipeline_timeline result with the sync, one-step-off and stream modes),
    simulate the small cluster it measured, then the projection: 64 engines and 8 learner ranks, engines and learner
    apart (rho 0), each engine at the measured costs, the update of 64x the samples on 8 data-parallel ranks at the
    measured cost per sample (linear scaling: an assumption, docs/async.md)."""
    cal = calibration or calibrate(config, timeline)
    costs = Costs(
        t0=cal["engine_call"]["t0"],
        t1=cal["engine_call"]["t1"],
        learner_s=cal["learner_s"],
        rho=cal["rho"],
        turns=cal["turns"],
        env_median_s=cal["env"]["median_s"],
        env_sigma=cal["env"]["sigma"],
    )
    small = simulate(costs, Shape(engines=1, prompts_per_step=16, group_size=8), steps)
    apart = Costs(**{**costs.__dict__, "rho": 0.0})
    cluster = simulate(apart, Shape(engines=64, prompts_per_step=16 * 64, group_size=8, learner_scale=8.0), steps, 2)
    print(f"{'small cluster, trajectories/s':34s}{'simulated':>12s}{'measured':>12s}")
    for name, v in small.items():
        print(f"{name:34s}{v['trajectories_per_s']:12.1f}{cal['measured'].get(name, float('nan')):12.1f}")
    # The same with a learner 4x faster per sample (GPU ranks against these CPU-measured costs): who is the bottleneck
    # decides what streaming gives.
    fast = simulate(apart, Shape(engines=64, prompts_per_step=16 * 64, group_size=8, learner_scale=2.0), steps, 2)
    for title, out in (("64 engines, 8 learners", cluster), ("the same, learner 4x faster", fast)):
        print(f"{'projection: ' + title:40s}{'traj/s':>10s}{'vs sync':>10s}{'vs 1-off':>10s}")
        for name, v in out.items():
            row = (v["trajectories_per_s"], v["speedup_vs_sync"], v["speedup_vs_one_step_off"])
            print(f"  {name:38s}" + "".join(f"{x:10.2f}" for x in row))
    return {
        "calibration": cal,
        "small_cluster": small,
        "projection_64_engines_8_learners": cluster,
        "projection_64_engines_learner_4x_faster": fast,
    }


def _measured_turns(config: str, model: str) -> tuple[list[int], list[int]]:
    """Assistant turns per trajectory, and tokens per assistant turn, in a short run's saved rollouts (the installed
    CLI, 3 steps of the config; a tool call counted in its hermes form)."""
    import subprocess
    import tempfile

    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model)
    with tempfile.TemporaryDirectory() as tmp:
        cmd = [str(Path(sys.executable).parent / "agentrl-ray"), "train", config, "run.steps=3", "run.save_rollouts=1"]
        cmd += ["run.eval_at_start=false", "run.eval_every=0", "run.checkpoint_every=0", f"run.output_dir={tmp}"]
        subprocess.run([*cmd, "run.name=t"], check=True, cwd=ROOT, capture_output=True)
        turns, lengths = [], []
        for f in sorted((Path(tmp) / "t" / "rollouts").glob("step_*.jsonl")):
            for line in f.read_text().splitlines():
                said = [m for m in json.loads(line)["completion"] if m["role"] == "assistant"]
                turns.append(len(said))
                for m in said:
                    calls = "".join(
                        f"<tool_call>\n{json.dumps(c['function'])}\n</tool_call>" for c in m.get("tool_calls") or []
                    )
                    lengths.append(len(tokenizer.encode((m.get("content") or "") + calls)) + 1)  # + end of turn
    return turns, lengths


def _session_turns() -> list[int]:
    """Without a measurement: 2 turns a question (a call, then the answer), k questions with P(k) of the task."""
    from agentrl_ray.tasks.longtail import SESSION_LENGTHS, SESSION_WEIGHTS

    return [2 * k for k, w in zip(SESSION_LENGTHS, SESSION_WEIGHTS) for _ in range(w)]
