"""Notebook 05 runs top to bottom with real SSH hosts (network namespaces, or a loopback sshd
without root) and a real Spark in local mode, and what it prints is true."""

from __future__ import annotations

import os
import re
import sys

import pytest

from . import sshhosts
from .test_notebooks import execute, outputs

pytestmark = [pytest.mark.notebook, pytest.mark.cluster]
NAME = "05_beyond_one_machine.ipynb"


def test_05_beyond_one_machine():
    if sshhosts.skip_reason():
        pytest.skip(sshhosts.skip_reason())
    hosts = sshhosts.loopback_host() if sshhosts.netns_skip_reason() else sshhosts.namespace_hosts(2)
    env = dict(
        os.environ,
        TFMAGIC_DEMO_SSH_HOSTS=",".join(hosts.aliases),
        TFMAGIC_DEMO_SSH_CONFIG=str(hosts.config),
        TFMAGIC_DEMO_PYTHON=sys.executable,
    )
    try:
        # local Spark's JVM is the kernel's child: not what Binder runs, so no memory ceiling here
        nb = execute(NAME, env=env, peak_limit=None)
    finally:
        hosts.close()
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
    env = {k: v for k, v in os.environ.items() if not k.startswith("TFMAGIC_DEMO_")}
    env["PYTHONPATH"] = os.pathsep.join([str(hide.parent), env.get("PYTHONPATH", "")])
    nb = execute(NAME, env=env, saved_as="binder-" + NAME)  # Binder's own ceiling holds here
    text = outputs(nb)
    assert "Traceback" not in text and "NameError" not in text, text[-3000:]
    assert "skipping the SSH backend" in text and "skipping the Spark backend" in text
    assert "only the local backend ran here" in text and "same final loss on every backend" not in text
    assert "computed on /job:worker/replica:0/task:0" in text
