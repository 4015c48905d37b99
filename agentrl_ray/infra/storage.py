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

Several nodes without shared storage are refused before anything starts. "Shared" is decided per path, not
declared: a cloud URI is shared by construction; a local folder is shared with a node when that node sees a marker
file (a fresh random name) that the driver has just written there. The driver checks (`cluster.check_nodes_see`):
- the storage path on every node that runs a learner rank other than the driver's own (rank 0 writes the
  checkpoints there, through Ray Train, from whatever node it lands on);
- a local model folder (builtin or a path; Hub ids have their own check) on every node that runs an engine or a
  learner rank, each of which loads it.
Nodes that all run on the driver's node need nothing shared. The same machine's raylets share its filesystem, so
the check passes there; tests/ray/test_placement_cluster.py runs the driver in a private mount namespace (its own
tmpfs over the storage folder) to see a refusal on a real cluster.
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


def paths_to_check(
    root: str, model_folder: str | None, driver_node: str, learner_nodes: list[str], engine_nodes: list[str]
) -> dict[str, list[str]]:
    """Which local folders each node other than the driver's must see: `root` (checkpoints) where learner ranks
    run, `model_folder` where learner ranks or engines run. Cloud URIs and `model_folder=None` (a Hub model,
    checked on its own) need nothing."""
    need: dict[str, list[str]] = {}
    if not is_uri(root):
        for node in learner_nodes:
            need.setdefault(node, []).append(root)
    if model_folder:
        for node in [*learner_nodes, *engine_nodes]:
            if model_folder not in need.setdefault(node, []):
                need[node].append(model_folder)
    need.pop(driver_node, None)
    return {node: paths for node, paths in sorted(need.items()) if paths}


def blind_message(root: str, model_folder: str | None, blind: dict[str, list[str]]) -> str | None:
    """The refusal for the folders some nodes did not see (`blind`: node → folders), or None when all were seen."""
    storage = sorted(n for n, paths in blind.items() if root in paths)
    model = sorted(n for n, paths in blind.items() if model_folder and model_folder in paths)
    parts = []
    if storage:
        parts.append(unshared_message(root, storage))
    if model:
        parts.append(
            f"the model folder {model_folder!r} is not on node(s) {', '.join(n[:12] for n in model)}, where engines "
            "or learner ranks load it: put it on a filesystem every node mounts at the same path, or use a Hub id "
            "(model.path=org/name), which every node fetches at the same commit"
        )
    return "; ".join(parts) or None


def unshared_message(root: str, nodes: list[str]) -> str:
    return (
        f"run.storage_path {root!r} is a local folder that node(s) {', '.join(n[:12] for n in nodes)} do not see, "
        "and learner ranks run there: their checkpoints would stay on those nodes. Several nodes need storage that "
        "every node sees: a shared filesystem mounted at the same path, or a cloud URI (run.storage_path=s3://... or "
        "gs://...)"
    )
