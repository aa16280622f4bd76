"""MkDocs hooks for tfmagic's documentation site (``hooks:`` in mkdocs.yml).

* The lessons, ``notebooks/NN_name.ipynb``, join the site under the same path (``notebooks/NN_name/``)
  without a copy under docs/: mkdocs-jupyter renders them with their committed outputs. It renders only
  files the build knows, so they are added here, before its own ``on_files`` wraps them, as files whose
  source directory is the repository's root (its wrapper finds a file by ``src_dir`` and ``src_uri``).
* A page's relative link that leaves docs/ (``../tests/README.md``, ``../notebooks/01_cluster_basics.ipynb``)
  is written for GitHub and a checkout, where it works as is; in the site it points at the lesson's
  page, or at the file in the repository (``[tool.tfmagic] repository`` in pyproject.toml).
* A lesson's links to another lesson (``02_sync_vs_async.ipynb``) point at that lesson's page.
"""

from __future__ import annotations

import posixpath
import re
from pathlib import Path

from mkdocs.plugins import event_priority
from mkdocs.structure.files import File, Files
from mkdocs.utils import get_relative_url

ROOT = Path(__file__).resolve().parents[1]
NOTEBOOKS = ROOT / "notebooks"
_LINK = re.compile(r"\]\((?P<target>[^)\s#]+)(?P<anchor>#[^)\s]*)?\)")
_TABLE_ROW = re.compile(r"^\|.*$", re.M)
_CODE = re.compile(r"`[^`\n]+`")
_LESSON_HREF = re.compile(r'href="(?P<name>\d\d_\w+)\.ipynb(?P<anchor>#[^"]*)?"')


def repository() -> str:
    """The repository's public address, written once in pyproject.toml's ``[tool.tfmagic]``."""
    text = (ROOT / "pyproject.toml").read_text()
    table = text.split("[tool.tfmagic]", 1)[1].split("\n[", 1)[0]
    return re.search(r'^repository\s*=\s*"([^"]+)"', table, re.M).group(1).rstrip("/")


def lessons() -> list[str]:
    """Each lesson's path in the repository, which is also its path in the site's sources."""
    return [f"notebooks/{nb.name}" for nb in sorted(NOTEBOOKS.glob("[0-9][0-9]_*.ipynb"))]


@event_priority(100)  # before mkdocs-jupyter's on_files, which makes the notebooks pages
def on_files(files: Files, config) -> Files:
    for path in lessons():
        files.append(File(path, str(ROOT), config["site_dir"], config["use_directory_urls"]))
    return files


def on_page_markdown(markdown: str, page, config, files) -> str:
    if not page.file.src_uri.endswith(".md") or page.file.abs_src_path is None:
        return markdown
    docs = Path(config["docs_dir"]).resolve()
    here = Path(page.file.abs_src_path).resolve().parent
    pages = lessons()

    def fix(m: re.Match) -> str:
        target, anchor = m.group("target"), m.group("anchor") or ""
        if re.match(r"[a-z][a-z0-9+.-]*:", target):  # http:, https:, mailto:
            return m.group(0)
        path = (here / target).resolve()
        if path == docs or docs in path.parents:
            return m.group(0)  # a page of the site: mkdocs checks and converts it
        rel = path.relative_to(ROOT).as_posix()
        if rel in pages:
            return f"]({posixpath.relpath(rel, posixpath.dirname(page.file.src_uri) or '.')}{anchor})"
        kind = "tree" if path.is_dir() else "blob"
        return f"]({repository()}/{kind}/HEAD/{rel}{anchor})"

    # GitHub needs a table cell's `|` escaped even inside code (`--pace 150ms\|auto`); Python-Markdown
    # does not split a row inside code, and would show the backslash
    markdown = _TABLE_ROW.sub(
        lambda row: _CODE.sub(lambda c: c.group(0).replace("\\|", "|"), row.group(0)), markdown
    )
    return _LINK.sub(fix, markdown)


def on_page_content(html: str, page, config, files) -> str:
    if page.file.src_uri not in lessons():
        return html

    def fix(m: re.Match) -> str:
        target = files.get_file_from_path(f"notebooks/{m.group('name')}.ipynb")
        if target is None:
            return m.group(0)
        return f'href="{get_relative_url(target.url, page.file.url)}{m.group("anchor") or ""}"'

    return _LESSON_HREF.sub(fix, html)
