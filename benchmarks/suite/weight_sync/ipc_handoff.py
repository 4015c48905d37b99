"""The colocated weight handoff: learner rank 0's full weights into a rollout engine on the same GPU, by CUDA IPC
(`sync.transport=ipc`) against the trip through host memory and Ray's object store (`sync.transport=object_store`),
through the project's own senders, receiver and torch engine. Seconds per GB of weights sent (in the engine's dtype).

    python benchmarks/run.py weight_sync --mode ipc_handoff --shape 0.5b --shape 1.5b --repeats 5 --out /tmp/ipc.json
    python benchmarks/run.py weight_sync --mode ipc_handoff --device cpu --shape tiny --repeats 2   # the logic, a CPU

One handoff, as the learner's loop does it after a step (`learner/loop.py`, `sync_weights`):
- ipc: `Policy.named_tensors_for_sync(on_device=True)`'s tensors (the model's own, on the GPU) -> `IpcSender.push`:
  packed into buckets on the GPU, their CUDA IPC handles sent to the engine actor (Ray, `num_gpus=0.5`: the engine
  and the learner share the GPU), which opens them in place and copies each tensor into its weights
  (`WeightReceiver` -> `TorchEngine.load_weights`); the push returns when the engine has loaded, then the buffers
  are freed;
- object_store: the tensors copied to host memory (what `named_tensors_for_sync()` gives every other sender) ->
  `ObjectStoreSender.push` (packed, `ray.put`) -> the engine's receive (unpacked from the object store, copied to
  the GPU).
The first handoff of each transport is a warm-up (CUDA contexts, allocator, IPC mappings). After the timed ones the
engine's weights are compared with the learner's (they must be equal: bfloat16 on both sides). On a CPU the IPC
reduction carries the bytes themselves, so the CPU run checks the logic, not the speed.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from pathlib import Path

import ray
import torch
from results_path import ROOT, with_meta
from suite.learner.learner_throughput import build_model  # random bfloat16 weights of a shape, a HF folder

sys.path.insert(0, str(ROOT))
# Ray sends this module's actor classes by value, as it did when the module ran as a script (__main__): the workers
# need not import it by name.
ray.cloudpickle.register_pickle_by_value(sys.modules[__name__])


@ray.remote
class Engine:
    """A rollout worker's weight path: the torch engine and the receiver, as `rollout/worker.py` holds them."""

    def __init__(self, folder: str, device: str) -> None:
        from agentrl_ray.rollout.torch_engine import TorchEngine
        from agentrl_ray.sync.collective import CollectiveBackend
        from agentrl_ray.sync.receiver import WeightReceiver

        self.device = torch.device(device)
        self.engine = TorchEngine(folder, dtype="bfloat16", seed=0, max_model_len=64, max_num_seqs=1, device=device)
        self.weights = WeightReceiver(folder, self.engine.load_weights, CollectiveBackend("gloo", "cpu"))

    async def receive_weights(self, update) -> int:
        version = await self.weights.receive(update)
        if self.device.type == "cuda":
            torch.cuda.synchronize()  # the copies have landed before the sender frees its buffers
        return version

    def checksums(self) -> dict[str, float]:
        return {n: float(t.double().sum()) for n, t in self.engine.model.state_dict().items()}

    def gpu_memory_mib(self) -> float:
        return torch.cuda.memory_allocated() / 2**20 if self.device.type == "cuda" else 0.0


def handoffs(args, shape: str, folder: Path) -> dict:
    from transformers import AutoModelForCausalLM

    from agentrl_ray.sync.sender import IpcSender, ObjectStoreSender

    device = torch.device("cuda:0" if args.device == "cuda" else "cpu")
    learner = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.bfloat16).to(device)
    engine = Engine.options(num_gpus=0.5 if args.device == "cuda" else 0).remote(str(folder), args.device)
    ray.get(engine.checksums.remote())  # loaded
    own = learner.state_dict()
    gb = sum(t.numel() * 2 for t in own.values()) / 1e9  # what travels, in the engine's bfloat16
    senders = {
        "ipc": IpcSender(args.bucket_mb * 2**20, engine_dtype=torch.bfloat16),
        "object_store": ObjectStoreSender(engine_dtype=torch.bfloat16),
    }
    out: dict = {"shape": shape, "gb": round(gb, 4), "tensors": len(own)}
    version = 0
    for name, sender in senders.items():
        sender.setup([engine])
        times = []
        for _ in range(args.repeats + 1):
            with torch.no_grad():
                learner.model.norm.weight.add_(1.0)  # new weights each time, as after a step
            if device.type == "cuda":
                torch.cuda.synchronize()
            version += 1
            t0 = time.perf_counter()
            on_device = getattr(sender, "device_tensors", False)  # as learner/loop.py decides
            named = [(n, t.detach() if on_device else t.detach().cpu()) for n, t in learner.state_dict().items()]
            sender.push(named, version)
            pending = sender.take_pending()  # the object store's update, loaded by the engine's next call
            if pending is not None:
                ray.get(engine.receive_weights.remote(pending))
            del named, pending
            times.append(time.perf_counter() - t0)
        sums = ray.get(engine.checksums.remote())
        mine = {n: float(t.double().sum()) for n, t in learner.state_dict().items()}
        wrong = [n for n in mine if sums[n] != mine[n]]
        s = statistics.median(times[1:])
        out[name] = {
            "warmup_s": round(times[0], 4),
            "s": [round(t, 4) for t in times[1:]],
            "median_s": round(s, 4),
            "s_per_gb": round(s / gb, 4),
            "engine_equals_learner": not wrong,
            "mismatched": wrong[:5],
        }
        print(f"{shape:5s} {name:13s} {gb:.3f} GB  median {s:.3f} s  {s / gb:.4f} s/GB  equal: {not wrong}", flush=True)
    out["engine_gpu_mib_after"] = round(ray.get(engine.gpu_memory_mib.remote()), 1)
    ray.kill(engine)
    return out


def main(argv: list[str], prog: str) -> None:
    p = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n")[0])
    p.add_argument("--device", choices=("cuda", "cpu"), default="cuda")
    p.add_argument("--shape", action="append", choices=("tiny", "0.5b", "1.5b"), help="repeatable (default 0.5b)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--bucket-mb", type=int, default=256, help="sync.bucket_mb")
    p.add_argument("--out", type=Path)
    args = p.parse_args(argv)
    path = os.pathsep.join(x for x in (str(ROOT), os.environ.get("PYTHONPATH", "")) if x)  # the engine's imports
    ray.init(
        address="local",
        num_cpus=4,
        num_gpus=1 if args.device == "cuda" else 0,
        include_dashboard=False,
        runtime_env={"env_vars": {"PYTHONPATH": path}},
    )
    report: dict = {"device": args.device, "bucket_mb": args.bucket_mb, "results": []}
    if args.device == "cuda":
        report["gpu"], report["torch"] = torch.cuda.get_device_name(0), torch.__version__
    try:
        with tempfile.TemporaryDirectory() as tmp:
            for shape in args.shape or ["0.5b"]:
                folder = Path(tmp) / shape
                build_model(folder, shape, args.device)
                report["results"].append(handoffs(args, shape, folder))
    finally:
        ray.shutdown()
    summary = "s/GB, ipc / object store: " + ", ".join(
        f"{r['shape']} {r['ipc']['s_per_gb']:.4f} / {r['object_store']['s_per_gb']:.4f}" for r in report["results"]
    )
    text = json.dumps(with_meta(report, summary, gpu=report.get("gpu")), indent=1)
    if args.out:
        args.out.write_text(text)
    print(text)
