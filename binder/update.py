"""Keep Binder in step: the pins in binder/requirements.txt and the README's Binder badge.

    python binder/update.py           # say what is out of date (exit 1 if anything is)
    python binder/update.py --write   # rewrite the pins from this environment and the badge from pyproject

The repository's public path is written once, in pyproject.toml
(``[tool.tfmagic] repository``); whoever publishes tfmagic elsewhere changes
that line and runs ``--write``.  The pins are the versions installed here,
where tfmagic's tests run against them: Binder then builds what was
tested, not whatever is newest that day (tfmagic uses TensorFlow internals).
tests/test_binder.py fails when a pin leaves pyproject.toml's ranges or the
badge differs from what this script makes.  Standard library only
(Python 3.11+ for tomllib).
"""

from __future__ import annotations

import re
import sys
from importlib import metadata
from pathlib import Path

import tomllib

ROOT = Path(__file__).resolve().parents[1]
REQUIREMENTS = ROOT / "binder" / "requirements.txt"
README = ROOT / "README.md"
NOTEBOOK = "notebooks/01_cluster_basics.ipynb"

#: pinned beyond pyproject's own dependencies: the front end Binder opens, and what TensorFlow's
#: internals that tfmagic uses were tested with
EXTRA_PINS = ["jupyterlab", "keras", "numpy", "protobuf"]

HEADER = """\
# What Binder (repo2docker) installs: exact versions, those of the environment tfmagic's tests
# run in.  Made by `python binder/update.py --write` there; tests/test_binder.py fails when a pin
# leaves pyproject.toml's ranges or a dependency is not pinned.  tensorflow-cpu: Binder has
# no GPU and the CPU build is the smaller download (the same release as the tensorflow tested).
"""


def project() -> dict:
    return tomllib.loads((ROOT / "pyproject.toml").read_text())


def name_of(requirement: str) -> str:
    """The normalized distribution name of a requirement line (``scikit-learn>=1.3`` -> ``scikit-learn``)."""
    m = re.match(r"\s*([A-Za-z0-9][A-Za-z0-9._-]*)", requirement)
    if not m:
        raise ValueError(f"not a requirement: {requirement!r}")
    return re.sub(r"[-_.]+", "-", m.group(1)).lower()


def wanted() -> dict[str, str]:
    """pyproject's requirements Binder installs: the dependencies, the ``cpu`` and ``voila`` extras."""
    p = project()["project"]
    reqs = p["dependencies"] + p["optional-dependencies"]["cpu"] + p["optional-dependencies"]["voila"]
    return {name_of(r): r for r in reqs}


def installed(name: str) -> str:
    """The version installed here; tensorflow-cpu is the same release as the tensorflow installed."""
    candidates = [name] + (["tensorflow"] if name == "tensorflow-cpu" else [])
    for candidate in candidates:
        try:
            return metadata.version(candidate)
        except metadata.PackageNotFoundError:
            continue
    raise SystemExit(
        f"{name} is not installed here: install tfmagic's extras first (pip install -e '.[tf,test]')"
    )


def pins_text() -> str:
    names = list(wanted()) + [n for n in EXTRA_PINS if n not in wanted()]
    lines = [f"{n}=={installed(n)}" for n in names]
    return HEADER + "\n".join(lines) + "\n# tfmagic itself, from this repository\n.\n"


def pins(text: str | None = None) -> dict[str, str]:
    """The pinned versions in binder/requirements.txt: name -> version (every line must be ``==``)."""
    out = {}
    for line in (text if text is not None else REQUIREMENTS.read_text()).splitlines():
        line = line.split("#")[0].strip()
        if not line or line == ".":
            continue
        m = re.fullmatch(r"([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)", line)
        if not m:
            raise ValueError(f"binder/requirements.txt: {line!r} is not an exact pin (name==version)")
        out[name_of(m.group(1))] = m.group(2)
    return out


def repository() -> str:
    """``owner/name`` on GitHub, from pyproject.toml's ``[tool.tfmagic] repository``."""
    url = project()["tool"]["tfmagic"]["repository"]
    m = re.fullmatch(r"https://github\.com/([^/\s]+/[^/\s]+?)/?", url)
    if not m:
        raise ValueError(f"[tool.tfmagic] repository must be https://github.com/OWNER/NAME, not {url!r}")
    return m.group(1)


def binder_url() -> str:
    return f"https://mybinder.org/v2/gh/{repository()}/HEAD?urlpath=lab/tree/{NOTEBOOK}"


def badge() -> str:
    """The README's badge line: opens notebook 01 in JupyterLab on Binder."""
    return f"[![Binder](https://mybinder.org/badge_logo.svg)]({binder_url()})"


_BADGE = re.compile(r"^\[!\[Binder\]\(https://mybinder\.org/badge_logo\.svg\)\]\([^)]*\)$", re.M)


def readme_text() -> str:
    text = README.read_text()
    if not _BADGE.search(text):
        raise SystemExit("README.md has no Binder badge line to update")
    return _BADGE.sub(badge(), text, count=1)


def main(argv: list[str]) -> int:
    write = "--write" in argv
    stale = []
    pinned = pins_text()
    if REQUIREMENTS.read_text() != pinned:
        stale.append("binder/requirements.txt (pins differ from this environment)")
        if write:
            REQUIREMENTS.write_text(pinned)
    readme = readme_text()
    if README.read_text() != readme:
        stale.append("README.md (Binder badge)")
        if write:
            README.write_text(readme)
    for what in stale:
        print(("rewrote " if write else "out of date: ") + what)
    return 0 if write or not stale else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
