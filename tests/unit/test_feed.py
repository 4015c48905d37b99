"""The learner's feed without Ray: prompt sampling, on-policy and overlapped scheduling, dynamic sampling, the
staleness bound and pending weights travelling with the next rollout call. The pool is a fake object (the feed
only calls its start/gather/sample); the real pool is exercised in tests/ray."""

import pytest

from agentrl_ray.infra.profiles import load_config
from agentrl_ray.learner.feed import PromptSampler, RolloutFeed, keep_varied
from agentrl_ray.types import RolloutTimings, Trajectory, TrajectoryGroup


def _traj(prompt_id: str, i: int, reward: float, version: int) -> Trajectory:
    return Trajectory(
        prompt_id=prompt_id,
        sample_index=i,
        token_ids=[1, 2, 3],
        action_mask=[0, 1, 1],
        env_mask=[0, 0, 0],
        template_mask=[0, 0, 0],
        rollout_logprobs=[0.0, -0.5, -0.5],
        reward=reward,
        policy_version=version,
        finish_reason="answer",
        prompt_len=1,
    )


class FakePool:
    """Groups whose rewards are set by `rewards(row_id, sample)`; records every call."""

    def __init__(self, group_size: int, rewards=lambda row_id, j: float(j % 2), version: int = 0):
        self.group_size, self.rewards, self.version = group_size, rewards, version
        self.started: list[tuple[list[str], int, object]] = []  # (row ids, seed, weights)
        self.gathered = 0

    def start(self, rows, group_size, temperature, seed, weights=None):
        assert group_size == self.group_size
        self.started.append(([r["id"] for r in rows], seed, weights))
        return rows

    def gather(self, rows):
        self.gathered += 1
        groups = [
            TrajectoryGroup(
                r["id"], [_traj(r["id"], j, self.rewards(r["id"], j), self.version) for j in range(self.group_size)]
            )
            for r in rows
        ]
        return groups, RolloutTimings(generate_s=1.0, worker_s=2.0)

    def sample(self, rows, group_size, temperature, seed, weights=None):
        return self.gather(self.start(rows, group_size, temperature, seed, weights))


class FakeSender:
    def __init__(self):
        self.pending = None

    def take_pending(self):
        update, self.pending = self.pending, None
        return update


ROWS = [{"id": f"r{i}", "prompt": f"q{i}"} for i in range(10)]


def _feed(overrides, pool=None):
    cfg = load_config(None, ["profile=cpu", "rollout.prompts_per_step=3", "rollout.group_size=2", *overrides])
    pool = pool or FakePool(2)
    sender = FakeSender()
    return RolloutFeed(pool, sender, PromptSampler(ROWS, 3, cfg.run.seed), cfg), pool, sender


def test_prompt_sampler_is_deterministic_and_covers_an_epoch():
    a, b = PromptSampler(ROWS, 5, seed=3), PromptSampler(ROWS, 5, seed=3)
    assert a.for_step(7) == b.for_step(7)
    assert sorted(r["id"] for r in a.for_step(0) + a.for_step(1)) == sorted(r["id"] for r in ROWS)
    assert a.for_step(0, extra=1) != a.for_step(0)  # a refill draws other prompts


def test_on_policy_samples_each_step_when_asked_and_carries_pending_weights():
    feed, pool, sender = _feed([])
    sender.pending = "weights v1"
    groups, timings, stats = feed.take(0, version=0)
    assert len(groups) == 3 and stats == {"rollout/groups_sampled": 3}
    assert timings.generate_s == 1.0
    assert pool.started[0][2] == "weights v1" and sender.pending is None  # loaded before generating
    assert len(pool.started) == 1 and feed.in_flight is None  # nothing sent ahead


def test_overlapped_sends_the_next_batch_out_and_settles_before_a_push():
    feed, pool, _ = _feed(["sync.max_staleness=1", "run.steps=3"])
    feed.take(0, version=0)
    assert len(pool.started) == 2 and feed.in_flight[0] == 1  # step 1 generates while step 0 trains
    assert feed.settle() >= 0 and feed.in_flight is None and 1 in feed.ready
    feed.take(1, version=1)  # one version behind is allowed
    assert pool.gathered == 2 and feed.in_flight[0] == 2
    pool.version = 1  # step 2's batch was sampled by the weights pushed after step 0
    feed.settle()
    feed.take(2, version=2)
    assert feed.in_flight is None  # the last step sends nothing ahead


def test_dynamic_sampling_drop_and_resample():
    # Row r0..: the even-numbered rows have all-equal rewards.
    def rewards(row_id, j):
        return 1.0 if int(row_id[1:]) % 2 == 0 else float(j)

    feed, pool, _ = _feed(["algorithm.dynamic_sampling=drop"], FakePool(2, rewards))
    groups, _, stats = feed.take(0, version=0)
    assert all(int(g.prompt_id[1:]) % 2 for g in groups) and stats["rollout/groups_sampled"] == 3

    feed, pool, _ = _feed(
        ["algorithm.dynamic_sampling=resample", "algorithm.max_resample_rounds=5"], FakePool(2, rewards)
    )
    groups, timings, stats = feed.take(0, version=0)
    assert len(groups) == 3 and all(int(g.prompt_id[1:]) % 2 for g in groups)
    rounds = len(pool.started)
    assert rounds > 1 and stats["rollout/groups_sampled"] == 3 * rounds
    assert timings.generate_s == pytest.approx(1.0 * rounds)  # refill rounds add up


