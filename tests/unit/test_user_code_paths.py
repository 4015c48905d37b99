"""User modules named in a config resolve as Python resolves them: from the working directory and from the config
file's folder, when `agentrl-ray` runs as the installed console script (its bin folder is `sys.path[0]`, not the
working directory) with no PYTHONPATH. Each case fails in the preflight, before Ray starts, on purpose: the error
shows that the module was found and imported (its own exception or a missing attribute, never "No module named").
The whole run from a fresh copy is tests/ray/test_user_commands.py."""

import os
import shutil
import subprocess
import sys
from pathlib import Path

from agentrl_ray.infra.user_code import add_user_code_paths, user_code_paths

ROOT = Path(__file__).resolve().parents[2]
SCRIPT = Path(sys.executable).parent / "agentrl-ray"


def as_a_user(*args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    return subprocess.run([str(SCRIPT), *args], capture_output=True, text=True, cwd=cwd, env=env, timeout=120)


def test_the_example_agent_resolves_from_a_copy_of_the_repository_root(tmp_path):
    shutil.copytree(ROOT / "examples", tmp_path / "examples")
    res = as_a_user(
        "train",
        "examples/openai_agent/config.yaml",
        "env.agent=examples.openai_agent.agent:no_such_function",
        f"run.output_dir={tmp_path / 'runs'}",
        cwd=tmp_path,
    )
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "No module named" not in res.stderr, res.stderr
    assert "has no attribute 'no_such_function'" in res.stderr, res.stderr  # examples.openai_agent.agent imported


def test_a_module_beside_the_config_resolves_from_another_directory(tmp_path):
    project, elsewhere = tmp_path / "project", tmp_path / "elsewhere"
    project.mkdir()
    elsewhere.mkdir()
    (project / "my_env.py").write_text("raise RuntimeError('my_env was imported')\n")
    (project / "config.yaml").write_text("model:\n  path: builtin:tiny\nenv:\n  name: my_env:MyEnv\n")
    res = as_a_user("train", str(project / "config.yaml"), f"run.output_dir={tmp_path / 'runs'}", cwd=elsewhere)
    assert res.returncode == 2, (res.stdout, res.stderr)
    assert "env.name: RuntimeError: my_env was imported" in res.stderr, res.stderr


def test_the_paths_go_first_on_sys_path_and_on_pythonpath_once(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("PYTHONPATH", "/somewhere")
    monkeypatch.setattr(sys, "path", list(sys.path))
    config = tmp_path / "sub" / "config.yaml"
    assert user_code_paths(config) == [str(tmp_path), str(tmp_path / "sub")]
    assert user_code_paths(tmp_path / "config.yaml") == [str(tmp_path)]
    add_user_code_paths(config)
    add_user_code_paths(config)
    assert sys.path[:2] == [str(tmp_path), str(tmp_path / "sub")] and sys.path.count(str(tmp_path)) == 1
    assert os.environ["PYTHONPATH"].split(os.pathsep) == [str(tmp_path), str(tmp_path / "sub"), "/somewhere"]
