"""Every notebook in notebooks/ runs top to bottom in a real kernel, and says true things."""

from __future__ import annotations

import os
import re
from pathlib import Path

import nbformat
import pytest
from nbclient import NotebookClient

from .conftest import assert_gone, task_processes

pytestmark = [pytest.mark.notebook, pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[1]
ARTIFACTS = ROOT / "test-artifacts" / "notebooks"


def execute(name: str) -> nbformat.NotebookNode:
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    before = set(task_processes())
    env = dict(os.environ, TFMAGIC_SPARES="0")
    env.pop("PYTEST_CURRENT_TEST", None)
    client = NotebookClient(
        nb,
        timeout=600,
        kernel_name="python3",
        resources={"metadata": {"path": str(ROOT / "notebooks")}},
        store_widget_state=True,
    )
    try:
        client.execute(env=env)
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, ARTIFACTS / name)
    assert_gone(set(task_processes()) - before)
    return nb


def outputs(nb, skip: str | None = None) -> str:
    """The text a reader sees; ``skip`` leaves out cells whose source contains it."""
    text = []
    for cell in nb.cells:
        if skip and skip in cell.get("source", ""):
            continue
        for out in cell.get("outputs", []):
            if out.get("output_type") == "stream":
                text.append(out["text"])
            elif "data" in out:
                text.append(out["data"].get("text/plain", ""))
            elif out.get("output_type") == "error":
                text.append("\n".join(out.get("traceback", [])))
    return "\n".join(text)


def test_01_cluster_basics():
    nb = execute("01_cluster_basics.ipynb")
    text = outputs(nb)
    assert "Cluster c1 started: 1 ps, 2 workers" in text
    assert "w lives on /job:ps/replica:0/task:0" in text
    assert "y computed on /job:worker/replica:0/task:1" in text
    m = re.search(r"w = ([\d.]+), b = ([\d.]+), loss", text)
    assert m and abs(float(m.group(1)) - 2) < 0.01 and abs(float(m.group(2)) - 10) < 0.01, text[-3000:]
    m = re.search(r"TF1 session on grpc://127.0.0.1:\d+ -> w = ([\d.]+), b = ([\d.]+)", text)
    assert m and abs(float(m.group(1)) - 2) < 0.05 and abs(float(m.group(2)) - 10) < 0.05
    assert "Stopped cluster c1 (3 tasks)" in text
    quiet = outputs(nb, skip="%tf_cluster logs")  # a task's own log keeps TF's lines, as it should
    for noise in ("E0000", "CloseContext", "Traceback"):
        assert noise not in quiet


def _number(text: str, pattern: str) -> float:
    m = re.search(pattern, text)
    assert m, f"{pattern!r} not found in:\n{text[-3000:]}"
    return float(m.group(1))


def test_02_sync_vs_async():
    text = outputs(execute("02_sync_vs_async.ipynb"))
    assert "Traceback" not in text
    ratio = _number(text, r"async applies ([\d.]+)x as many updates per second")
    assert ratio > 1.0, "the notebook says async applies more updates per second"
    assert _number(text, r"accuracy: sync ([\d.]+)") > 0.9
    assert _number(text, r"accuracy: sync [\d.]+, async ([\d.]+)") > 0.9
    assert "mean staleness" in text and "of its gradients were fresh" in text


def test_03_stragglers_and_failures():
    nb = execute("03_stragglers_and_failures.ipynb")
    text = outputs(nb)
    state = nb.metadata["widgets"]["application/vnd.jupyter.widget-state+json"]["state"]
    images = [m for m in state.values() if m["model_name"] == "ImageModel"]
    assert images, "the dashboard's widgets are saved with the notebook"
    assert any(m.get("buffers") or m["state"].get("value") for m in images), "with its last frame"
    headers = [
        m["state"]["value"]
        for m in state.values()
        if m["model_name"] == "HTMLModel" and "tfmagic-header" in m["state"].get("value", "")
    ]
    assert headers and re.search(r"async</b>: done, 25\d\d updates", headers[-1]), headers
    # without widget state (nbconvert to HTML, GitHub) the output itself holds the last frame
    dash = [
        out["data"]
        for cell in nb.cells
        if "%tf_train" in cell.get("source", "")
        for out in cell.get("outputs", [])
        if "application/vnd.jupyter.widget-view+json" in out.get("data", {})
    ]
    assert dash and re.search(r"async: 25\d\d updates", dash[-1]["text/plain"]), (
        dash and dash[-1]["text/plain"]
    )
    import copy

    from nbconvert import HTMLExporter

    bare = copy.deepcopy(nb)
    bare.metadata.pop("widgets", None)
    page, _ = HTMLExporter().from_notebook_node(bare)
    png = dash[-1]["image/png"].replace("\n", "")
    assert f"data:image/png;base64,{png[:200]}" in page, "nbconvert's HTML shows the last frame"
    assert "Traceback" not in text
    assert _number(text, r"sync step time with worker:2 at 1/4 speed: ([\d.]+)x") > 1.3
    assert _number(text, r"async throughput with worker:2 at 1/4 speed: ([\d.]+)x") > 0.7
    assert _number(text, r"sync \+ 1 backup worker, worker:2 slowed: ([\d.]+)x") < 1.15
    assert re.search(r"dropped as stale, per worker: \{[^}]*'worker:2': \d+", text)
    assert _number(text, r"worker:2 made (\d+) steps after it rejoined") > 0
    assert re.search(r"after [\d.]+ s: sync training needs all 3 workers", text)


def test_04_between_graph():
    text = outputs(execute("04_between_graph.ipynb"))
    assert "Traceback" not in text and "This could happen" not in text
    assert "[worker:1] I am worker:1, serving grpc://127.0.0.1:" in text
    assert "[ps:0] tfmagic: server.join() returns at once" in text
    rows = {
        name: _number(text, re.escape(name) + r"\s+w = [\d.]+\s+b = [\d.]+\s+held-out loss ([\d.]+)")
        for name in (
            "all-reduce sync (MWMS, between-graph)",
            "ps sync (seed 000, SyncReplicasOptimizer)",
            "ps async (seed 000)",
        )
    }
    engine = _number(text, r"kernel-driven sync \(tfmagic.train\)\s+held-out loss ([\d.]+)")
    assert all(v < 0.0115 for v in rows.values()), rows  # all at the noise floor (0.01)
    assert rows["all-reduce sync (MWMS, between-graph)"] == pytest.approx(engine, abs=1e-5)


def test_06_classic_experiments():
    text = outputs(execute("06_classic_experiments.ipynb"))
    assert "Traceback" not in text and "UsageError" not in text
    for name in ("stragglers", "backup-workers", "staleness", "noise", "ssp", "scaling"):
        assert re.search(rf"^{re.escape(name)}\s+holds\s", text, re.M), f"{name}:\n{text[-3000:]}"
    assert _number(text, r"peak memory of this notebook's experiments: ([\d.]+) GB") <= 1.8
    assert _number(text, r"longest experiment: ([\d.]+) s") <= 150
