"""Real training steps through the whole stack (vLLM rollouts, env actors, Ray Train learner, weight sync), then a
resume that continues from the checkpointed step, and a resume of the same run after a crash tore its folder."""

import json
import re
import shutil
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from agentrl_ray.driver import SNAPSHOT, train
from agentrl_ray.infra.profiles import load_config

SMALL = [
    "profile=cpu",
    "rollout.prompts_per_step=4",
    "rollout.group_size=4",
    "data.train_size=64",
    "data.eval_size=8",
    "run.eval_samples=1",
    "run.eval_every=0",
    "run.checkpoint_every=1",
    "run.keep_checkpoints=0",
    "learner.lr=1e-3",
]


def _weights(folder):
    out = {}
    for f in sorted(folder.glob("*.safetensors")):
        out.update(load_file(str(f)))
    return out


def _records(run_dir):
    return [json.loads(line) for line in (run_dir / "metrics.jsonl").read_text().splitlines()]


_TWO_STEPS_WINDOW_MS: list[float] = []  # when the run below started and ended (the actors it started, by start time)


@pytest.fixture(scope="module")
def two_steps(local_ray, tmp_path_factory):
    """The 2-step run both resume tests start from (one run, not two: a run's start is most of its cost), with a
    copy of its folder taken before anything resumes it."""
    cwd = tmp_path_factory.mktemp("two_steps")
    with pytest.MonkeyPatch.context() as mp:
        # A relative output dir, as users give it: every output must land under the driver's working directory.
        mp.chdir(cwd)
        cfg = load_config(None, [*SMALL, "run.output_dir=runs", "run.name=t", "run.steps=2"])
        _TWO_STEPS_WINDOW_MS[:] = [time.time() * 1000]
        metrics = train(cfg)
        _TWO_STEPS_WINDOW_MS.append(time.time() * 1000)
    pristine = tmp_path_factory.mktemp("two_steps_copy") / "t"
    shutil.copytree(cwd / "runs" / "t", pristine)
    return cwd, cfg, metrics, pristine


@pytest.mark.integration
def test_steps_change_weights_then_resume_continues(two_steps, builtin_model_path, monkeypatch):
    tmp_path, cfg, metrics, _ = two_steps
    monkeypatch.chdir(tmp_path)
    overrides = [*SMALL, "run.output_dir=runs", "run.name=t"]
    run_dir = tmp_path / "runs" / "t"
    assert cfg.run_dir == run_dir
    assert metrics["samples"] == 2 * 4 * 4
    assert "eval/success" in metrics  # final held-out evaluation
    records = _records(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2]
    assert all(r["time/sync_s"] >= 0 for r in records[1:])
    assert (run_dir / "reward_curve.png").stat().st_size > 0
    # Every step keeps its first group (run.rollout_sample_groups=1), written on the driver's node: the viewer's sample.
    assert sorted(p.name for p in (run_dir / "rollouts").iterdir()) == ["step_000001.jsonl", "step_000002.jsonl"]
    sample = [json.loads(x) for x in (run_dir / "rollouts" / "step_000002.jsonl").read_text().splitlines()]
    assert [r["sample_index"] for r in sample] == [0, 1, 2, 3] and len({r["prompt_id"] for r in sample}) == 1
    assert sample[0]["step"] == 2 and sample[0]["completion"][0]["role"] == "assistant"

    base = _weights(Path(builtin_model_path))
    ckpt2 = _weights(run_dir / "checkpoint_000002" / "model")
    changed = [k for k in ckpt2 if k in base and not torch.equal(base[k], ckpt2[k])]
    assert len(changed) > len(ckpt2) // 2, f"only {len(changed)} of {len(ckpt2)} tensors changed"

    # Without resume=true an existing run is never overwritten.
    with pytest.raises(Exception, match="run.resume=true"):
        train(load_config(None, [*overrides, "run.steps=3"]))

    metrics = train(load_config(None, [*overrides, "run.steps=3", "run.resume=true"]))
    assert metrics["samples"] == 3 * 4 * 4  # continued counting from the checkpoint, not from zero
    records = _records(run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3]
    state = torch.load(run_dir / "checkpoint_000003" / "trainer_state.pt", weights_only=False)
    assert state["step"] == 3
    ckpt3 = _weights(run_dir / "checkpoint_000003" / "model")
    assert any(not torch.equal(ckpt2[k], ckpt3[k]) for k in ckpt3)


