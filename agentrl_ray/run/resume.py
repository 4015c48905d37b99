"""Make a run directory resumable after a crash: a torn metrics line, a torn or corrupt Ray Train checkpoint
snapshot, or a latest checkpoint whose files are incomplete never end in a traceback.

`driver.check_run_dir` runs these before Ray starts, only with `run.resume=true` (`repair_metrics` on the output
folder, `prepare` on the checkpoint folder when it is local; cloud storage is left to Ray Train):
1. `metrics.jsonl` (`repair_metrics`): a torn last line (the process died mid-write) is cut off with a warning; a
   corrupt line before the last is an error naming its line number (that is not a crash, someone edited the file).
2. `checkpoint_manager_snapshot.json` (Ray Train's record of its checkpoints): when it parses and the checkpoint it
   names as latest verifies (`verify_checkpoint`), Ray Train resumes as usual and `prepare` returns None.
3. Otherwise the snapshot is moved aside (`*.corrupt-<time>`), so is an unverifiable latest checkpoint folder,
   and `prepare` returns the newest checkpoint folder that verifies: the driver passes it to the learner in its
   loop config (`resume_from`), which loads it when Ray Train has no checkpoint of its own (Ray Train v2 refuses
   `resume_from_checkpoint`). None verifying is a ConfigError that says what was found, unless Ray Train never
   wrote its snapshot: then the run died while writing its first checkpoint, nothing was committed, and the
   resumed run starts from step 0 (what the uninterrupted run did; the torn folder is moved aside).
"""

from __future__ import annotations

import json
import logging
import re
import time
from pathlib import Path

from agentrl_ray.config import ConfigError

log = logging.getLogger(__name__)
SNAPSHOT = "checkpoint_manager_snapshot.json"
TRAINER_STATE = "trainer_state.pt"  # learner/policy.py writes it; not imported from there (that pulls in torch models)
_CHECKPOINT_DIR = re.compile(r"^checkpoint_\d+$")


def prepare(run_dir: Path) -> Path | None:
    """`run_dir` is the run's checkpoint folder (`run.storage_path`/name, local). Returns a checkpoint folder to
    resume from explicitly, or None when Ray Train's own snapshot is sound (see the module docstring)."""
    snapshot = run_dir / SNAPSHOT
    committed = snapshot.exists()  # Ray Train writes it once a checkpoint is complete
    try:
        latest = json.loads(snapshot.read_text())["latest_checkpoint_result"]["checkpoint_dir_name"]
    except (OSError, ValueError, KeyError, TypeError) as e:
        log.warning("resume: %s is unreadable (%s: %s); falling back to the newest checkpoint that verifies",
                    snapshot, type(e).__name__, e)  # fmt: skip
    else:
        problem = verify_checkpoint(run_dir / latest)
        if problem is None:
            return None
        log.warning(
            "resume: the latest checkpoint %s is unusable (%s); falling back to an earlier one", latest, problem
        )
        _move_aside(run_dir / latest)
    _move_aside(snapshot)
    return newest_verified(run_dir, committed)


def newest_verified(run_dir: Path, committed: bool = True) -> Path | None:
    """The checkpoint folder with the highest step that verifies; moves the ones that do not aside. None when none
    verifies and none was ever `committed` (no snapshot): the run starts from step 0."""
    found = []
    for folder in sorted((p for p in run_dir.iterdir() if _CHECKPOINT_DIR.match(p.name)), reverse=True):
        problem = verify_checkpoint(folder)
        if problem is None:
            log.warning("resume: resuming from %s", folder)
            return folder
        found.append(f"{folder.name}: {problem}")
        _move_aside(folder)
    if not committed:
        log.warning(
            "resume: no checkpoint of %s was ever completed (%s): the run died while writing its first one; "
            "starting from step 0",
            run_dir,
            "; ".join(found) or "no checkpoint_* folders",
        )
        return None
    raise ConfigError(
        f"run.resume=true but no checkpoint in {run_dir} can be loaded ("
        + ("; ".join(found) or "no checkpoint_* folders")
        + "): start a new run (another run.name) instead"
    )


def verify_checkpoint(folder: Path) -> str | None:
    """None when `folder` holds a loadable trainer state and readable weights, else what is wrong."""
    import torch
    from safetensors.torch import load_file

    if not folder.is_dir():
        return "missing"
    try:
        state = torch.load(folder / TRAINER_STATE, map_location="cpu", weights_only=True)
    except Exception as e:  # truncated zip, unpickling refused (not weights only), missing file
        return f"{TRAINER_STATE} does not load ({type(e).__name__}: {_first_line(e)})"
    if not isinstance(state, dict) or not isinstance(state.get("step"), int):
        return f"{TRAINER_STATE} has no step"
    weights = sorted((folder / "model").glob("*.safetensors")) + sorted((folder / "adapter").glob("*.safetensors"))
    if not weights and not (folder / "deepspeed").is_dir():
        return "no weights (model/*.safetensors, adapter/*.safetensors or deepspeed/)"
    for path in weights:
        try:
            load_file(str(path))  # reads every tensor: a truncated file fails here
        except Exception as e:
            return f"{path.relative_to(folder)} is unreadable ({type(e).__name__}: {_first_line(e)})"
    return None


def repair_metrics(path: Path) -> None:
    """Cut a torn last line of `metrics.jsonl` (with a warning); a corrupt earlier line is an error."""
    if not path.exists():
        return
    data = path.read_bytes()
    lines = data.split(b"\n")
    complete, tail = lines[:-1], lines[-1]  # `tail` is what follows the last newline: b"" unless torn
    for n, line in enumerate(complete, 1):
        if line.strip() and not _parses(line):
            if n == len(complete) and not tail:  # the last line, newline written but content torn
                tail, complete = line, complete[:-1]
                break
            raise ConfigError(f"{path}:{n} is not valid JSON, and it is not the last line: fix or remove it")
    if tail:
        log.warning("resume: %s ends with a torn line (%d bytes, %r...); cutting it off", path, len(tail), tail[:60])
        from agentrl_ray.run.outputs import atomic_write_bytes

        atomic_write_bytes(path, b"".join(line + b"\n" for line in complete))


def _parses(line: bytes) -> bool:
    try:
        return isinstance(json.loads(line), dict)
    except ValueError:
        return False


def _move_aside(path: Path) -> None:
    if path.exists():
        target = path.with_name(f"{path.name}.corrupt-{int(time.time())}")
        path.rename(target)
        log.warning("resume: moved %s aside to %s", path.name, target.name)


def _first_line(e: Exception) -> str:
    return (str(e).strip().splitlines() or [""])[0][:200]
