"""Which folders the nodes of a plan must share with the driver, and the refusal when they do not (storage.py);
the real-cluster refusal is tests/ray/test_placement_cluster.py::test_multi_node_without_shared_storage_is_refused."""

from agentrl_ray.infra.storage import blind_message, paths_to_check

ROOT, MODEL = "/data/runs", "/models/m"


def test_everything_on_the_driver_node_needs_nothing_shared():
    assert paths_to_check(ROOT, MODEL, "head", ["head"], ["head"]) == {}


def test_learner_nodes_need_the_storage_and_engine_nodes_the_model():
    need = paths_to_check(ROOT, MODEL, "head", ["a", "b"], ["c", "a"])
    assert need == {"a": [ROOT, MODEL], "b": [ROOT, MODEL], "c": [MODEL]}


def test_cloud_storage_and_hub_models_need_no_shared_folder():
    assert paths_to_check("s3://bucket/runs", None, "head", ["a"], ["c"]) == {}
    assert paths_to_check("gs://bucket/runs", MODEL, "head", ["a"], []) == {"a": [MODEL]}


def test_refusal_names_the_nodes_and_the_ways_out():
    assert blind_message(ROOT, MODEL, {}) is None
    message = blind_message(ROOT, MODEL, {"node_aaaaaaaaaaaa_x": [ROOT], "node_cccccccccccc_y": [MODEL]})
    assert "run.storage_path '/data/runs'" in message and "node_aaaaaaa" in message
    assert "s3://" in message and "shared filesystem" in message
    assert "model folder '/models/m'" in message and "node_ccccccc" in message and "Hub id" in message
    assert "node_cccc" not in message.split(";")[0]  # the storage refusal names only the storage's blind node
