"""The launcher's source text, which every exported file carries.

The launcher (``launch.py`` in this package) is an ordinary module, so it is
linted and unit-tested like the rest of tfmagic; the exports need its *text*,
because the machines that run it do not have tfmagic installed.  The text is
read from the installed package file each time it is asked for, so what a
Slurm script or ConfigMap embeds is exactly the file the tests import.
"""

from __future__ import annotations

from importlib import resources

#: The launcher's file name, in this package and where Kubernetes Pods mount it.
LAUNCHER_FILE = "launch.py"


def launcher_source() -> str:
    """The text of ``launch.py``, as the exports embed it."""
    return resources.files(__package__).joinpath(LAUNCHER_FILE).read_text(encoding="utf-8")
