"""Binder stays consistent with pyproject.toml: exact pins inside the package's ranges, and one badge.

binder/update.py makes both (``--write``); these tests fail when a pin
drifts out of pyproject.toml's dependency ranges, a dependency is not
pinned, or the README's badge is not the one made from the repository path
written in pyproject.toml.
"""

import importlib.util
import re
from pathlib import Path

import pytest
import tomllib
from packaging.requirements import Requirement
from packaging.version import Version

pytestmark = pytest.mark.unit
ROOT = Path(__file__).resolve().parents[1]


def _update():
    spec = importlib.util.spec_from_file_location("binder_update", ROOT / "binder" / "update.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_dependency_is_pinned_exactly_and_inside_pyprojects_range():
    update = _update()
    pins = update.pins()
    wanted = update.wanted()
    assert set(wanted) <= set(pins), (
        f"not pinned in binder/requirements.txt: {sorted(set(wanted) - set(pins))}"
    )
    outside = {
        name: f"{pins[name]} not in {Requirement(req).specifier}"
        for name, req in wanted.items()
        if not Requirement(req).specifier.contains(Version(pins[name]), prereleases=True)
    }
    assert not outside, f"Binder pins outside pyproject.toml's ranges: {outside}"
    for name in update.EXTRA_PINS:
        assert name in pins, f"{name} is not pinned"
    lines = [ln.strip() for ln in (ROOT / "binder" / "requirements.txt").read_text().splitlines()]
    assert "." in lines, "Binder must install tfmagic itself"


def test_a_pin_out_of_range_or_loose_is_caught():
    update = _update()
    text = (ROOT / "binder" / "requirements.txt").read_text()
    drifted = re.sub(r"^tensorboard==.*$", "tensorboard==2.15.0", text, flags=re.M)
    req = Requirement(update.wanted()["tensorboard"])
    assert not req.specifier.contains(Version(update.pins(drifted)["tensorboard"]))
    with pytest.raises(ValueError, match="not an exact pin"):
        update.pins(text.replace("psutil==", "psutil>="))


def test_the_server_side_is_in_binder():
    """The pages and TensorBoard behind the proxy need these on Binder too."""
    pins = _update().pins()
    assert {"jupyter-server", "jupyter-server-proxy", "tensorboard", "jupyterlab"} <= set(pins)


def test_the_readme_badge_opens_notebook_01_from_the_one_repository_path():
    update = _update()
    repo = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["tfmagic"]["repository"]
    assert repo.startswith("https://github.com/")
    readme = (ROOT / "README.md").read_text()
    assert update.badge() in readme.splitlines(), (
        "README's badge is stale: run python binder/update.py --write"
    )
    assert update.binder_url().endswith("?urlpath=lab/tree/notebooks/01_cluster_basics.ipynb")
    assert (ROOT / update.NOTEBOOK).exists()
    owner_name = update.repository()
    # written once: nowhere else in the README or binder/ is the path spelled out
    for path in [ROOT / "README.md", *sorted((ROOT / "binder").iterdir())]:
        if path.is_file() and path.suffix != ".pyc":
            extra = path.read_text().count(owner_name) - (1 if path.name == "README.md" else 0)
            assert extra <= 0, f"{path.name} spells out the repository path again; use binder/update.py"


def test_binder_python_is_one_the_package_supports():
    runtime = (ROOT / "binder" / "runtime.txt").read_text().strip()
    version = tuple(int(x) for x in runtime.removeprefix("python-").split("."))
    assert version >= (3, 10)