@pytest.mark.integration
def test_every_step_of_a_run_passes_the_integrity_checks(two_steps):
    """The checks on by default in a real run (vLLM engines, Ray Train learner): every step checked and passed, the
    weights probe within float32's band after each sync, the on-policy tokens' engine/learner gap too
    (learner/integrity.py; tests/unit/test_integrity.py breaks each check on purpose)."""
    _, cfg, _, pristine = two_steps
    steps = _records(pristine)[1:]
    assert cfg.sync.max_staleness == 0 and cfg.run.integrity
    for r in steps:
        assert r["integrity/failures"] == 0 and "integrity/failed" not in r, r.get("integrity/failed")
        assert r["integrity/policy_version/max_lag"] == 0 and r["integrity/token_continuity/broken"] == 0
        assert r["integrity/behaviour_logprobs/tokens"] > 0
        assert r["integrity/behaviour_logprobs/mean_gap"] < r["integrity/behaviour_logprobs/band"] == 5e-5
    # The probe of the weights pushed after step 1 is read at step 2, which (the last) reads its own (2) at once too.
    assert "integrity/weights/mean_gap" not in steps[0] and steps[1]["integrity/weights/version"] == 2
    assert steps[1]["integrity/weights/mean_gap"] < steps[1]["integrity/weights/band"] == 5e-5
    stop = json.loads((pristine / "stop.json").read_text())
    assert stop["integrity_failed_steps"] == 0 and stop["first_integrity_failure"] is None


def _cut(path, keep=0.5):
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


@pytest.mark.integration
def test_a_run_starts_no_ray_data_actor(two_steps):
    """Ray Train's TorchTrainer starts a Ray Data `DatasetManager` actor for every fit, datasets or not; ours leaves
    it out (infra/ray_train.py `torch_trainer`): ~200 MiB and a process start less, and the run above still trained."""
    import ray

    start, end = _TWO_STEPS_WINDOW_MS  # the shared Ray also holds the actors of other modules' trainers
    actors = ray._private.state.actors().values()
    classes = {a["ActorClassName"] for a in actors if start <= a["StartTime"] <= end}
    assert "RayTrainWorker" in classes and "TrainController" in classes, classes  # the run's learner actors
    assert not any("DatasetManager" in name for name in classes), classes


