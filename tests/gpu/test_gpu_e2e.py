"""GPU tier: the whole loop on one GPU, colocated (learner rank, engine and env host share it), weights handed
from the learner to the engine as CUDA IPC handles every step. Skipped without a CUDA device.

Runs with the torch backend everywhere torch runs, and with vLLM where vLLM is importable (skipped otherwise: the
GPU machines this project is lent cannot install vLLM, see docs/gpu_checks.md). One command, from the checkout:

    pytest tests/gpu/test_gpu_e2e.py -m gpu -v -s          (or: bash tests/gpu/kit/run.sh on a bare GPU machine)

Each test prints a `GPU_E2E_JSON {...}` line with what it measured (time, peak GPU memory).
"""

import importlib.util
import json
import subprocess
import threading
import time

import pytest
import ray
import torch

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU"),
]

BACKENDS = [
    "torch",
    pytest.param(
        "vllm",
        marks=pytest.mark.skipif(importlib.util.find_spec("vllm") is None, reason="vLLM is not installed here"),
    ),
]


class GpuMemory:
    """The device's used memory (nvidia-smi, so this process opens no CUDA context of its own), sampled every
    0.2 s while a `with` block runs: its peak in MiB."""

    def __init__(self) -> None:
        self.peak, self._stop = 0, threading.Event()

    def _used(self) -> int:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=memory.used", "--format=csv,noheader,nounits", "--id=0"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        return int(out.stdout.strip().splitlines()[0])

    def _run(self) -> None:
        while not self._stop.wait(0.2):
            self.peak = max(self.peak, self._used())

    def __enter__(self):
        self.baseline = self._used()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc):
        self._stop.set()
        self._thread.join()


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


