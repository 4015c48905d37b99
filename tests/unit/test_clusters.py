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


AWS = Path(__file__).resolve().parents[2] / "clusters" / "aws.yaml"
IAM = AWS.parent / "aws" / "iam"


def _aws():
    return yaml.safe_load(AWS.read_text())


def test_aws_nodes_never_fall_back_to_rays_permissive_defaults():
    """Without SecurityGroupIds Ray creates a group with SSH from 0.0.0.0/0; without IamInstanceProfile it attaches
    EC2FullAccess + S3FullAccess; without ImageId it picks its own AMI. Every node type sets all three."""
    config = _aws()
    assert "0.0.0.0/0" not in AWS.read_text().split("\nauth:")[1]  # only the comments above may mention it
    assert "security_group" not in config["provider"]
    profiles = {}
    for name, node in config["available_node_types"].items():
        nc = node["node_config"]
        assert nc["SecurityGroupIds"] == ["sg-CREATED-BY-SETUP-SH"], name
        assert nc["ImageId"] == "ami-PINNED-BY-SETUP-SH", name  # pinned by setup.sh, never "" or latest_dlami
        assert nc["MetadataOptions"]["HttpTokens"] == "required", name  # IMDSv2 only
        assert nc["MetadataOptions"]["HttpPutResponseHopLimit"] == 1, name
        assert all(d["Ebs"]["Encrypted"] for d in nc["BlockDeviceMappings"]), name
        profiles[name] = nc["IamInstanceProfile"]["Name"]
    assert profiles == {"head_gpu": "agentrl-ray-head", "worker_gpu": "agentrl-ray-worker"}


def test_aws_workers_are_up_when_a_run_starts():
    worker = _aws()["available_node_types"]["worker_gpu"]
    assert worker["min_workers"] >= 1 and worker["max_workers"] >= worker["min_workers"]
    assert "run.storage_path=s3://" in AWS.read_text()  # the documented job writes to shared storage


@pytest.mark.parametrize("path", CLUSTERS, ids=[p.name for p in CLUSTERS])
def test_nodes_share_the_ray_token_and_require_it(path):
    """Ray 2.60's `ray start --head` alone leaves token auth off: every node gets the client's token and starts
    with RAY_AUTH_MODE=token."""
    config = yaml.safe_load(path.read_text())
    assert [k for k, v in config["file_mounts"].items() if v == "~/.ray/auth_token"] != []
    for key in ("head_start_ray_commands", "worker_start_ray_commands"):
        start = [c for c in config[key] if "ray start" in c]
        assert start and all("RAY_AUTH_MODE=token" in c for c in start), key


def _statements(name: str) -> list[dict]:
    import json

    return json.loads((IAM / name).read_text())["Statement"]


def test_instance_policies_are_least_privilege():
    def listed(value):
        return value if isinstance(value, list) else [value]

    bucket = _statements("checkpoint-bucket.json")
    for s in bucket:
        assert all(a.startswith("s3:") and "*" not in a for a in listed(s["Action"])), s
        allowed = ("arn:aws:s3:::${BUCKET}", "arn:aws:s3:::${BUCKET}/agentrl-ray/*")  # the bucket, the run prefix
        assert all(r in allowed for r in listed(s["Resource"])), s
    head = _statements("head-autoscaler.json")
    for s in head:
        actions = listed(s["Action"])
        assert all("*" not in a for a in actions), s  # no wildcard actions anywhere
        if listed(s["Resource"]) == ["*"]:
            assert all(a.startswith("ec2:Describe") for a in actions), s  # unscoped resources: read-only only
        if any(a in ("ec2:TerminateInstances", "ec2:StopInstances") for a in actions):
            assert s["Condition"]["StringEquals"]["ec2:ResourceTag/ray-cluster-name"] == "agentrl-ray"
        if "iam:PassRole" in actions:
            assert listed(s["Resource"]) == ["arn:aws:iam::${ACCOUNT_ID}:role/agentrl-ray-worker"]
    assert not any("s3:" in a for s in head for a in listed(s["Action"]))  # S3 only through the bucket policy


def test_aws_setup_refuses_ssh_from_everywhere(tmp_path):
    import subprocess

    setup = AWS.parent / "aws" / "setup.sh"
    out = subprocess.run(["bash", str(setup), "0.0.0.0/0", "bucket"], capture_output=True, text=True, cwd=tmp_path)
    assert out.returncode == 2 and "refusing SSH from the whole internet" in out.stderr
    text = setup.read_text()
    for placeholder in ("ami-PINNED-BY-SETUP-SH", "sg-CREATED-BY-SETUP-SH"):
        assert placeholder in text  # setup.sh fills in every placeholder of aws.yaml
