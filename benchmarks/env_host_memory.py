"""Memory and start-up time of one env host actor, measured from outside its process.

    python benchmarks/env_host_memory.py [--repeats 2]

Starts a local Ray, one `RestartableEnvHost` actor (the class the rollout pool creates) at `env.isolation=thread`,
opens one calculator environment in it, and reads the actor process's RSS and USS (unique set size: what ending
the process would free) with psutil, and whether torch is mapped into it. "ready" is the time from creating the
actor to its first answer. Run it on two checkouts (PYTHONPATH and the working directory set to each, since Ray
puts the driver's working directory on its workers' path) to compare them; docs/benchmarks.md has the numbers.
"""

from __future__ import annotations

import argparse
import time

import psutil
import ray


def measure() -> dict[str, float | bool]:
    from agentrl_ray.rollout.recovery import RestartableEnvHost

    t0 = time.perf_counter()
    host = ray.remote(RestartableEnvHost).options(num_cpus=0.25, max_concurrency=10).remote(2.0, isolation="thread")
    pid = ray.get(host.pid.remote())
    ready = time.perf_counter() - t0
    ray.get(host.create.remote("k", "agentrl_ray.envs.builtin.calculator:CalculatorEnv", {}, {"id": 1}))
    proc = psutil.Process(pid)
    info = proc.memory_full_info()
    torch_mapped = any("torch" in m.path for m in proc.memory_maps())
    ray.kill(host)
    return {"ready_s": ready, "rss_mib": info.rss / 2**20, "uss_mib": info.uss / 2**20, "torch": torch_mapped}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=2)
    args = parser.parse_args()
    ray.init(address="local", num_cpus=2, include_dashboard=False)
    try:
        for _ in range(args.repeats):
            m = measure()
            print(
                f"env host ready in {m['ready_s']:.2f} s, RSS {m['rss_mib']:.0f} MiB, USS {m['uss_mib']:.0f} MiB, "
                f"torch imported: {m['torch']}"
            )
    finally:
        ray.shutdown()


if __name__ == "__main__":
    main()
