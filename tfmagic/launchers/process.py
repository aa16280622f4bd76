"""Process plumbing shared by the launchers that start child processes here (local, SSH).

* :data:`TASK_ENV`: the environment every task process gets;
* :class:`PopenLauncher`: the bookkeeping of child processes (start, kill
  with everything they started, wait, read their log), which
  :class:`~tfmagic.launchers.local.LocalLauncher` and
  :class:`~tfmagic.launchers.ssh.SSHLauncher` extend;
* :func:`spawn`: every child starts from one long-lived thread (see there).
"""

from __future__ import annotations

import concurrent.futures
import os
import queue
import signal
import subprocess
import threading
from pathlib import Path
from typing import Any

from ..logs import read_tail
from ..network import clientserver
from .base import Launcher, TaskHandle
from .channel import TaskProcess

__all__ = [
    "PACKAGE_PARENT",
    "TASK_ENV",
    "PopenLauncher",
    "kill_tree",
    "pythonpath_with_package",
    "read_tail",
    "spawn",
]

#: The directory holding the ``tfmagic`` package: put on a task's PYTHONPATH, so a
#: checkout that is not installed runs the same code in its tasks.
PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])


#: Environment every task process gets.  GRPC_FAIL_FAST=use_caller lets a
#: caller (ClusterCoordinator) decide to retry on another worker instead of
#: hanging on a dead one; TF_CONFIG from the owner would mislead the task.
def pythonpath_with_package(current: str | None) -> str:
    """``PYTHONPATH`` with :data:`PACKAGE_PARENT` first: a child finds this tfmagic, installed or not."""
    return PACKAGE_PARENT + (os.pathsep + current if current else "")


TASK_ENV: dict[str, str | None] = {
    "GRPC_FAIL_FAST": "use_caller",
    "PYTHONUNBUFFERED": "1",
    "TF_CONFIG": None,
    **clientserver.GRPC_ENV,  # a polling thread per completion queue: 4, not 64
}


class _Spawner:
    """Starts child processes from one thread that lives as long as this process.

    A task process asks the kernel to SIGKILL it when its parent goes away
    (``PR_SET_PDEATHSIG``, see :mod:`tfmagic.task_main`): that ends even a
    task someone stopped with SIGSTOP, which cannot read the end of its
    channel.  Linux ties that signal to the *thread* that started the child,
    so a task started from a short-lived thread (the spare pool's) would die
    with that thread; started from here, it dies with its owner.
    """

    def __init__(self) -> None:
        self._jobs: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None
        self._lock = threading.Lock()

    def popen(self, *args: Any, **kwargs: Any) -> subprocess.Popen:
        if threading.current_thread() is self._thread:
            return subprocess.Popen(*args, **kwargs)
        with self._lock:
            if self._thread is None or not self._thread.is_alive():
                self._thread = threading.Thread(target=self._run, name="tfmagic-spawner", daemon=True)
                self._thread.start()
        future: concurrent.futures.Future = concurrent.futures.Future()
        self._jobs.put((future, args, kwargs))
        return future.result()

    def _run(self) -> None:
        while True:
            future, args, kwargs = self._jobs.get()
            try:
                future.set_result(subprocess.Popen(*args, **kwargs))
            except BaseException as exc:  # noqa: BLE001 - handed to the caller
                future.set_exception(exc)


_spawner = _Spawner()


def spawn(argv: list[str], **kwargs: Any) -> subprocess.Popen:
    """``subprocess.Popen(argv, **kwargs)`` from the spawner thread (no fork of this
    process's Python: ``subprocess`` forks and execs at once, in C)."""
    return _spawner.popen(argv, **kwargs)


def kill_tree(pid: int) -> None:
    """SIGKILL a process, everything it started (also in new sessions) and its process group."""
    import psutil

    try:
        children = psutil.Process(pid).children(recursive=True)
    except psutil.Error:
        children = []
    for child in children:
        try:
            child.kill()
        except psutil.Error:
            pass
    try:
        os.killpg(pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


class PopenLauncher(Launcher):
    """Tasks whose process (or whose ``ssh`` client) is a child of this process."""

    def __init__(self) -> None:
        self._procs: dict[int, subprocess.Popen] = {}
        #: how many task handles a process still has (several when tasks share it: ``processes=``)
        self._handles: dict[int, int] = {}
        self._lock = threading.Lock()

    def _spawn_logged(
        self,
        argv: list[str],
        log_path: str,
        *,
        env: dict[str, str] | None,
        note: str = "",
        handles: int = 1,
        **popen,
    ) -> subprocess.Popen:
        """Start ``argv`` in a session of its own, its stderr into ``log_path`` after ``note``; remembered
        as the process of ``handles`` task handles (several when tasks share it: ``processes=``)."""
        if os.path.islink(log_path):  # a link to a shared process's log (processes=): a log of its own now
            os.unlink(log_path)
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            if note:
                log.write(note.encode())
                log.flush()
            popen = spawn(argv, stderr=log, env=env, start_new_session=True, close_fds=True, **popen)
        finally:
            log.close()
        with self._lock:
            self._procs[popen.pid] = popen
            self._handles[popen.pid] = handles
        return popen

    def _start(
        self, argv: list[str], log_path: str, *, host: str, env: dict[str, str] | None = None, note: str = ""
    ) -> TaskProcess:
        """Start ``argv`` with its stdin/stdout as the task's channel and its stderr into ``log_path``."""
        popen = self._spawn_logged(
            argv, log_path, env=env, note=note, stdin=subprocess.PIPE, stdout=subprocess.PIPE
        )
        return TaskProcess(
            launcher=self,
            pid=popen.pid,
            host=host,
            to_task=popen.stdin,
            from_task=popen.stdout,
            log_path=log_path,
        )

    def _popen(self, proc: TaskHandle) -> subprocess.Popen | None:
        popen = self._procs.get(proc.pid) if proc.pid is not None else None
        return popen if popen is not None and popen.poll() is None else None

    def kill(self, proc: TaskHandle) -> None:
        popen = self._popen(proc)
        if popen is None:
            return
        self._end(proc, popen)
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not take 10 s
            pass

    def _end(self, proc: TaskHandle, popen: subprocess.Popen) -> None:
        """How a child ends at once: SIGKILL for it and everything it started."""
        kill_tree(popen.pid)

    def wait_exit(self, proc: TaskHandle) -> int | None:
        popen = self._procs.get(proc.pid) if proc.pid is not None else None
        if popen is None:
            return None
        code = popen.wait()
        if getattr(proc, "shared_with", None):
            proc.close_channel()  # its own pipes; the process's are no channel
        for stream in (popen.stdin, popen.stdout):
            try:
                if stream is not None:
                    stream.close()
            except (OSError, ValueError):
                pass
        with self._lock:
            self._handles[proc.pid] = self._handles.get(proc.pid, 1) - 1
            if self._handles[proc.pid] <= 0:  # the last handle of the process: forget it
                self._procs.pop(proc.pid, None)
                self._handles.pop(proc.pid, None)
        return code