@pytest.mark.long
def test_resume_after_a_torn_snapshot_checkpoint_and_metrics_line(two_steps, tmp_path):
    """A real resume after a crash tore the run directory: Ray Train's checkpoint snapshot is cut short, the latest
    checkpoint's weights file is truncated and metrics.jsonl ends with half a line. The resume falls back to the
    newest checkpoint that verifies and completes every step; no traceback (agentrl_ray/run/resume.py). The torn
    run is a copy of the 2-step run above, taken before that one resumed."""
    run_dir = tmp_path / "torn"
    shutil.copytree(two_steps[3], run_dir)
    overrides = [*SMALL, f"run.output_dir={tmp_path}", "run.name=torn"]
    _cut(run_dir / SNAPSHOT)
    _cut(run_dir / "checkpoint_000002" / "model" / "model.safetensors")
    with (run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 3, "rew')

    metrics = train(load_config(None, [*overrides, "run.steps=3", "run.resume=true"]))

    assert metrics["samples"] == 3 * 4 * 4  # resumed from checkpoint 1 (16 samples), then steps 2 and 3
    steps = [json.loads(line)["step"] for line in (run_dir / "metrics.jsonl").read_text().splitlines()]
    assert steps == [0, 1, 2, 3]  # the torn line cut, step 2 of the first attempt dropped and redone once
    assert len(list(run_dir.glob("checkpoint_000002.corrupt-*"))) == 1
    assert len(list(run_dir.glob(f"{SNAPSHOT}.corrupt-*"))) == 1
    state = torch.load(run_dir / "checkpoint_000003" / "trainer_state.pt", weights_only=True)
    assert state["step"] == 3


@pytest.mark.long
@pytest.mark.parametrize(
    "variant",
    [
        ["learner.backend=deepspeed", "learner.zero_stage=2", "learner.num_workers=2"],
        ["profile=lora", "learner.lora.r=4", "learner.lora.quantize=nf4", "learner.bf16=true"],
        [
            "profile=lora",
            "learner.lora.r=4",
            "learner.bf16=true",
            "model.dtype=bfloat16",
            "learner.release_memory=false",
            "learner.compile=true",
        ],
    ],
    ids=["deepspeed-zero2-2-workers", "qlora", "lora-bf16-compiled"],
)
def test_other_learner_setups_train(local_ray, builtin_model_path, tmp_path, variant):
    """DeepSpeed ZeRO-2 over gloo with two learner ranks, QLoRA (an NF4 base in the learner, bitsandbytes on CPU;
    the engines keep full weights), and LoRA as the 0.5B runs train it (`benchmarks/run.py against_trl`): on a
    bfloat16 base under autocast (its adapters' inputs left uncast, `policy.py`), with compiled decoder layers
    (`learner.compile`, inductor in the Ray Train worker) and the freed memory kept between updates
    (`learner.release_memory=false`); the LoRA ones with adapter-only sync. Real steps, new weights, and a resume
    from their checkpoint (DeepSpeed's own optimizer shards, or the adapter). Plain LoRA runs the path these share
    (and trains in test_use_trained.py); compiled and bfloat16 LoRA were two cases, four runs, where one case shows
    both (a run's start is most of its cost; compiled layers on a float32 base: tests/unit/test_learner_compile.py).
    One step, then a resume to two: the fewest that show a step, a checkpoint and a resume from it. The compiled
    case stops after its step: its adapter resumes as QLoRA's does (a resume is not compiled differently), and its
    checkpoint must carry PEFT's own names, which the step's checkpoint shows without a second run start."""
    overrides = [*SMALL, *variant, f"run.output_dir={tmp_path}", "run.name=v", "run.checkpoint_every=0"]
    cfg = load_config(None, [*overrides, "run.steps=1"])
    metrics = train(cfg)
    assert metrics["samples"] == 1 * 4 * 4
    assert (cfg.run_dir / "checkpoint_000001").is_dir()
    if "learner.compile=true" in variant:  # the others leave it "auto": off below 200M parameters
        adapter = load_file(str(cfg.run_dir / "checkpoint_000001" / "adapter" / "adapter_model.safetensors"))
        # Compiled in place: PEFT's own names (a wrapped module would add `_orig_mod.`), A and B for each of the
        # seven projections of every layer, and B trained away from its zero start.
        peft_name = re.compile(r"base_model\.model\.model\.layers\.\d+\.(self_attn|mlp)\.\w+_proj\.lora_[AB]\.weight")
        assert all(peft_name.fullmatch(k) for k in adapter), sorted(adapter)
        layers = json.loads((Path(builtin_model_path) / "config.json").read_text())["num_hidden_layers"]
        assert len(adapter) == 2 * len(cfg.learner.lora.target_modules) * layers, sorted(adapter)
        assert any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in adapter.items())
        return
    resumed = train(load_config(None, [*overrides, "run.steps=2", "run.resume=true"]))
    assert resumed["samples"] == 2 * 4 * 4  # counted on from the checkpoint of step 1
    assert [r["step"] for r in _records(cfg.run_dir)] == [0, 1, 2]
    assert all(torch.isfinite(torch.tensor(r.get("loss/policy_loss", 0.0))) for r in _records(cfg.run_dir))
    ckpt = cfg.run_dir / "checkpoint_000002"
    if cfg.learner.lora.enabled:
        adapter = load_file(str(ckpt / "adapter" / "adapter_model.safetensors"))
        assert adapter and any(k.endswith("lora_B.weight") and v.abs().sum() > 0 for k, v in adapter.items())
    else:
        base = _weights(Path(builtin_model_path))
        new = _weights(ckpt / "model")
        assert sum(not torch.equal(base[k], new[k]) for k in new if k in base) > len(new) // 2


