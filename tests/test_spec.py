"""Task names, shapes and specs: pure logic, no processes."""

import json

import pytest

from tfmagic.errors import BadClusterShape, BadTaskName, UnknownTask
from tfmagic.spec import ClusterDef, ClusterShape, TaskName

pytestmark = pytest.mark.unit


@pytest.mark.parametrize(
    "text, job, index",
    [
        ("worker:1", "worker", 1),
        (" ps:0 ", "ps", 0),
        ("/job:worker/task:1", "worker", 1),
        ("/job:worker/replica:0/task:3", "worker", 3),
        ("/job:ps/replica:0/task:0/device:CPU:0", "ps", 0),
        ("chief:0", "chief", 0),
    ],
)
def test_parse_accepts_both_spellings(text, job, index):
    assert TaskName.parse(text) == TaskName(job, index)


@pytest.mark.parametrize(
    "text", ["worker", "worker:", "worker:-1", "worker:x", "1:worker", "/job:worker", "", "worker 1"]
)
def test_parse_rejects_malformed_names_with_a_hint(text):
    with pytest.raises(BadTaskName, match="worker:1"):
        TaskName.parse(text)


def test_device_and_slug():
    t = TaskName.parse("worker:1")
    assert t.device == "/job:worker/replica:0/task:1"
    assert t.slug == "worker-1"
    assert str(t) == "worker:1"


@pytest.mark.parametrize(
    "kwargs, message",
    [
        ({"workers": 0}, "at least 1 workers"),
        ({"workers": -1}, "too small"),
        ({"ps": -2}, "too small"),
        ({"workers": 1.5}, "whole number"),
        ({"workers": "2"}, "whole number"),
        ({"ps": True}, "whole number"),
    ],
)
def test_shape_rejects_bad_counts(kwargs, message):
    with pytest.raises(BadClusterShape, match=message):
        ClusterShape(**kwargs)


def test_shape_allows_worker_only_cluster_and_orders_tasks():
    assert ClusterShape(ps=0, workers=2).tasks() == [TaskName("worker", 0), TaskName("worker", 1)]
    assert [str(t) for t in ClusterShape(ps=2, workers=1).tasks()] == ["ps:0", "ps:1", "worker:0"]
    assert ClusterShape(ps=1, workers=2).describe() == "1 ps, 2 workers"


def test_cluster_def_checks_tasks_and_builds_tf_config():
    d = ClusterDef.from_mapping({"worker": ["h:2", "h:3"], "ps": ["h:1"]})
    assert list(d.jobs) == ["ps", "worker"]
    assert d.address("worker:1") == "h:3"
    assert "worker:1" in d and "worker:2" not in d and "nonsense" not in d
    with pytest.raises(UnknownTask, match="worker:0..worker:1"):
        d.check("worker:9")
    cfg = d.tf_config("/job:worker/task:1")
    assert cfg == {
        "cluster": {"ps": ["h:1"], "worker": ["h:2", "h:3"]},
        "task": {"type": "worker", "index": 1},
    }
    assert d.shape() == ClusterShape(ps=1, workers=2)


def test_cluster_def_reads_tf_config_and_sparse_dicts():
    tf_config = json.dumps(
        {"cluster": {"worker": {"0": "a:1", "1": "a:2"}}, "task": {"type": "worker", "index": 0}}
    )
    assert ClusterDef.from_json(tf_config).as_dict() == {"worker": ["a:1", "a:2"]}
    with pytest.raises(BadClusterShape):
        ClusterDef.from_mapping({"worker": {0: "a:1", 2: "a:3"}})


def test_memory_budget_parsing():
    from tfmagic.pool import parse_bytes

    assert parse_bytes("1.5GB") == int(1.5 * 2**30)
    assert parse_bytes("800MB") == 800 * 2**20
    assert parse_bytes("2g") == 2 * 2**30
    assert parse_bytes(0) == 0 and parse_bytes("off") == 0 and parse_bytes(None) == 0
    assert parse_bytes("auto") == "auto"
    with pytest.raises(ValueError, match="not a memory size"):
        parse_bytes("lots")
    with pytest.raises(ValueError, match="negative"):
        parse_bytes(-1)