@pytest.mark.parametrize("backend", BACKENDS)
def test_default_task_trains_colocated_on_one_gpu(local_ray, builtin_model_path, tmp_path, backend):
    """20 steps of the default task on the GPU profile (DeepSpeed ZeRO-2 learner), engine and learner on one GPU:
    it learns, after every IPC sync the engine's greedy tokens equal transformers on the pushed weights, and a
    resume continues from the checkpoint."""
    from agentrl_ray.driver import train
    from agentrl_ray.infra.profiles import load_config

    overrides = [
        "profile=gpu",
        f"rollout.backend={backend}",
        "model.dtype=float32",  # the integrity probe compares log-probs within float32's band
        "sync.max_staleness=0",  # learner and engine take turns: the engine sleeps through each update
        "run.steps=20",
        "run.eval_every=10",
        "run.checkpoint_every=10",
        "run.plot=false",
        "learner.num_cpus_per_worker=1",  # the GPU profile asks 4 (and 2 per engine): the test's Ray has 4 CPUs
        "rollout.num_cpus_per_worker=1",
        f"run.output_dir={tmp_path}",
        f"run.name={backend}",
    ]
    t0 = time.perf_counter()
    with GpuMemory() as memory:
        train(load_config("examples/calculator/config.yaml", overrides))
    elapsed = time.perf_counter() - t0
    run_dir = tmp_path / backend
    planned = json.loads((run_dir / "config.json").read_text())
    assert planned["sync"]["transport"] == "ipc"  # colocated on one GPU (cluster.apply_plan)
    records = _records(run_dir)
    evals = {r["step"]: r["eval/success"] for r in records if "eval/success" in r}
    steps = [r for r in records if r["step"] > 0]
    print(
        "GPU_E2E_JSON "
        + json.dumps(
            {
                "test": "train",
                "backend": backend,
                "seconds": round(elapsed, 1),
                "gpu_mib_peak": memory.peak,
                "gpu_mib_before": memory.baseline,
                "eval": evals,
                "probe_gap_max": max(r["integrity/weights/mean_gap"] for r in steps),
                "behaviour_gap_max": max(r.get("integrity/behaviour_logprobs/mean_gap", 0.0) for r in steps),
                "integrity_failures": sum(r["integrity/failures"] for r in steps),
                "step_s_median": sorted(r["time/step_s"] for r in steps)[len(steps) // 2],
            }
        ),
        flush=True,
    )
    assert evals[20] >= 0.85, evals
    assert all(r["integrity/failures"] == 0 for r in steps), [r.get("integrity/failed") for r in steps]

    train(load_config("examples/calculator/config.yaml", [*overrides, "run.steps=22", "run.resume=true"]))
    after = _records(run_dir)
    assert [r["step"] for r in after if r["step"] > 20] == [21, 22]
    assert [r["step"] for r in after if 0 < r["step"] <= 20] == list(range(1, 21))


def test_torch_engine_gives_gpu_memory_back_while_asleep(tmp_path):
    """A ~100M-parameter random model in bfloat16: asleep, the engine holds nothing on the GPU; a load while
    asleep puts only the new weights there (the old ones never come back); it then generates like before."""
    from transformers import AutoModelForCausalLM, Qwen2Config

    from agentrl_ray.rollout.torch_engine import TorchEngine

    config = Qwen2Config(
        vocab_size=32000,
        hidden_size=768,
        intermediate_size=2048,
        num_hidden_layers=8,
        num_attention_heads=12,
        num_key_value_heads=4,
        tie_word_embeddings=True,
    )
    torch.manual_seed(0)
    AutoModelForCausalLM.from_config(config).to(torch.bfloat16).save_pretrained(tmp_path)
    engine = TorchEngine(
        str(tmp_path), dtype="bfloat16", seed=0, max_model_len=256, max_num_seqs=16, device="cuda", sleep=True
    )
    prompts = [[5, 6, 7, 8], [9, 10]]
    kwargs = dict(temperature=0.0, top_p=1.0, stop_token_ids=[], ignore_eos=True)
    before = engine.generate(prompts, [16, 16], **kwargs)
    torch.cuda.synchronize()
    awake = torch.cuda.memory_allocated()
    weights = {n: t.detach().clone() for n, t in engine.model.state_dict().items()}  # what the learner would hand over
    held_by_update = torch.cuda.memory_allocated() - awake
    engine.sleep()
    asleep = torch.cuda.memory_allocated() - held_by_update
    assert asleep < 0.02 * awake, (asleep, awake, _live_cuda_tensors(exclude=weights.values()))
    torch.cuda.reset_peak_memory_stats()
    engine.load_weights(iter(weights.items()))  # while asleep: straight into fresh device memory
    peak_during_load = torch.cuda.max_memory_allocated() - held_by_update
    assert not engine.asleep
    assert peak_during_load <= awake * 1.05, (peak_during_load, awake)  # never the old and the new at once
    after = engine.generate(prompts, [16, 16], **kwargs)
    assert [g.token_ids for g in after] == [g.token_ids for g in before]
    print("GPU_E2E_JSON " + json.dumps({"test": "sleep", "awake_mib": awake >> 20, "asleep_mib": asleep >> 20}))


def _live_cuda_tensors(exclude) -> list[tuple[tuple, str, int]]:
    """(shape, dtype, MiB) of the CUDA tensors the garbage collector can reach, the largest first (a failure's clue)."""
    import gc

    skip = {id(t) for t in exclude}
    found = [o for o in gc.get_objects() if isinstance(o, torch.Tensor) and o.is_cuda and id(o) not in skip]
    found.sort(key=lambda t: -t.numel() * t.element_size())
    return [(tuple(t.shape), str(t.dtype), t.numel() * t.element_size() >> 20) for t in found[:8]]


@ray.remote(num_gpus=0.5)
class _IpcReceiver:
    """An engine's side of the handoff in another process sharing the GPU: opens the update's handles."""

    def checksums(self, update):
        from agentrl_ray.sync.ipc import received_tensors

        out = {}
        for name, tensor in received_tensors(update):
            assert tensor.is_cuda
            out[name] = float(tensor.double().sum())
        return out, torch.cuda.memory_allocated()


def test_ipc_handles_open_in_another_process_on_the_same_gpu(local_ray):
    """CUDA handles, not copies: the other process sees the sender's values and allocates nothing for them; its
    device index is found by the GPU's UUID (Ray gives the actor its own CUDA_VISIBLE_DEVICES)."""
    from agentrl_ray.sync.ipc import ipc_update

    g = torch.Generator(device="cuda").manual_seed(0)
    named = [(f"layer{i}.weight", torch.randn(1024, 1024, device="cuda", generator=g)) for i in range(8)]
    update, buffers = ipc_update(named, 1, max_bytes=3 * 2**20, dtype=torch.bfloat16)  # 2 MiB a tensor in bf16
    assert len(update.buckets) == 8 and all(h.device_uuid for h in update.payload)
    receiver = _IpcReceiver.remote()
    sums, allocated = ray.get(receiver.checksums.remote(update), timeout=120)
    for name, tensor in named:
        assert sums[name] == pytest.approx(float(tensor.to(torch.bfloat16).double().sum()), rel=1e-9)
    assert allocated < 2**20  # opened in place: nothing of the 16 MiB copied into the receiver's own memory
    del buffers
    ray.kill(receiver)
