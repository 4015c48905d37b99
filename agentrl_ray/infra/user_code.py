"""Where a config's import paths (`env.name`, `env.agent`, `env.tools`, `reward.functions`) find the user's modules:
the working directory and the config file's folder, as Python itself would find them.

`python script.py` puts the script's folder first on `sys.path` and `python -m` the working directory; a console
script (`agentrl-ray`, installed into a venv's bin folder) gets its bin folder instead, so without this
`env.agent: examples.openai_agent.agent:run` fails from the repository root with "No module named 'examples'".

The same folders must reach every process that imports user code: the env hosts, the rollout workers (agent
programs), the learner workers (reward functions run beside the rollout). A local Ray's workers inherit the driver's
environment, and a joined cluster's get the job's `runtime_env`: both through `PYTHONPATH`, which `init_ray` passes
on. On a cluster the folders are the driver's; a `ray job submit --working-dir .` job runs in its working dir, which
Ray puts on every worker's path itself, so the same relative import paths resolve there too.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path


def user_code_paths(config_path: str | os.PathLike | None) -> list[str]:
    """The working directory, then the config file's folder (when given and different)."""
    paths = [os.getcwd()]
    if config_path:
        folder = str(Path(config_path).expanduser().resolve().parent)
        if folder not in paths:
            paths.append(folder)
    return paths


def add_user_code_paths(config_path: str | os.PathLike | None = None) -> list[str]:
    """Put the user's folders on this process's `sys.path` (first, as `python -m` does) and on `PYTHONPATH`, which
    the processes this one starts inherit. Returns the folders added; idempotent."""
    paths = user_code_paths(config_path)
    sys.path[:0] = [p for p in paths if p not in sys.path]
    current = [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    os.environ["PYTHONPATH"] = os.pathsep.join([*[p for p in paths if p not in current], *current])
    return paths
