"""Weight-sync cost between two Ray nodes (separate raylets and object stores) on this machine, for the cost model
in docs/scaling.md: seconds per push against payload size, through the object store and a gloo broadcast.

    python benchmarks/run.py weight_sync                      # 8, 64, 256, 512 MB; benchmarks/results/sync_cost/
    python benchmarks/run.py weight_sync --sizes-mb 8 64

The sender is an actor on node A, the receiver an actor on node B (the learner rank 0 and an engine, without the
model around them). Object store: the sender `ray.put`s one packed float32 buffer, the receiver `ray.get`s it
(a copy between the two nodes' object stores, then into the receiver's memory). Collective: one broadcast of the
same buffer over a gloo group built like `sync/collective.py`'s. Each size: one warm-up, then the median of 3.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

import ray
import torch
from results_path import default_out, machine, with_meta

# Ray sends this module's actor classes by value, as it did when the module ran as a script (__main__): the workers
# need not import it by name.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote(num_cpus=0)
class Sender:
    def put(self, mb: int):
        buf = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
        return [ray.put(buf)]  # wrapped: the receiver gets the reference, not the value

    def group(self, addr: str, port: int) -> None:
        from agentrl_ray.sync.collective import CollectiveGroup

        self.g = CollectiveGroup(addr, port, 2, 0, "cpu")

    def broadcast(self, mb: int) -> float:
        buf = torch.ones(mb * 2**20 // 4, dtype=torch.float32)
        t0 = time.perf_counter()
        self.g.send([("w", buf)])
        return time.perf_counter() - t0


@ray.remote(num_cpus=0)
class Receiver:
    def get(self, box) -> float:
        t0 = time.perf_counter()
        value = ray.get(box[0])
        assert value.numel() > 0
        return time.perf_counter() - t0

    def group(self, addr: str, port: int) -> None:
        from agentrl_ray.sync.collective import CollectiveGroup

        self.g = CollectiveGroup(addr, port, 2, 1, "cpu")

    def receive(self, mb: int) -> float:
        t0 = time.perf_counter()
        self.g.receive([("w", (mb * 2**20 // 4,), "float32")])
        return time.perf_counter() - t0


def measure(sizes: list[int]) -> dict:
    from ray.cluster_utils import Cluster
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from agentrl_ray.sync.collective import free_port

    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 0})
    a = cluster.add_node(num_cpus=1, object_store_memory=1200 * 2**20)
    b = cluster.add_node(num_cpus=1, object_store_memory=1200 * 2**20)
    ray.init(address=cluster.address)
    try:
        pin = lambda n: NodeAffinitySchedulingStrategy(n.node_id, soft=False)  # noqa: E731
        sender = Sender.options(scheduling_strategy=pin(a)).remote()
        receiver = Receiver.options(scheduling_strategy=pin(b)).remote()
        port = free_port()
        addr = ray.util.get_node_ip_address()
        ray.get([receiver.group.remote(addr, port), sender.group.remote(addr, port)])
        rows = []
        for mb in sizes:
            store, coll = [], []
            for _ in range(4):
                box = ray.get(sender.put.remote(mb))
                store.append(ray.get(receiver.get.remote(box)))
                del box
                done = receiver.receive.remote(mb)
                coll.append(ray.get(sender.broadcast.remote(mb)))
                ray.get(done)
            row = {"mb": mb, "object_store_s": statistics.median(store[1:]), "gloo_s": statistics.median(coll[1:])}
            row["object_store_gb_s"] = mb / 1024 / row["object_store_s"]
            row["gloo_gb_s"] = mb / 1024 / row["gloo_s"]
            print(json.dumps({k: round(v, 4) for k, v in row.items()}), flush=True)
            rows.append(row)
        return {"machine": f"{machine()}, {os.cpu_count()} cores, 2 raylets on one host (loopback)", "rows": rows}
    finally:
        ray.shutdown()
        cluster.shutdown()


def main(argv: list[str], prog: str) -> None:
    ap = argparse.ArgumentParser(prog=prog, description=__doc__.splitlines()[0])
    ap.add_argument("--sizes-mb", type=int, nargs="*", default=[8, 64, 256, 512])
    ap.add_argument("--out", type=Path, help="JSON result (default: benchmarks/results/sync_cost/)")
    args = ap.parse_args(argv)
    out = measure(args.sizes_mb)
    path = args.out or default_out("sync_cost")
    path.parent.mkdir(parents=True, exist_ok=True)
    summary = "s per push, object store / gloo: " + ", ".join(
        f"{r['mb']} MB {r['object_store_s']:.3f} / {r['gloo_s']:.3f}" for r in out["rows"]
    )
    path.write_text(json.dumps(with_meta(out, summary), indent=2))
    print(f"wrote {path}")
