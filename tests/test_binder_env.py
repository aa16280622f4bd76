"""The environment Binder builds, built here from binder/ alone, runs the notebooks.

``binder/check.py`` does what repo2docker does short of the container: a fresh virtual
environment, ``pip install -r binder/requirements.txt`` (which installs tfmagic itself, not
editable), then notebooks in a kernel of that environment with no SSH hosts and no Spark.
Here it runs the index and notebook 01 (the one the Binder badge opens); every notebook is
run that way by ``python binder/check.py`` (figures in docs/server.md). Needs PyPI (or its mirror).

It installs with ``uv`` where uv is installed (the test extra lists it): the same exact pins, 15 s
against 70-90 s for pip here (one run each, the same mirror); ``python binder/check.py`` alone
installs with pip, as repo2docker does.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = [pytest.mark.notebook, pytest.mark.cluster]
ROOT = Path(__file__).resolve().parents[1]


def test_the_binder_environment_installs_tfmagic_and_runs_the_first_notebooks(tmp_path):
    env = dict(os.environ)
    env.pop("PYTHONPATH", None)  # the checkout must not leak into the built environment
    done = subprocess.run(
        [
            sys.executable,
            str(ROOT / "binder" / "check.py"),
            "--env",
            str(tmp_path / "env"),
            "--installer",
            "uv" if shutil.which("uv") else "pip",
            "00",
            "01",
        ],
        capture_output=True,
        text=True,
        timeout=1500,
        env=env,
    )
    out = done.stdout
    assert done.returncode == 0, out[-3000:] + done.stderr[-3000:]
    assert f"tfmagic imported from {tmp_path / 'env'}" in out, out[-3000:]
    rows = [ln for ln in out.splitlines() if ln.startswith(("00_index", "01_cluster_basics"))]
    assert len(rows) == 2 and not any("failed" in r or "NOT Binder" in r for r in rows), out
    assert "the Jupyter server extension is enabled by the install" in out, out[-3000:]
    assert not (tmp_path / "env").exists(), "the environment is removed afterwards (no --keep)"
