"""The exported Slurm script run whole by bash under a stand-in srun (three ranks, each a Python
that imports TensorFlow's resolver): processes, so not the fast tier (tests/test_export.py is)."""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import textwrap

import pytest

from tfmagic.export import write_export
from tfmagic.spec import ClusterShape

pytestmark = pytest.mark.cluster


@pytest.fixture(scope="module")
def tf():
    return pytest.importorskip("tensorflow")


FAKE_SRUN = textwrap.dedent(
    """\
    #!/bin/bash
    # Slurm cannot exist here, so this stands in for srun: it runs every rank of the step,
    # one after another, with the step variables Slurm would set (2 tasks on node1, 1 on node2).
    # This is the only mock: SlurmClusterResolver expands hostlists itself (no scontrol).
    while [[ $1 == --* ]]; do shift; done
    nodes=(node1 node1 node2); locals=(0 1 0)
    for rank in 0 1 2; do
        SLURM_PROCID=$rank SLURM_STEP_NODELIST='node[1-2]' SLURM_STEP_TASKS_PER_NODE='2,1' \\
        SLURM_STEP_NUM_TASKS=3 SLURMD_NODENAME=${nodes[$rank]} SLURM_LOCALID=${locals[$rank]} \\
            "$@" || exit $?
    done
    """
)


def test_whole_script_dry_run_under_a_fake_srun(tf, tmp_path):
    """bash runs the exported script; each rank's launcher resolves and prints its TF_CONFIG, starts nothing."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "srun").write_text(FAKE_SRUN)
    (bin_dir / "srun").chmod(0o755)
    script = tmp_path / "job.sbatch"
    write_export(
        "slurm", script, ClusterShape(ps=1, workers=2), python=shlex.quote(sys.executable), port=7000
    )
    env = dict(
        os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", TFMAGIC_DRY_RUN="1", TF_CPP_MIN_LOG_LEVEL="3"
    )
    result = subprocess.run(
        ["bash", str(script)], capture_output=True, text=True, env=env, cwd=tmp_path, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    configs = [
        json.loads(line.split("TF_CONFIG=", 1)[1])
        for line in result.stdout.splitlines()
        if line.startswith("tfmagic launcher: TF_CONFIG=")
    ]
    cluster = {"ps": ["node1:7000"], "worker": ["node1:7001", "node2:7000"]}
    assert configs == [
        {"cluster": cluster, "task": {"type": "ps", "index": 0}},
        {"cluster": cluster, "task": {"type": "worker", "index": 0}},
        {"cluster": cluster, "task": {"type": "worker", "index": 1}},
    ]
    assert "ps:0 at node1:7000, role serve" in result.stdout
    assert "worker:1 at node2:7000, role serve+run" in result.stdout
    assert result.stdout.count("CUDA_VISIBLE_DEVICES=''") == 3
