"""Everything this process started, so that nothing outlives it.

Each task process already ends itself when its owner's channel closes (see
:mod:`tfmagic.task_main`); this registry is the orderly half: it kills every
task and spare at interpreter exit, on ``%unload_ext`` and on kernel shutdown,
and lets tests check that nothing is left.
"""

from __future__ import annotations

import atexit
import tempfile
import threading
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from .launchers.base import TaskProcess

_lock = threading.Lock()
_strong: dict[int, TaskProcess] = {}
_runtime_dir: Path | None = None


def register(proc: TaskProcess) -> None:
    with _lock:
        _strong[proc.pid] = proc


def forget(proc: TaskProcess) -> None:
    with _lock:
        _strong.pop(proc.pid, None)


def processes() -> list[TaskProcess]:
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


def runtime_dir() -> Path:
    """A private directory for this owner's logs (removed at exit)."""
    global _runtime_dir
    with _lock:
        if _runtime_dir is None or not _runtime_dir.exists():
            _runtime_dir = Path(tempfile.mkdtemp(prefix="tfmagic-"))
        return _runtime_dir


def cleanup() -> None:
    """Kill everything this process started and remove its private directory."""
    _cleanup()


def _cleanup() -> None:
    kill_all()
    if _runtime_dir is not None:
        import shutil

        shutil.rmtree(_runtime_dir, ignore_errors=True)


atexit.register(_cleanup)