@pytest.mark.long
def test_overlapped_rollout_trains_one_version_behind_and_resumes_bit_identical(
    local_ray, builtin_model_path, tmp_path
):
    """sync.max_staleness=1: step t+1's batch is generated while the learner trains on step t, so it was sampled by
    the weights one version behind the learner's (the first step's by the current ones). An evaluation mid-run
    (eval_every=2) must wait for the batch in flight, then run on the newest weights. The learner runs with bf16
    autocast (learner.bf16) and must still produce finite losses and new float32 weights.
    Then a crash tears the last checkpoint and the metrics' last line: the resume from checkpoint 3 must end with the
    very weights of the uninterrupted run, because step 4's batch, sampled by version 3 while step 3 trained, is
    carried by checkpoint 3 (learner/resume_state.py), where a re-sample would use version 4 and give another run."""
    overrides = [*SMALL, "sync.max_staleness=1", "learner.bf16=true"]
    overrides += [f"run.output_dir={tmp_path}", "run.name=o", "run.eval_every=2", "run.steps=4"]
    cfg = load_config(None, overrides)
    metrics = train(cfg)
    assert metrics["samples"] == 4 * 4 * 4
    records = _records(cfg.run_dir)
    assert [r["step"] for r in records] == [0, 1, 2, 3, 4]
    assert [r["rollout/staleness"] for r in records[1:]] == [0.0, 1.0, 1.0, 1.0]
    assert ["eval/success" in r for r in records] == [True, False, True, False, True]
    assert all(torch.isfinite(torch.tensor(r["loss/policy_loss"])) for r in records[1:])
    assert all(r["time/rollout_worker_s"] > 0 for r in records[1:])
    assert all(r["rollout/groups_sampled"] == 4 for r in records[1:])  # dynamic sampling off: every group kept
    base = _weights(Path(builtin_model_path))
    # Copies: load_file maps the file, which the crash below cuts short.
    final = {k: v.clone() for k, v in _weights(cfg.run_dir / "checkpoint_000004" / "model").items()}
    assert sum(not torch.equal(base[k], final[k]) for k in final if k in base) > len(final) // 2
    assert all(v.dtype == torch.float32 for v in final.values())

    # What a driver killed while writing checkpoint 4 leaves: its weights cut short, metrics.jsonl in half a line.
    _cut(cfg.run_dir / "checkpoint_000004" / "model" / "model.safetensors", keep=0.01)
    with (cfg.run_dir / "metrics.jsonl").open("a") as f:
        f.write('{"step": 9, "rew')
    train(load_config(None, [*overrides, "run.resume=true"]))
    resumed = [r for r in _records(cfg.run_dir) if "time/step_s" in r]
    assert [r["step"] for r in resumed] == [1, 2, 3, 4]  # step 4 redone once, the torn line dropped
    assert [r["reward/mean"] for r in resumed] == [r["reward/mean"] for r in records[1:]]
    again = _weights(cfg.run_dir / "checkpoint_000004" / "model")
    assert all(torch.equal(again[k], final[k]) for k in final), "the resumed overlapped run differs"
