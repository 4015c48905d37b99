"""The allocator settings of the processes that run the model on a CPU (agentrl_ray/allocator.py): what they are,
when the user's own win, and that glibc really stops page-faulting a large tensor freed and allocated again."""

import json
import os
import platform
import subprocess
import sys
import textwrap

import pytest

from agentrl_ray.infra.allocator import USER_SETTINGS, allocator_env, user_allocator_settings
from agentrl_ray.rollout.vllm_engine import vllm_env

# 24 x a 39 MB float32 tensor (64 x 151,936 logits), in a thread other than the main one, as in a Ray actor, after
# memory was released as at the end of a phase.
_FAULTS = textwrap.dedent(
    """
    import json, resource, threading, torch
    from agentrl_ray.infra.allocator import release_freed_memory
    out = {}
    def steps():
        for _ in range(3):  # the heap reaches its high-water mark
            x = torch.ones(64, 151936); y = x * 2; del x, y
        release_freed_memory(above=0)  # as where a phase ends: the next step faults once, the ones after it not
        x = torch.ones(64, 151936); y = x * 2; del x, y
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(24):
            x = torch.ones(64, 151936); y = x * 2; del x, y
        out["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    t = threading.Thread(target=steps); t.start(); t.join()
    print(json.dumps(out))
    """
)


# Five such tensors freed: held (mapped) with the settings until release_freed_memory gives them back, if more than
# its limit is free.
_RELEASE = textwrap.dedent(
    """
    import json, threading, torch
    from agentrl_ray.infra.allocator import release_freed_memory
    def rss_mib():
        for line in open("/proc/self/status"):
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    out = {}
    def phase():
        xs = [torch.ones(64, 151936) for _ in range(5)]
        out["during"] = rss_mib()
        del xs
        out["freed"] = rss_mib()
        out["released_above_1GiB"] = release_freed_memory(above=2**30)  # 195 MB free: not worth a release
        out["released"] = release_freed_memory(above=2**20)
        out["after"] = rss_mib()
    t = threading.Thread(target=phase); t.start(); t.join()
    print(json.dumps(out))
    """
)


# A learner's micro-batch in Ray Train's training thread: forward keeps 32 activations of 10 MB (more than a
# thread's 64 MiB heaps hold), backward frees them newest first while it makes a gradient of each; eight of them.
_THREAD_HEAPS = textwrap.dedent(
    """
    import json, resource, threading, torch
    out = {}
    def micro_batch():
        acts = [torch.ones(2_500_000) for _ in range(32)]
        g = torch.ones(2_500_000)
        while acts:
            a = acts.pop(); g2 = torch.ones(2_500_000); del a, g; g = g2
        del g
    def steps():
        for _ in range(3):
            micro_batch()
        f0 = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(8):
            micro_batch()
        out["faults"] = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - f0
    t = threading.Thread(target=steps); t.start(); t.join()
    print(json.dumps(out))
    """
)


@pytest.fixture
def no_user_allocator(monkeypatch):
    for name in USER_SETTINGS:
        monkeypatch.delenv(name, raising=False)


def _run(script: str, env: dict[str, str]) -> dict:
    clean = {k: v for k, v in os.environ.items() if k not in ("LD_PRELOAD", "GLIBC_TUNABLES") and "MALLOC" not in k}
    res = subprocess.run(
        [sys.executable, "-c", script], env={**clean, **env}, capture_output=True, text=True, timeout=120, check=True
    )
    return json.loads(res.stdout.strip().splitlines()[-1])


GLIBC = platform.libc_ver()[0] == "glibc"


@pytest.mark.slow  # over ~3 s: left out of `make test-fast`
@pytest.mark.skipif(not GLIBC, reason="the MALLOC_*_ variables are glibc's")
def test_freed_large_tensors_stay_mapped_with_the_settings():
    pages = 24 * 2 * 64 * 151936 * 4 // 4096  # two 39 MB tensors per step
    default = _run(_FAULTS, {})["faults"]
    kept = _run(_FAULTS, allocator_env({}, one_arena=True))["faults"]
    print(f"page faults over 24 steps: default {default}, with allocator_env {kept} (all fresh: {pages})")
    assert default > 0.9 * pages  # glibc maps and unmaps each one: every page faults again at every step
    assert kept < 0.2 * pages  # mapped once, used again (measured: 8% of the pages, residual heap growth)


