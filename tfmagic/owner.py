"""Everything this process started, so that nothing outlives it.

Each task process already ends itself when its owner's channel closes (see
:mod:`tfmagic.task.lifeline`); this registry is the orderly half: it kills every
task and spare at interpreter exit, on ``%unload_ext`` and on kernel shutdown,
and lets tests check that nothing is left.

It also owns this process's private directory (logs, checkpoints) and
removes the directories that owners killed with ``kill -9`` left behind:
they cannot clean up after themselves, so the next owner does.
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
from pathlib import Path
from typing import Protocol

_PREFIX = "tfmagic-"
_OWNER_FILE = ".owner"


class Owned(Protocol):
    """What the registry needs of a process it keeps: a pid, whether it lives, how to end it."""

    pid: int | None

    @property
    def alive(self) -> bool: ...

    def kill(self) -> None: ...


_lock = threading.Lock()
_strong: dict[int, Owned] = {}
_runtime_dir: Path | None = None


def register(proc: Owned) -> None:
    with _lock:
        _strong[proc.pid] = proc


def forget(proc: Owned) -> None:
    with _lock:
        if _strong.get(proc.pid) is proc:
            del _strong[proc.pid]


def processes() -> list:
    """Every process this owner started that has not been reaped yet."""
    with _lock:
        return [p for p in _strong.values() if p.alive]


def kill_all() -> int:
    """Kill every task and spare this process started; returns how many."""
    with _lock:
        procs = list(_strong.values())
        _strong.clear()
    for proc in procs:
        proc.kill()
    return len(procs)


def _start_time(pid: int) -> str | None:
    """The process's start time in clock ticks since boot (tells a reused pid apart)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            return f.read().rsplit(b")", 1)[1].split()[19].decode()
    except (OSError, IndexError):
        return None


def _owner_alive(directory: Path) -> bool:
    try:
        pid_text, started = (directory / _OWNER_FILE).read_text().split()
        pid = int(pid_text)
    except (OSError, ValueError):
        return True  # not ours to judge (no owner file: another version, or being made now)
    return _start_time(pid) == started


def remove_stale(root: str | os.PathLike | None = None) -> list[Path]:
    """Remove the private directories of owners that are gone; returns what was removed.

    Only this user's directories that carry an owner file naming a process
    that no longer runs (pid and start time) are touched.
    """
    removed = []
    base = Path(root or tempfile.gettempdir())
    try:
        candidates = list(base.glob(_PREFIX + "*"))
    except OSError:
        return removed
    for path in candidates:
        try:
            st = path.lstat()
        except OSError:
            continue
        if not path.is_dir() or path.is_symlink() or st.st_uid != os.getuid():
            continue
        if not _owner_alive(path):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def runtime_dir() -> Path:
    """A private directory for this owner's logs and checkpoints (removed at exit)."""
    global _runtime_dir
    with _lock:
        if _runtime_dir is None or not _runtime_dir.exists():
            remove_stale()
            _runtime_dir = Path(tempfile.mkdtemp(prefix=_PREFIX))
            (_runtime_dir / _OWNER_FILE).write_text(f"{os.getpid()} {_start_time(os.getpid())}\n")
        return _runtime_dir


def kernel_log() -> Path:
    """The kernel's own log (``%tf_cluster logs kernel``): TensorFlow's native lines, and the
    warnings tfmagic keeps out of the notebook."""
    return runtime_dir() / "kernel-native.log"


def cleanup() -> None:
    """Kill everything this process started and remove its private directory."""
    kill_all()
    if _runtime_dir is not None:
        shutil.rmtree(_runtime_dir, ignore_errors=True)


atexit.register(cleanup)
