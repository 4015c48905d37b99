"""The C allocator of the processes that run the model on a CPU: freed memory stays mapped and is used again.

Both a CPU rollout engine and a CPU learner allocate and free the same large tensors at every step: an engine the
logits of each decode step and their log-probabilities (64 sequences x a 151,936-token vocabulary: 39 MB each in
float32), a learner its activations (~3 GiB per micro-batch at the 0.5B shape). glibc's malloc gives a block above its
mmap threshold (which adapts, up to 32 MiB) a fresh mapping and unmaps it when it is freed, and returns the free top of
its heap to the kernel: so every step page-faults and zeroes that memory again. At the 0.5B shape in bfloat16 that was
1.9 million page faults per 64 x 64 generated tokens and ~20% of an engine's decode time; a learner's micro-batch
ran 13-18% faster without them in single runs of its benchmark, within that machine's spread between runs
(docs/history/benchmarks.md, round 8). `allocator_env` raises the mmap threshold to 1 GiB and turns trimming off. A
freed block then goes back to malloc's free lists, still mapped, for the next step.

An engine also gets one arena, every thread on malloc's main heap: a thread other than the main one, such as the one
where a Ray actor runs its methods, otherwise allocates from heaps of at most 64 MiB that glibc unmaps whole once
they are empty, whatever the trim threshold says. A learner does not: its OpenMP threads allocate inside parallel
kernels (the attention's backward), and on one arena they wait for each other's lock. At the 25M shape in bfloat16
that made the learner's update 4.75 s against 3.80 s with per-thread arenas (and 3.98 s with glibc's defaults;
docs/history/benchmarks.md, round 9), while the 0.5B learner ran no faster on one arena than without it (round 8). The
learner's update runs in a Ray Train thread, whose arena is a list of 64 MiB heaps that glibc unmaps as a free()
empties them; a top pad above 64 MiB (`KEEP_THREAD_HEAPS`) keeps them mapped, so its micro-batches reuse the same
pages. Kept as it is, a process would hold its high-water mark from then on: the engine the temporaries of its last
weight reload, the learner the activations of a micro-batch while the engines sample. So each gives it back where a
phase ends, when it holds more than 128 MiB free (`release_freed_memory`: after a weight reload and a rollout call,
after the learner's update), and the next phase page-faults its blocks once, not at every step. Measured with the engine
alone after such a release: 3-5 page faults per generated token on one arena, 130-160 with glibc's per-thread
arenas (hence one arena for the engine).

glibc reads these variables once, when the process starts, so they go in the runtime environment of the actors that
run the model (the engine backend's `process_env`, the learner workers' `worker_runtime_env`), not in os.environ of a
running process.

A user who chose their own allocator settings keeps them: nothing is set when LD_PRELOAD (tcmalloc, jemalloc), a
MALLOC_*_ variable or a glibc.malloc tunable is in the driver's environment, or AGENTRL_KEEP_FREED_MEMORY=0 (glibc's
defaults). Other C libraries ignore the variables.
"""

from __future__ import annotations

import ctypes
import functools
import os

MMAP_THRESHOLD = 1 << 30  # a single block of 1 GiB or more still gets its own mapping, returned when freed
NO_TRIM = 1 << 40  # the free top of the heap is kept (glibc takes any size_t)
# A thread's arena is a list of heaps of at most 64 MiB (glibc's HEAP_MAX_SIZE on 64-bit), and glibc unmaps the
# newest heap whenever a free() leaves it empty, unless the heap before it lacks room for malloc's top pad
# (arena.c's heap_trim). With a pad above 64 MiB no heap qualifies, so a learner's activations stay mapped from one
# micro-batch to the next in Ray Train's training thread as they do on the main heap. Without it the run's learner
# page-faulted and zeroed 0.7-2.1 million pages (3-8 GB) a step, 6-14 CPU-seconds of system time, where the same
# update in a main thread faults almost none after its first step (docs/history/benchmarks.md, round 13). On the main
# heap the pad only widens each brk() extension; pages are resident once touched, as before.
KEEP_THREAD_HEAPS = 128 * 2**20
USER_SETTINGS = (
    "LD_PRELOAD",
    "MALLOC_MMAP_THRESHOLD_",
    "MALLOC_TRIM_THRESHOLD_",
    "MALLOC_TOP_PAD_",
    "MALLOC_ARENA_MAX",
    "GLIBC_TUNABLES",  # only where it sets glibc.malloc.*
)


def user_allocator_settings(env: dict[str, str] | None = None) -> list[str]:
    """The allocator settings the user gave, which `allocator_env` leaves alone."""
    env = os.environ if env is None else env
    found = [name for name in USER_SETTINGS if env.get(name) and name != "GLIBC_TUNABLES"]
    if "glibc.malloc." in env.get("GLIBC_TUNABLES", ""):
        found.append("GLIBC_TUNABLES")
    return found


def allocator_env(env: dict[str, str] | None = None, *, one_arena: bool) -> dict[str, str]:
    """Environment variables for a process that runs the model on a CPU (see the module's docstring); empty where the
    user set their own. `one_arena`: every thread on malloc's main heap (an engine: yes; a learner: no)."""
    env = os.environ if env is None else env
    if user_allocator_settings(env) or env.get("AGENTRL_KEEP_FREED_MEMORY") == "0":
        return {}
    out = {"MALLOC_MMAP_THRESHOLD_": str(MMAP_THRESHOLD), "MALLOC_TRIM_THRESHOLD_": str(NO_TRIM)}
    if one_arena:
        out["MALLOC_ARENA_MAX"] = "1"
    else:
        out["MALLOC_TOP_PAD_"] = str(KEEP_THREAD_HEAPS)
    return out


RELEASE_ABOVE = 128 * 2**20  # free bytes in malloc's heap below which a release is not worth its cost


def release_freed_memory(above: int = RELEASE_ABOVE) -> bool:
    """Give the memory freed since the last call back to the kernel (glibc's malloc_trim) when malloc holds more than
    `above` free bytes; a no-op elsewhere. True when it released. The check keeps small models' steps from paying
    for a trim and the page faults after it (the tiny model's tool step: 0.29 -> 0.35 s with a trim at every step)."""
    libc = _glibc()
    if libc is None or _free_bytes(libc) <= above:
        return False
    libc.malloc_trim(0)
    return True


class _Mallinfo2(ctypes.Structure):
    _fields_ = [
        (name, ctypes.c_size_t)
        for name in ("arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks", "uordblks", "fordblks")
    ] + [("keepcost", ctypes.c_size_t)]


def _free_bytes(libc) -> int:
    """Bytes free in malloc's heaps (mallinfo2's fordblks, glibc >= 2.33); without mallinfo2, as if above any limit."""
    info = getattr(libc, "mallinfo2", None)
    if info is None:
        return 2**63
    info.restype = _Mallinfo2
    return int(info().fordblks)


@functools.cache
def _glibc():
    try:
        libc = ctypes.CDLL(None)
        libc.gnu_get_libc_version  # noqa: B018 (glibc's; other C libraries have no malloc_trim)
        libc.malloc_trim.argtypes = [ctypes.c_size_t]
        libc.malloc_trim.restype = ctypes.c_int
    except (OSError, AttributeError):
        return None
    return libc
