"""The documentation site builds, whole, and no link of the README or the docs is broken.

``mkdocs build --strict`` (mkdocs.yml: the pages in docs/, the lessons from notebooks/ rendered with their
committed outputs by mkdocs-jupyter, never executed) fails on a link between pages that does not resolve,
a missing anchor, or a page the nav leaves out. Links that leave docs/ (to the README, tests/README.md, a
lesson) are not the build's, and the README is not part of the site: both are checked here on disk.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import time
from pathlib import Path

import pytest
from markdown.extensions.toc import slugify

from .test_readme import README, ROOT, blocks, nav_pages

pytestmark = pytest.mark.unit
DOCS = ROOT / "docs"
_LINK = re.compile(r"\]\((?P<target>[^)\s]+)\)")
_FENCE = re.compile(r"^```.*?^```", re.S | re.M)
_HEADING = re.compile(r"^#+\s+(.*?)\s*$", re.M)


def markdown_files() -> list[Path]:
    return [README, *sorted(DOCS.glob("*.md"))]


def lessons() -> list[Path]:
    return sorted((ROOT / "notebooks").glob("[0-9][0-9]_*.ipynb"))


def html_of(site: Path, page: str) -> Path:
    """Where ``mkdocs build`` (directory URLs) writes the page whose source is ``page``."""
    stem = page.rsplit(".", 1)[0]
    return site / "index.html" if stem == "index" else site / stem / "index.html"


def anchors(path: Path) -> set[str]:
    """The ids the site gives a page's headings (Python-Markdown's toc slugs, GitHub's for these headings)."""
    return {slugify(re.sub(r"[`*]", "", h), "-") for h in _HEADING.findall(_FENCE.sub("", path.read_text()))}


def test_the_site_builds_with_every_page_and_lesson(tmp_path):
    site = tmp_path / "site"
    started = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)],
        cwd=ROOT,
        env=dict(os.environ, NO_MKDOCS_2_WARNING="1"),
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, (
        f"mkdocs build --strict failed:\n{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    )
    assert time.monotonic() - started < 120, "the site took over 2 minutes to build"
    missing = [page for page in nav_pages() if not html_of(site, page).is_file()]
    assert not missing, f"nav pages not built: {missing}"
    for lesson in lessons():
        html = html_of(site, f"notebooks/{lesson.name}")
        assert html.is_file(), f"lesson {lesson.name} not rendered"
        text = html.read_text()
        assert "jp-OutputArea" in text, f"lesson {lesson.name} rendered without its outputs"
        assert not re.search(r'href="\d\d_\w+\.ipynb', text), f"lesson {lesson.name} links a notebook file"
    unlisted = sorted(p.name for p in DOCS.glob("*.md") if p.name not in nav_pages())
    assert not unlisted, f"docs pages missing from mkdocs.yml's nav: {unlisted}"


def test_no_relative_link_is_broken():
    broken = []
    for path in markdown_files():
        text = _FENCE.sub(lambda m: "\n" * m.group(0).count("\n"), path.read_text())
        for m in _LINK.finditer(text):
            target = m.group("target")
            if re.match(r"[a-z][a-z0-9+.-]*:", target) or target.startswith("#"):
                continue  # http(s), mailto; an anchor of the same page (the build checks the docs')
            file, _, anchor = target.partition("#")
            resolved = (path.parent / file).resolve()
            where = f"{path.relative_to(ROOT)} line {text[: m.start()].count(chr(10)) + 1}"
            if not resolved.exists():
                broken.append(f"{where}: {target} (no such file)")
            elif anchor and resolved.suffix == ".md" and anchor not in anchors(resolved):
                broken.append(f"{where}: {target} (no such heading)")
    assert not broken, "broken links:\n" + "\n".join(broken)


def test_the_readme_links_every_docs_page():
    text = README.read_text()
    linked = {(README.parent / m.group("target").partition("#")[0]).resolve() for m in _LINK.finditer(text)}
    missing = sorted(p.name for p in DOCS.glob("*.md") if p.resolve() not in linked)
    assert not missing, f"the README's 'Where to go next' does not link {missing}"
    assert len(text.splitlines()) <= 150, "the README is a newcomer's page: 150 lines at most"


def test_docs_copies_of_the_readmes_blocks_are_the_readmes():
    """A docs block not run because the README runs it must be the README's block, word for word."""
    readme = {code for _, _, code in blocks()}
    for path in sorted(DOCS.glob("*.md")):
        for line, note, code in blocks(path):
            if note.startswith("not run") and "README" in note:
                assert code in readme, (
                    f"docs/{path.name} line {line} says it is the README's block, and is not"
                )
