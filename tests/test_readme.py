"""The README's and the docs' snippets run as written: in a real kernel, in order, the way a reader would paste them.

Each ```python block of README.md, then of every page of docs/ in mkdocs.yml's nav order (the order a
reader meets them; a page the nav misses comes last), runs in one kernel, top to bottom (a block may use
what an earlier one made, as a reader's notebook would: the docs' training snippets use the README's
cluster). A block preceded by ``<!-- run as a script -->`` runs in a fresh Python instead; one preceded
by ``<!-- not run: REASON -->`` is skipped, and must say why. A block that fails fails the test with its
file and line.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from .conftest import assert_gone
from .kernelutil import Kernel

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
DOCS = ROOT / "docs"
_BLOCK = re.compile(r"(?:<!--\s*(?P<note>[^>]*?)\s*-->\s*\n)?```python\n(?P<code>.*?)```", re.S)


class _Loader(yaml.SafeLoader):
    """mkdocs.yml may hold tags of mkdocs' own (``!!python/name:``, ``!ENV``): read them as nothing."""


_Loader.add_multi_constructor("", lambda loader, suffix, node: None)


def nav_pages() -> list[str]:
    """The .md pages of mkdocs.yml's nav, in order, relative to docs/."""
    found: list[str] = []

    def walk(item) -> None:
        if isinstance(item, str):
            if item.endswith(".md"):
                found.append(item)
        elif isinstance(item, list):
            for each in item:
                walk(each)
        elif isinstance(item, dict):
            for each in item.values():
                walk(each)

    walk(yaml.load((ROOT / "mkdocs.yml").read_text(), Loader=_Loader)["nav"])
    return found


def pages() -> list[Path]:
    """README.md, then docs/*.md in the nav's order, then any page the nav misses, by name."""
    listed = [DOCS / page for page in nav_pages()]
    return [README, *listed, *sorted(set(DOCS.glob("*.md")) - set(listed))]


def blocks(path: Path = README) -> list[tuple[int, str, str]]:
    """(line, note, code) of every python block of one file."""
    text = path.read_text()
    return [
        (text[: m.start("code")].count("\n"), m.group("note") or "", m.group("code"))
        for m in _BLOCK.finditer(text)
    ]


def snippets() -> list[tuple[str, int, str, str]]:
    """(file, line, note, code) of every python block of the README and the docs, in the order they run."""
    return [
        (page.relative_to(ROOT).as_posix(), line, note, code)
        for page in pages()
        for line, note, code in blocks(page)
    ]


@pytest.mark.unit
def test_the_readme_has_the_notebook_path_first():
    text = README.read_text()
    first = blocks()[0]
    assert "%load_ext tfmagic" in first[2] and "import tensorflow as tf" in first[2]
    assert text.index("mybinder.org") < text.index("## In a notebook") < text.index("## In a script")
    for where, line, note, _ in snippets():
        if note.startswith("not run"):
            assert len(note) > len("not run: ") + 20, f"{where} line {line}: say why the block is not run"
        else:
            assert note in ("", "run as a script"), f"{where} line {line}: unknown note {note!r}"
    assert {where for where, *_ in snippets()} >= {"README.md", "docs/training.md", "docs/lessons.md"}


@pytest.mark.kernel
@pytest.mark.cluster
def test_every_readme_snippet_runs_as_written(tmp_path):
    kernel = Kernel(env={"TFMAGIC_SPARES": "0"})
    ran = []
    try:
        kernel.ok(f"import os; os.chdir({str(tmp_path)!r})")
        for where, line, note, code in snippets():
            if note.startswith("not run"):
                continue
            if note == "run as a script":
                env = dict(os.environ, PYTHONPATH=str(ROOT), TFMAGIC_SPARES="0")
                done = subprocess.run(
                    [sys.executable, "-c", code],
                    cwd=tmp_path,
                    env=env,
                    capture_output=True,
                    text=True,
                    timeout=300,
                )
                assert done.returncode == 0, (
                    f"{where} line {line} (as a script) failed:\n{done.stderr[-3000:]}"
                )
                ran.append((where, line))
                continue
            reply = kernel.run(code, timeout=600)
            assert reply.status == "ok", f"{where} line {line} failed in the kernel:\n{reply.text[-3000:]}"
            ran.append((where, line))
        assert len(ran) >= 10, ran
    finally:
        pids = kernel.value(
            "[p.pid for p in __import__('tfmagic.procs.owner', fromlist=['owner']).processes()]"
        )
        kernel.shutdown()
        assert_gone(pids)
