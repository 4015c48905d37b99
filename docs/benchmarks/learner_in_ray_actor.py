# Record of a scratch experiment (issue 33, round 10; docs/benchmarks.md): the learner benchmark's step in a plain
# process against the same in a Ray actor. python docs/benchmarks/learner_in_ray_actor.py MODEL_DIR plain|actor
# (MODEL_DIR from benchmarks/learner_throughput.build_model; the run's MALLOC_* settings exported). Not maintained.
"""Scratch: the learner benchmark's quarter step in a plain process vs in a Ray actor's non-main thread (as Ray
Train runs the update), same machine, one after the other."""
import argparse, json, os, sys, threading
from pathlib import Path
ROOT = Path(__file__).resolve().parents[2]  # the checkout: benchmarks/ and the package, in the actor too
ARGS = dict(device="cpu", shape="0.5b", micro_batch=4, micro_batches=4, seq=316, min_len=314, prompt_len=58,
            warmup=1, steps=3, peak_tflops=0.964, ragged=False, profile=0, paired=0, paired_keep=0, paired_thread=0,
            paired_scatter=0, paired_share=0)

def bench(model_dir, where):
    sys.path[:0] = [str(ROOT / "benchmarks"), str(ROOT)]
    import torch
    torch.set_num_threads(2)
    import learner_throughput as lt
    args = argparse.Namespace(**ARGS)
    out = {}
    def go():
        out["r"] = lt.run_variant(args, "lorabf16.compile", Path(model_dir), Path(f"/tmp/ab_{where}.json"))
    t = threading.Thread(target=go); t.start(); t.join()
    r = out["r"]
    return {"where": where, "nice": os.nice(0), "omp": os.environ.get("OMP_NUM_THREADS"), "threads": torch.get_num_threads(),
            "warmup": r["warmup_step_s"], "steps": r["step_s"]}

if __name__ == "__main__":
    model_dir = sys.argv[1]; mode = sys.argv[2]
    if mode == "plain":
        print(json.dumps(bench(model_dir, "plain")), flush=True)
    else:
        import ray
        ray.init(num_cpus=2, include_dashboard=False, log_to_driver=True)
        @ray.remote(num_cpus=1.2)
        class A:
            def run(self, d):
                return bench(d, "actor")
        a = A.remote()
        print(json.dumps(ray.get(a.run.remote(model_dir))), flush=True)
        ray.shutdown()
