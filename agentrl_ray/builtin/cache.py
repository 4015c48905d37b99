"""A model folder built once per machine in the cache: in a temporary folder beside the target, renamed into place
under a lock, so that a second process (another xdist worker, another run's driver) waits and then finds it built,
and a build cut short never leaves a half-written folder where a model is expected."""

from __future__ import annotations

import fcntl
import os
import shutil
import tempfile
from collections.abc import Callable
from pathlib import Path

SHIPPED = Path(__file__).parent / "weights"  # built models shipped as package data (pyproject.toml)


def default_cache_root() -> Path:
    """Where models are built and converted once per machine: $AGENTRL_CACHE, else ~/.cache/agentrl_ray."""
    return Path(os.environ.get("AGENTRL_CACHE") or Path.home() / ".cache" / "agentrl_ray").expanduser()


def build_once(target: Path, build: Callable[[Path], object], *, force: bool = False) -> Path:
    """`target`, built by `build(tmp_folder)` unless it holds a `config.json` already (`force`: build it again)."""
    if (target / "config.json").is_file() and not force:
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f"{target.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # a second process waits here, then finds the folder built
        if (target / "config.json").is_file() and not force:
            return target
        tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
        try:
            build(tmp)
            tmp.chmod(0o755)  # mkdtemp's 0700 would hide the model from processes of other users (the sandbox)
            if target.exists():
                shutil.rmtree(target)
            tmp.rename(target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target
