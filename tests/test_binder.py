"""Binder's requirements stay consistent with pyproject.toml."""

import re
from pathlib import Path

import pytest
import tomllib

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]


def _reqs(lines):
    out = {}
    for line in lines:
        line = line.split("#")[0].strip()
        if not line or line == ".":
            continue
        m = re.match(r"^([A-Za-z0-9_.\-]+)\s*(.*)$", line)
        out[m.group(1).lower().replace("_", "-")] = m.group(2).replace(" ", "")
    return out


def test_binder_installs_every_dependency_with_the_same_bounds():
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = _reqs(project["dependencies"]) | _reqs(extras["cpu"]) | _reqs(extras["voila"])
    lines = (ROOT / "binder" / "requirements.txt").read_text().splitlines()
    have = _reqs(lines)
    assert have == wanted
    assert "." in [ln.strip() for ln in lines], "Binder must install tfmagic itself"


def test_binder_python_is_one_the_package_supports():
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    version = tuple(int(x) for x in runtime.removeprefix("python-").split("."))
    assert version >= (3, 10)
