"""What the kernels published, as the server reads it: plain Python, no web framework.

The server makes one private directory per server process (``mkdtemp``:
mode 0700, a new name nobody could have planted), under Jupyter's runtime
directory when that is private, else under the system's temporary
directory.  It names the server that made it (pid and start time) so a
later server removes the directories of servers killed without cleaning
up.  Records of kernels that ended stay listed as stopped for
:data:`PRUNE_AFTER` seconds, then their files are removed.
"""

from __future__ import annotations

import json
import os
import shutil
import tempfile
import time
from pathlib import Path

from ..network.bindguard import trusted_dir
from ..publish import LIST_WATCH, RESULTS, process_start, valid_id

PREFIX = "tfmagic-pages-"
OWNER = ".server"
#: how long a record of an ended kernel stays on the list
PRUNE_AFTER = 600.0


def _owner_alive(directory: Path) -> bool:
    try:
        pid_text, started = (directory / OWNER).read_text().split()
        return process_start(int(pid_text)) == started
    except (OSError, ValueError):
        return True  # no owner file (being made now, or not ours to judge)


def remove_stale(parent: Path) -> list[Path]:
    """Remove the directories of servers that are gone (this user's only, links never followed)."""
    removed = []
    try:
        candidates = list(parent.glob(PREFIX + "*"))
    except OSError:
        return removed
    for path in candidates:
        try:
            st = path.lstat()
        except OSError:
            continue
        if path.is_symlink() or not path.is_dir() or st.st_uid != os.geteuid():
            continue
        if not _owner_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def make_dir(runtime_dir: str | os.PathLike | None) -> Path:
    """A new private directory for this server's kernels to publish into."""
    parents = [Path(runtime_dir)] if runtime_dir else []
    parents.append(Path(tempfile.gettempdir()))
    for parent in parents:
        if parent != Path(tempfile.gettempdir()) and not trusted_dir(parent, create=True):
            continue  # a runtime directory others could write: not there
        remove_stale(parent)
        path = Path(tempfile.mkdtemp(prefix=PREFIX, dir=parent))
        if trusted_dir(path):
            (path / OWNER).write_text(f"{os.getpid()} {process_start(os.getpid())}\n")
            return path
        shutil.rmtree(path, ignore_errors=True)
    raise OSError(
        "no private directory could be made for tfmagic's pages (runtime and temporary directories)"
    )


def touch(path: Path) -> None:
    """Mark ``path`` as watched now (made if missing; never through a link)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_NOFOLLOW, 0o600)
    os.close(fd)
    os.utime(path)


def kernel_alive(record: dict) -> bool:
    pid = record.get("kernel_pid")
    return isinstance(pid, int) and process_start(pid) == record.get("kernel_started")


def _files(root: Path, rid: str) -> list[Path]:
    return [root / f"{rid}{s}" for s in (".json", ".png", ".frame.json", ".watching")]


def read(root: Path, rid: str) -> dict | None:
    """One record with its state as the server sees it (``stopped`` once its kernel ended), or None."""
    if not valid_id(rid):
        return None
    try:
        record = json.loads((root / f"{rid}.json").read_text())
    except (OSError, ValueError):
        return None
    if not isinstance(record, dict) or record.get("id") != rid:
        return None  # not a record: another file of one ('ID.frame' names ID's frame.json)
    if not kernel_alive(record):
        record["state"] = "stopped"
        record["why"] = "its kernel ended"
    elif record.get("state") != "running":
        record["why"] = "stopped in its kernel"
    return record


def read_all(root: Path, watch: bool = True) -> list[dict]:
    """Every record, newest first; records of kernels that ended long ago are removed."""
    if watch:
        touch(root / LIST_WATCH)
    out = []
    now = time.time()
    for path in sorted(root.glob("*.json")):
        name = path.name
        if name.endswith(".frame.json") or name.startswith("."):
            continue
        rid = name[: -len(".json")]
        record = read(root, rid)
        if record is None:
            continue
        if (
            record.get("why") == "its kernel ended"
            and now - float(record.get("updated_at") or 0) > PRUNE_AFTER
        ):
            for f in _files(root, rid):
                try:
                    f.unlink()
                except OSError:
                    pass
            continue
        out.append(record)
    out.sort(key=lambda r: -float(r.get("started_at") or 0))
    return out


def frame(root: Path, rid: str) -> tuple[dict | None, bytes | None]:
    """The latest frame's text (header, table, number) and picture; also marks the cluster watched."""
    touch(root / f"{rid}.watching")
    try:
        info = json.loads((root / f"{rid}.frame.json").read_text())
    except (OSError, ValueError):
        info = None
    try:
        png = (root / f"{rid}.png").read_bytes()
    except OSError:
        png = None
    return info, png


def results(root: Path) -> list[dict]:
    """The experiments' results the kernels published, newest first (files that do not parse are skipped)."""
    out = []
    for path in sorted((root / RESULTS).glob("*.json"), reverse=True):
        if path.name.startswith(".") or path.is_symlink():
            continue
        try:
            record = json.loads(path.read_text())
        except (OSError, ValueError):
            continue
        if isinstance(record, dict) and isinstance(record.get("experiment"), str):
            out.append(record)
    return out
