"""Every shipped cluster file passes Ray's own cluster-config schema (what `ray up` checks before it starts)."""

from pathlib import Path

import pytest
import yaml

CLUSTERS = sorted((Path(__file__).resolve().parents[2] / "clusters").glob("*.yaml"))


@pytest.mark.parametrize("path", CLUSTERS, ids=[p.name for p in CLUSTERS])
def test_cluster_file_is_a_valid_ray_up_config(path):
    from ray.autoscaler._private.util import prepare_config, validate_config

    config = yaml.safe_load(path.read_text())
    validate_config(prepare_config(config))
    head_start = " ".join(config["head_start_ray_commands"])
    assert "--dashboard-host=127.0.0.1" in head_start  # the dashboard and job API are never exposed publicly
    assert "RAY_AUTH_MODE=disabled" not in head_start  # token authentication stays on


def test_there_are_cluster_files():
    assert {p.name for p in CLUSTERS} >= {"aws.yaml", "local.yaml"}
