"""The README's snippets run as written: in a real kernel, in order, the way a reader would paste them.

Each ```python block of README.md runs in one kernel, top to bottom (a block may use what an
earlier one made, as a reader's notebook would). A block preceded by ``<!-- run as a script -->``
runs in a fresh Python instead; one preceded by ``<!-- not run: REASON -->`` is skipped, and must
say why. A block that fails fails the test with its position in the README.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from .conftest import assert_gone
from .kernelutil import Kernel

pytestmark = [pytest.mark.kernel, pytest.mark.cluster]
README = Path(__file__).resolve().parents[1] / "README.md"
_BLOCK = re.compile(r"(?:<!--\s*(?P<note>[^>]*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)


def blocks() -> list[tuple[int, str, str]]:
    """(line, note, code) of every python block."""
    text = README.read_text()
    return [
        (text[: m.start("code")].count("\n"), m.group("note") or "", m.group("code"))
        for m in _BLOCK.finditer(text)
    ]


def test_the_readme_has_the_notebook_path_first():
    text = README.read_text()
    first = blocks()[0]
    assert "%load_ext tfmagic" in first[2] and "import tensorflow as tf" in first[2]
    assert text.index("mybinder.org") < text.index("## In a notebook") < text.index("## In a script")
    for line, note, _ in blocks():
        if note.startswith("not run"):
            assert len(note) > len("not run: ") + 20, f"README line {line}: say why the block is not run"


def test_every_readme_snippet_runs_as_written(tmp_path):
    kernel = Kernel(env={"TFMAGIC_SPARES": "0"})
    ran = []
    try:
        kernel.ok(f"import os; os.chdir({str(tmp_path)!r})")
        for line, note, code in blocks():
            if note.startswith("not run"):
                continue
            if note == "run as a script":
                env = dict(os.environ, PYTHONPATH=str(README.parent), TFMAGIC_SPARES="0")
                done = subprocess.run(
                    [sys.executable, "-c", code],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                assert done.returncode == 0, (
                    f"README line {line} (as a script) failed:\n{done.stderr[-3000:]}"
                )
                ran.append(line)
                continue
            reply = kernel.run(code, timeout=600)
            assert reply.status == "ok", f"README line {line} failed in the kernel:\n{reply.text[-3000:]}"
            ran.append(line)
        assert len(ran) >= 10, ran
    finally:
        pids = kernel.value("[p.pid for p in __import__('tfmagic').owner.processes()]")
        kernel.shutdown()
        assert_gone(pids)
