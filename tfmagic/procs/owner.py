"""Everything this process started, so that nothing outlives it.

Each task process already ends itself when its owner's channel closes (see
:mod:`tfmagic.task.lifeline`); this registry is the orderly half: it kills every
task and spare at interpreter exit, on ``%unload_ext`` and on kernel shutdown,
and lets tests check that nothing is left.

It also owns this process's private directory (logs, checkpoints) and
removes the directories that owners killed with ``kill -9`` left behind:
they cannot clean up after themselves, so the next owner does.  An owner that
died of a fatal signal (a kernel that aborted inside TensorFlow) left the
reason in its log, and that log is kept (:func:`crash_dir`) before its
directory goes: the next kernel says where (:func:`crashes`).
"""

from __future__ import annotations

import atexit
import os
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Protocol

_PREFIX = "tfmagic-"
_OWNER_FILE = ".owner"
_KERNEL_LOG = "kernel-native.log"
#: what a process's log holds when it died of a fatal signal (faulthandler's header, which the log
#: filter points into that log)
_FATAL = "Fatal Python error"
#: dead owners' fatal logs kept at most (the oldest go first)
_CRASHES_KEPT = 10
_crashes: list[tuple[Path, str, str]] = []  # (kept log, the dead owner's pid, how it died)


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
            kept = _keep_fatal_log(path)
            if kept is not None:
                _crashes.append(kept)
            shutil.rmtree(path, ignore_errors=True)
            removed.append(path)
    return removed


def crash_dir() -> Path:
    """Where the fatal logs of dead owners are kept: ``$XDG_CACHE_HOME/tfmagic/crashes`` (or ``~/.cache``)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "tfmagic" / "crashes"


def _keep_fatal_log(directory: Path) -> tuple[Path, str, str] | None:
    """Copy a dead owner's log to :func:`crash_dir` when it says the owner died of a fatal signal;
    the copy, the owner's pid and the line that says how it died."""
    log = directory / _KERNEL_LOG
    try:
        how = next((ln.strip() for ln in log.read_text(errors="replace").splitlines() if _FATAL in ln), None)
        if how is None:
            return None
        pid = (directory / _OWNER_FILE).read_text().split()[0]
        when = time.strftime("%Y%m%d-%H%M%S", time.localtime(log.stat().st_mtime))
        target = crash_dir()
        target.mkdir(parents=True, exist_ok=True)
        kept = target / f"kernel-{pid}-{when}.log"
        shutil.copyfile(log, kept)
        for old in sorted(target.glob("kernel-*.log"), key=lambda p: p.stat().st_mtime)[:-_CRASHES_KEPT]:
            old.unlink(missing_ok=True)
        return kept, pid, how
    except (OSError, IndexError):
        return None  # keeping it is a courtesy; the sweep goes on


def crashes() -> list[tuple[Path, str, str]]:
    """The fatal logs kept by this process's sweeps: (the copy, the dead owner's pid, the line that
    says how it died), each reported once."""
    found, _crashes[:] = list(_crashes), []
    return found


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
    return runtime_dir() / _KERNEL_LOG


def cleanup() -> None:
    """Kill everything this process started and remove its private directory."""
    kill_all()
    if _runtime_dir is not None:
        shutil.rmtree(_runtime_dir, ignore_errors=True)


atexit.register(cleanup)