def test_keep_varied():
    flat = TrajectoryGroup("a", [_traj("a", 0, 1.0, 0), _traj("a", 1, 1.0, 0)])
    varied = TrajectoryGroup("b", [_traj("b", 0, 0.0, 0), _traj("b", 1, 1.0, 0)])
    assert keep_varied([flat, varied]) == [varied] and keep_varied([]) == []


def test_evaluation_takes_pending_weights():
    feed, pool, sender = _feed(["run.eval_samples=4"])
    pool.group_size = 4
    sender.pending = "weights v3"
    groups = feed.evaluation(ROWS[:2], seed=-1)
    assert [len(g.trajectories) for g in groups] == [4, 4] and pool.started[0][2] == "weights v3"


class _Calls:
    """A worker handle whose `rollout.remote(...)` records the call and returns a token (no Ray)."""

    def __init__(self, log: list, index: int):
        self.rollout = self
        self.log, self.index = log, index

    def remote(self, rows, group_size, temperature, seed, weights=None, redo=False):
        self.log.append((self.index, rows[0]["id"], seed))
        return object()


class _StreamPool:
    def __init__(self, workers: int):
        self.calls: list = []
        self.workers = [_Calls(self.calls, i) for i in range(workers)]
        self.num_workers = workers
        self.recovery = None


def test_the_stream_feed_keeps_k_steps_out_and_resumes_without_training_a_slot_twice():
    from agentrl_ray.learner.stream import StreamFeed

    cfg = load_config(
        None, ["sync.pipeline=stream", "sync.max_staleness=2", "rollout.prompts_per_step=4", "run.steps=10"]
    )
    rows = [{"id": str(i), "prompt": "q"} for i in range(100)]
    sampler = PromptSampler(rows, 4, seed=0)
    pool = _StreamPool(workers=3)
    feed = StreamFeed(pool, sender=None, sampler=sampler, cfg=cfg)
    feed._issue()
    # k * P = 8 slots out, spread over the workers by load, the prompts of steps 0 and 1 in order.
    assert len(pool.calls) == 8 and [c[0] for c in pool.calls] == [0, 1, 2, 0, 1, 2, 0, 1]
    assert [c[1] for c in pool.calls] == [r["id"] for s in range(2) for r in sampler.for_step(s)]
    assert len({c[2] for c in pool.calls}) == 8  # one seed per slot: the environments' keys differ
    # Slots come back out of order: consuming 1 and 3 moves nothing below them; consuming 0 moves the base past 1.
    for slot in (1, 3, 0):
        feed._consume(slot)
        feed.counts["trained_groups"] += 1
    assert (feed.base, feed.consumed_ahead) == (2, {3})
    feed._issue()
    assert len(pool.calls) == 11  # three consumed: three more out (slots 8-10)
    state = feed.state()
    # A resume issues every slot not consumed again, and never one that was.
    resumed_pool = _StreamPool(workers=3)
    resumed = StreamFeed(resumed_pool, sender=None, sampler=sampler, cfg=cfg)
    resumed.restore(state)
    resumed._issue()
    issued = {c[2] for c in resumed_pool.calls}
    seeds = {slot: cfg.run.seed * 100003 + 7919 * slot for slot in range(40)}
    assert seeds[3] not in issued and seeds[0] not in issued and seeds[1] not in issued
    assert {seeds[2], seeds[4], seeds[10]} <= issued and seeds[11] not in issued


def test_the_stream_feed_stops_when_every_group_comes_back_stale():
    """Engines that never get the learner's weights (a resume bug once did that) return every group past the bound:
    the feed drops and regenerates, then stops with a line naming the bound instead of regenerating for ever."""
    from builders import trajectory

    from agentrl_ray.learner.stream import StreamFeed
    from agentrl_ray.types import RunStopped

    cfg = load_config(None, ["sync.pipeline=stream", "sync.max_staleness=2", "rollout.prompts_per_step=4"])
    feed = StreamFeed(_StreamPool(workers=2), sender=None, sampler=PromptSampler(ROWS * 10, 4, seed=0), cfg=cfg)
    returned = []

    def back_from_version_0():  # what `_wait` puts back: the next slot out, sampled by weights 0
        slot = len(returned)
        returned.append(slot)
        feed.back[slot] = (TrajectoryGroup(f"p{slot}", [trajectory(f"p{slot}", policy_version=0)]), RolloutTimings())

    feed._wait = back_from_version_0
    with pytest.raises(RunStopped, match=r"more than sync.max_staleness=2 versions behind weights 5"):
        feed.take(5, version=5)
    assert len(returned) == 2 * 2 * 4 + 1  # twice the slots out, dropped and regenerated, then the stop
    fresh = StreamFeed(_StreamPool(workers=2), sender=None, sampler=PromptSampler(ROWS * 10, 4, seed=0), cfg=cfg)
    fresh._wait = lambda: fresh.back.setdefault(
        len(fresh.back) + fresh.base, (TrajectoryGroup("q", [trajectory("q", policy_version=4)]), RolloutTimings())
    )
    groups, _, stats = fresh.take(5, version=5)  # within the bound: taken
    assert len(groups) == 4 and stats["rollout/stale_dropped"] == 0