@pytest.mark.skipif(not GLIBC, reason="the MALLOC_*_ variables and malloc_trim are glibc's")
def test_released_memory_goes_back_to_the_kernel():
    rss = _run(_RELEASE, allocator_env({}, one_arena=True))
    print(f"RSS MiB with five 39 MB tensors, after freeing them, after release_freed_memory: {rss}")
    held = 5 * 64 * 151936 * 4 / 2**20
    assert not rss["released_above_1GiB"] and rss["released"]
    assert rss["freed"] > rss["after"] + 0.8 * held  # kept mapped when freed, given back when released


@pytest.mark.skipif(not GLIBC, reason="per-thread heaps and MALLOC_TOP_PAD_ are glibc's")
def test_a_threads_heaps_stay_mapped_between_micro_batches_with_the_learners_settings():
    settings = allocator_env({}, one_arena=False)
    without_pad = {k: v for k, v in settings.items() if k != "MALLOC_TOP_PAD_"}
    unmapped = _run(_THREAD_HEAPS, without_pad)["faults"]
    kept = _run(_THREAD_HEAPS, settings)["faults"]
    print(f"page faults over 8 micro-batches in a thread: without the top pad {unmapped}, with it {kept}")
    # glibc unmaps a heap that a free() leaves empty and maps it again at the next micro-batch (measured: 48,831
    # faults against 4,883, the rest being the tensors' first touch of pages the heaps already held)
    assert unmapped > 4 * kept


@pytest.mark.parametrize("one_arena", [True, False])
def test_the_settings_keep_freed_memory(one_arena):
    env = allocator_env({}, one_arena=one_arena)
    assert int(env["MALLOC_MMAP_THRESHOLD_"]) >= 2**30  # far above a step's largest tensor
    assert int(env["MALLOC_TRIM_THRESHOLD_"]) >= 2**40  # never trimmed
    # An engine: every thread on the main heap, which has no 64 MiB heaps to unmap. A learner: per-thread arenas,
    # where its OpenMP threads allocate without waiting for one lock.
    assert env.get("MALLOC_ARENA_MAX") == ("1" if one_arena else None)
    # Per-thread arenas keep their emptied heaps (allocator.KEEP_THREAD_HEAPS) only with a pad over 64 MiB.
    assert one_arena or int(env["MALLOC_TOP_PAD_"]) > 64 * 2**20


@pytest.mark.parametrize(
    "user",
    [
        {"LD_PRELOAD": "/usr/lib/x86_64-linux-gnu/libtcmalloc_minimal.so.4"},
        {"MALLOC_ARENA_MAX": "2"},
        {"MALLOC_TRIM_THRESHOLD_": "0"},
        {"GLIBC_TUNABLES": "glibc.malloc.hugetlb=1"},
    ],
)
def test_the_users_own_allocator_settings_win(user):
    assert user_allocator_settings(user)
    assert allocator_env(user, one_arena=True) == allocator_env(user, one_arena=False) == {}


def test_the_settings_can_be_turned_off():
    assert allocator_env({"AGENTRL_KEEP_FREED_MEMORY": "0"}, one_arena=True) == {}
    assert allocator_env({"AGENTRL_KEEP_FREED_MEMORY": "1"}, one_arena=True) == allocator_env({}, one_arena=True)


def test_other_glibc_tunables_are_not_allocator_settings():
    tunable = {"GLIBC_TUNABLES": "glibc.cpu.hwcaps=-AVX512F"}
    assert allocator_env(tunable, one_arena=True) == allocator_env({}, one_arena=True)


def test_a_cpu_engine_gets_the_settings_a_gpu_engine_does_not(no_user_allocator):
    assert allocator_env(one_arena=True).items() <= vllm_env(use_gpu=False).items()
    assert not any(k.startswith("MALLOC_") for k in vllm_env(use_gpu=True))


def test_a_cpu_learner_gets_the_settings_a_gpu_learner_does_not(no_user_allocator, tmp_path):
    from agentrl_ray.driver import learner_run_config
    from agentrl_ray.infra.profiles import load_config

    cpu = learner_run_config(load_config(None, ["profile=cpu"]), str(tmp_path))
    gpu = learner_run_config(load_config(None, ["profile=cpu", "learner.use_gpu=true"]), str(tmp_path))
    assert cpu.worker_runtime_env["env_vars"] == allocator_env(one_arena=False)
    assert "MALLOC_MMAP_THRESHOLD_" in cpu.worker_runtime_env["env_vars"]
    assert "MALLOC_ARENA_MAX" not in cpu.worker_runtime_env["env_vars"]  # per-thread arenas for its OpenMP threads
    assert gpu.worker_runtime_env["env_vars"] == {}
