"""Hugging Face Hub model ids in `model.path` ("Qwen/Qwen2.5-0.5B-Instruct", or "org/name@revision").

The driver resolves the id once, through the Hugging Face cache (`huggingface_hub.snapshot_download`), to one
commit and its snapshot folder (`<HF_HUB_CACHE>/models--org--name/snapshots/<commit>`); every actor receives that
folder, so every node trains and samples the same snapshot even if the branch moves during the run. Nodes whose
cache lacks it download that exact commit (`cluster.ensure_model_on_nodes`). With `HF_HUB_OFFLINE=1` nothing is
downloaded: the id must already be in the cache (`huggingface-cli download org/name` on a machine with access, or a
cache folder copied over), else a clear error.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from pathlib import Path

from agentrl_ray.config import ConfigError

_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.\-]*/[\w.\-]+(@[\w.\-/]+)?$")


@dataclass(frozen=True)
class Snapshot:
    repo_id: str
    commit: str
    path: str  # the snapshot folder on the driver's node


def is_hub_id(path: str) -> bool:
    """`org/name[@revision]` that is not an existing local folder."""
    return bool(_HUB_ID.match(path)) and not Path(path).expanduser().exists()


def offline() -> bool:
    # Read at call time (huggingface_hub reads it once at import, which may be before a test or a user sets it).
    return os.environ.get("HF_HUB_OFFLINE", "").lower() in ("1", "true", "yes", "on")


def resolve(model_id: str) -> Snapshot:
    """`org/name[@revision]` → the cached (or freshly downloaded) snapshot of one commit."""
    repo_id, _, revision = model_id.partition("@")
    folder = Path(_download(repo_id, revision or None, model_id))
    if not (folder / "config.json").is_file():
        raise ConfigError(f"model.path {model_id!r}: snapshot {folder} has no config.json (not a transformers model)")
    return Snapshot(repo_id=repo_id, commit=folder.name, path=str(folder))


def fetch_commit(repo_id: str, commit: str) -> str:
    """On another node: the same commit's snapshot folder there (downloaded if its cache lacks it)."""
    return _download(repo_id, commit, f"{repo_id}@{commit}")


def _download(repo_id: str, revision: str | None, label: str) -> str:
    from huggingface_hub import snapshot_download
    from huggingface_hub.errors import HfHubHTTPError, LocalEntryNotFoundError

    cache = os.environ.get("HF_HUB_CACHE")
    try:
        return snapshot_download(repo_id, revision=revision, cache_dir=cache, local_files_only=offline())
    except LocalEntryNotFoundError as exc:
        where = cache or "the default Hugging Face cache (~/.cache/huggingface/hub)"
        how = "HF_HUB_OFFLINE=1 forbids downloading" if offline() else "the Hub could not be reached"
        raise ConfigError(
            f"model.path {label!r}: not in {where} and {how}. Download it where the Hub is reachable "
            f"(`huggingface-cli download {repo_id}`) and copy the cache folder, or give a local model folder"
        ) from exc
    except HfHubHTTPError as exc:
        raise ConfigError(f"model.path {label!r}: the Hugging Face Hub refused it ({exc})") from exc
