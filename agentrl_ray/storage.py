"""Where a run's outputs live.

- `run.output_dir`/name: the driver-side folder the user looks in: config, metrics.jsonl, plots, summary. Written on
  the driver's node only (learner rank 0 sends its records there, `outputs.MetricsLog` runs as an actor pinned to
  the driver's node), wherever rank 0 lands.
- `run.storage_path`/name: checkpoints, through Ray Train's storage layer (pyarrow filesystems): a local path, a
  shared filesystem, or a cloud URI (`s3://bucket/prefix`, `gs://...`). Empty: the output folder.

A relative path resolves against the working directory, except inside a submitted Ray job (`ray job submit
--working-dir .`), whose working directory is a temporary copy in Ray's session folder
(`.../runtime_resources/working_dir_files/_ray_pkg_<hash>/`), gone with the session: there relative paths resolve
against `$AGENTRL_HOME`, or the home folder of the user the job runs as.

A local storage path used by learner ranks on other nodes must be the same folder on every node (a shared
filesystem): the driver checks that each of those nodes sees a marker file it wrote, and refuses to start otherwise.
"""

from __future__ import annotations

import logging
import os
import uuid
from pathlib import Path

log = logging.getLogger("agentrl_ray")
JOB_DIR_MARK = os.sep + "runtime_resources" + os.sep + "working_dir_files" + os.sep


def is_uri(path: str) -> bool:
    return "://" in path


def in_job_working_dir(cwd: str | None = None) -> bool:
    """True inside the temporary working dir Ray gives a submitted job."""
    cwd = cwd or os.getcwd()
    return JOB_DIR_MARK in cwd + os.sep or os.path.basename(cwd).startswith("_ray_pkg_")


def stable_base(cwd: str | None = None) -> Path:
    """What relative output paths resolve against: the working directory, or (in a Ray job's temporary working
    dir) $AGENTRL_HOME / the home folder."""
    cwd = cwd or os.getcwd()
    if not in_job_working_dir(cwd):
        return Path(cwd)
    return Path(os.environ.get("AGENTRL_HOME") or Path.home()).expanduser()


def resolve_path(path: str, cwd: str | None = None) -> str:
    """A local path made absolute against `stable_base`; URIs unchanged; empty stays empty."""
    if not path or is_uri(path):
        return path
    p = Path(path).expanduser()
    if p.is_absolute():
        return str(p)
    base = stable_base(cwd)
    if in_job_working_dir(cwd):
        log.warning("relative path %r inside a Ray job's temporary working dir: using %s", path, base / p)
    return str((base / p).resolve())


def checkpoint_root(output_dir: str, storage_path: str) -> str:
    """The Ray Train storage path: where `<run name>/checkpoint_*` go."""
    return storage_path or output_dir


def exists(root: str, relative: str) -> bool:
    """Does `root/relative` exist, for a local path or a cloud URI (through pyarrow's filesystems)."""
    if not is_uri(root):
        return (Path(root) / relative).exists()
    import pyarrow.fs

    fs, base = pyarrow.fs.FileSystem.from_uri(root)
    return fs.get_file_info(f"{base.rstrip('/')}/{relative}").type != pyarrow.fs.FileType.NotFound


def write_marker(root: str) -> Path:
    """A file only this run wrote, to check that other nodes see the same folder."""
    folder = Path(root)
    folder.mkdir(parents=True, exist_ok=True)
    marker = folder / f".agentrl_shared_{uuid.uuid4().hex}"
    marker.write_text("written by the agentrl_ray driver to check that every node sees this folder\n")
    return marker


def unshared_message(root: str, nodes: list[str]) -> str:
    return (
        f"run.storage_path {root!r} is a local folder that node(s) {', '.join(n[:12] for n in nodes)} do not see, "
        "and learner ranks run there: their checkpoints would stay on those nodes. Several nodes need storage that "
        "every node sees: a shared filesystem mounted at the same path, or a cloud URI (run.storage_path=s3://... or "
        "gs://...)"
    )
