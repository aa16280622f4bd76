"""Notebook 05 runs top to bottom with real SSH hosts (network namespaces, or a loopback sshd
without root) and a real Spark in local mode, and what it prints is true."""

from __future__ import annotations

import os
import re
import sys

import nbformat
import pytest
from nbclient import NotebookClient

from . import sshhosts
from .conftest import assert_gone, task_processes
from .test_notebooks import ARTIFACTS, ROOT, outputs

pytestmark = [pytest.mark.notebook, pytest.mark.cluster]


def test_05_beyond_one_machine():
    if sshhosts.skip_reason():
        pytest.skip(sshhosts.skip_reason())
    hosts = sshhosts.loopback_host() if sshhosts.netns_skip_reason() else sshhosts.namespace_hosts(2)
    name = "05_beyond_one_machine.ipynb"
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    before = set(task_processes())
    env = dict(
        os.environ,
        TFMAGIC_SPARES="0",
        TFMAGIC_LESSON_STRICT="1",  # a contradicted lesson fails
        TFMAGIC_DEMO_SSH_HOSTS=",".join(hosts.aliases),
        TFMAGIC_DEMO_SSH_CONFIG=str(hosts.config),
        TFMAGIC_DEMO_PYTHON=sys.executable,
    )
    env.pop("PYTEST_CURRENT_TEST", None)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    )
    try:
        client.execute(env=env)
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, ARTIFACTS / name)
        hosts.close()
    assert_gone(set(task_processes()) - before)
    text = outputs(nb)
    assert "Traceback" not in text
    rows = dict(re.findall(r"^(local|ssh|spark)\s+[\d.]+\s+[\d.]+\s+\d+\s+([\d.]+)", text, re.M))
    expected = {"local", "ssh"} | ({"spark"} if "skipping the Spark backend" not in text else set())
    assert set(rows) == expected, text
    assert re.search(r"same final loss on every backend \(.*ssh.*\): True", text), text
    for alias in hosts.aliases:
        assert f"ssh:{alias}" in text  # the status table says where each task runs
    assert "takes the role worker:0" in text or "serving grpc://" in text  # a remote task's log
    assert "#SBATCH" in text and "SlurmClusterResolver" in text
    assert "the attached tasks still run: True" in text


def test_05_as_binder_runs_it(tmp_path):
    """No SSH hosts and no pyspark, as on Binder: the skipped parts say so in one line each,
    nothing after them breaks, and the comparison does not compare local with itself."""
    hide = tmp_path / "no-pyspark" / "pyspark"
    hide.mkdir(parents=True)
    (hide / "__init__.py").write_text("raise ImportError('pyspark is not installed (simulated Binder)')\n")
    name = "05_beyond_one_machine.ipynb"
    nb = nbformat.read(ROOT / "notebooks" / name, as_version=4)
    before = set(task_processes())
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFMAGIC_DEMO_")}
    env.update(
        TFMAGIC_SPARES="0",
        TFMAGIC_LESSON_STRICT="1",
        PYTHONPATH=os.pathsep.join([str(hide.parent), env.get("PYTHONPATH", "")]),
    )
    env.pop("PYTEST_CURRENT_TEST", None)
    client = NotebookClient(
        nb, timeout=600, kernel_name="python3", resources={"metadata": {"path": str(ROOT / "notebooks")}}
    )
    try:
        client.execute(env=env)
    finally:
        ARTIFACTS.mkdir(parents=True, exist_ok=True)
        nbformat.write(nb, ARTIFACTS / ("binder-" + name))
    assert_gone(set(task_processes()) - before)
    text = outputs(nb)
    assert "Traceback" not in text and "NameError" not in text, text[-3000:]
    assert "skipping the SSH backend" in text and "skipping the Spark backend" in text
    assert "only the local backend ran here" in text and "same final loss on every backend" not in text
    assert "computed on /job:worker/replica:0/task:0" in text
