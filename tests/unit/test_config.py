"""Config: layering, dotted overrides, clear errors at parse time, and every shipped config parses."""

from pathlib import Path

import pytest

from agentrl_ray.config import ConfigError, parse_overrides
from agentrl_ray.infra.profiles import Hardware, load_config, profile_preset, resolve_profile
from agentrl_ray.infra.threads import ThreadPolicy, default_threads

ROOT = Path(__file__).resolve().parents[2]
SHIPPED = sorted(ROOT.glob("examples/**/*.yaml"))


def test_some_configs_are_shipped():
    assert any(p.parent.name == "calculator" for p in SHIPPED)


@pytest.mark.parametrize("path", SHIPPED, ids=lambda p: str(p.relative_to(ROOT)))
def test_every_shipped_config_parses(path):
    cfg = load_config(path, ["profile=cpu"])
    assert cfg.profile == "cpu"
    assert cfg.rollout.group_size >= 2


def test_overrides_win_over_yaml_and_profile(tmp_path):
    f = tmp_path / "c.yaml"
    f.write_text("learner:\n  lr: 0.5\nrollout:\n  group_size: 4\n")
    cfg = load_config(f, ["learner.lr=1e-6", "profile=lora", "learner.lora.r=4"])
    assert cfg.learner.lr == 1e-6
    assert cfg.rollout.group_size == 4
    assert cfg.learner.lora.enabled  # from the lora profile preset
    assert cfg.learner.lora.r == 4


def test_override_values_are_typed():
    assert parse_overrides(["a.b=3", "a.c=true", "d=[1, 2]", "e=text"]) == {
        "a": {"b": 3, "c": True},
        "d": [1, 2],
        "e": "text",
    }


@pytest.mark.parametrize(
    "overrides, message",
    [
        (["learner.lrr=1"], "unknown config key(s): learner.lrr"),
        (["nonsense=1"], "unknown config key(s): nonsense"),
        (["rollout.group_size=one"], "rollout.group_size: expected an integer"),
        (["rollout.group_size=1"], "group_size must be at least 2"),
        (["algorithm.loss_aggregation=mean"], "algorithm.loss_aggregation: 'mean' is not one of"),
        (["reward.weights=[1, 2]"], "give one weight per function"),
        (["echo.only=true"], "echo.coeff > 0"),
        (["echo.normalization=selected_tokens"], "echo.normalization"),
        (["algorithm.world_model_coeff=0.1"], "unknown config key"),
        (["learner.lora.enabled=true", "sync.transport=collective"], "adapter-only"),
        (["rollout.max_total_tokens=10", "rollout.max_tokens_per_turn=48"], "must exceed"),
        (["profile=tpu"], "profile: 'tpu' is not one of"),
        (["learner.lr"], "not of the form"),
        (["env.name=calculator"], "import path"),
        (["sync.max_staleness=2"], "sync.max_staleness=2 needs sync.pipeline=stream"),
        (["sync.max_staleness=-1", "sync.pipeline=stream"], "sync.max_staleness must be >= 0"),
        (["sync.pipeline=stream", "sync.transport=collective"], "it needs sync.transport=object_store"),
        (["sync.pipeline=stream", "placement.mode=colocated"], "it needs them apart"),
        (["model.path=builtin:huge"], "the built-in models are builtin:tiny, builtin:small"),
    ],
)
def test_bad_configs_fail_with_a_clear_message(overrides, message):
    with pytest.raises(ConfigError, match=None) as info:
        load_config(None, ["profile=cpu", *overrides] if not overrides[0].startswith("profile") else overrides)
    assert message in str(info.value)


def test_missing_or_malformed_yaml(tmp_path):
    with pytest.raises(ConfigError, match="does not exist"):
        load_config(tmp_path / "nope.yaml")
    bad = tmp_path / "bad.yaml"
    bad.write_text("learner: [unclosed\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_config(bad)


def test_profiles_from_hardware():
    laptop = Hardware(cpus=2, ram_gib=24, gpus=0)
    ryzen = Hardware(cpus=16, ram_gib=64, gpus=0)
    gpu_box = Hardware(cpus=32, ram_gib=256, gpus=4)
    assert resolve_profile("auto", laptop) == "cpu"
    assert resolve_profile("auto", gpu_box) == "gpu"
    assert resolve_profile("lora", gpu_box) == "lora"
    assert "num_workers" not in profile_preset("cpu", laptop)["rollout"]  # one engine: the default
    assert profile_preset("cpu", ryzen)["rollout"]["num_workers"] == 2
    gpu = profile_preset("gpu", gpu_box)
    # Engine and learner counts come from the Ray cluster's GPUs at start (placement.py), not from this machine.
    assert gpu["learner"]["backend"] == "deepspeed" and gpu["learner"]["num_workers"] == 0
    assert gpu["rollout"]["num_workers"] == 0 and gpu["sync"]["transport"] == "collective"
    assert gpu["rollout"]["max_total_tokens"] >= 4096  # a real tool system prompt alone exceeds 320 tokens


def test_thread_defaults_and_wait_policy(monkeypatch):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    # On-policy the phases alternate: each may use every core; engines (or learner workers) share them.
    assert default_threads("learner", overlapped=False, rollout_workers=1, cores=2) == 2
    assert default_threads("rollout", overlapped=False, rollout_workers=1, cores=2) == 2
    assert default_threads("rollout", overlapped=False, rollout_workers=2, cores=8) == 4
    assert default_threads("learner", overlapped=False, rollout_workers=1, learner_workers=2, cores=8) == 4
    # Overlapped: the learner keeps every core, the engines share half of them, never 0 threads.
    assert default_threads("learner", overlapped=True, rollout_workers=1, cores=2) == 2
    assert default_threads("rollout", overlapped=True, rollout_workers=1, cores=2) == 1
    assert default_threads("rollout", overlapped=True, rollout_workers=2, cores=16) == 4
    assert default_threads("rollout", overlapped=True, rollout_workers=4, cores=2) == 1
    assert default_threads("learner", overlapped=True, rollout_workers=1, learner_workers=2, cores=2) == 1

    # Oversubscribed cores only when overlapped on CPU: then OpenMP threads must not spin while waiting.
    def env(*overrides):
        return ThreadPolicy.of(load_config(None, list(overrides))).actor_env()

    assert env("profile=cpu", "sync.max_staleness=1")["OMP_WAIT_POLICY"] == "PASSIVE"
    assert "OMP_WAIT_POLICY" not in env("profile=cpu") and "OMP_WAIT_POLICY" not in env("profile=gpu")
    assert env("profile=cpu")["DS_ACCELERATOR"] == "cpu" and "DS_ACCELERATOR" not in env("profile=gpu")
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")  # the user's choice wins
    assert "OMP_WAIT_POLICY" not in env("profile=cpu", "sync.max_staleness=1")


def test_thread_policy_is_resolved_once_from_the_config():
    policy = ThreadPolicy.of(load_config(None, ["profile=cpu", "rollout.num_workers=2", "sync.max_staleness=1"]))
    assert policy.overlapped and not policy.learner_on_gpu and not policy.engines_on_gpu
    assert policy.engine_threads(cores=8) == 2 and policy.learner_worker_threads(cores=8) == 8
    explicit = ThreadPolicy.of(load_config(None, ["profile=cpu", "rollout.num_threads=3", "learner.torch_threads=5"]))
    assert explicit.engine_threads(cores=64) == 3 and explicit.learner_worker_threads(cores=64) == 5
