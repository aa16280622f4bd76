"""Task processes on this machine: one spawned Python process per task."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
from pathlib import Path

from .base import Launcher, TaskProcess

_PACKAGE_PARENT = str(Path(__file__).resolve().parents[2])

#: Environment every task process gets.  GRPC_FAIL_FAST=use_caller lets a
#: caller (ClusterCoordinator) decide to retry on another worker instead of
#: hanging on a dead one; TF_CONFIG from the owner would mislead the task.
TASK_ENV = {
    "GRPC_FAIL_FAST": "use_caller",
    "PYTHONUNBUFFERED": "1",
    "TF_CONFIG": None,
}


def read_tail(path: str, tail: int | None) -> str:
    """The last ``tail`` lines of a text file (all of it for ``None``)."""
    try:
        with open(path, "rb") as f:
            if tail is None:
                data = f.read()
            else:
                f.seek(0, os.SEEK_END)
                size = f.tell()
                block, data = 8192, b""
                while size > 0 and data.count(b"\n") <= tail:
                    step = min(block, size)
                    size -= step
                    f.seek(size)
                    data = f.read(step) + data
                    block *= 2
                data = b"\n".join(data.splitlines()[-tail:]) if tail else b""
    except FileNotFoundError:
        return ""
    return data.decode("utf-8", "replace")


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now (it may be taken before we bind it:
    the cluster retries with fresh ports when that happens)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


class LocalLauncher(Launcher):
    """Spawns task processes on this machine (``python -m tfmagic.task_main``).

    Each process gets its own session (process group), so a kill takes its
    children along; its standard input is a pipe only this owner holds, so it
    dies with the owner.  With ``loopback=True`` (the default) the servers are
    kept on 127.0.0.1 by :mod:`tfmagic.loopback` when that is possible here.
    """

    name = "local"

    def __init__(
        self,
        *,
        loopback_only: bool = True,
        env: dict[str, str | None] | None = None,
        python: str | list[str] | None = None,
    ):
        self.host = "127.0.0.1"
        if python is None:
            python = [sys.executable]
        self.python = [python] if isinstance(python, str) else list(python)
        self.guard = None
        if loopback_only:
            from .. import loopback

            self.guard = loopback.bind_guard(self.host)
        self.extra_env = dict(env or {})
        self._procs: dict[int, subprocess.Popen] = {}
        self._lock = threading.Lock()

    @property
    def signature(self) -> tuple:
        return (
            self.name,
            self.host,
            bool(self.guard and self.guard.available),
            tuple(sorted((k, str(v)) for k, v in self.extra_env.items())),
            tuple(self.python),
        )

    @property
    def loopback_only(self) -> bool:
        return bool(self.guard and self.guard.available)

    def environment(self) -> dict[str, str]:
        env = dict(os.environ)
        changes: dict[str, str | None] = dict(TASK_ENV)
        changes.update(self.extra_env)
        if self.guard is not None and self.guard.available:
            from .. import loopback

            changes.update(loopback.bind_guard(self.host, base_env=env).env)
        path = env.get("PYTHONPATH", "")
        changes["PYTHONPATH"] = _PACKAGE_PARENT + (os.pathsep + path if path else "")
        for key, value in changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def spawn(self, log_path: str, host: str | None = None) -> TaskProcess:
        log = open(log_path, "ab")  # noqa: SIM115 - handed to the child
        try:
            popen = subprocess.Popen(
                [*self.python, "-m", "tfmagic.task_main"],
                stdin=subprocess.PIPE,
                stdout=subprocess.PIPE,
                stderr=log,
                env=self.environment(),
                start_new_session=True,
                close_fds=True,
                cwd=os.getcwd(),
            )
        finally:
            log.close()
        with self._lock:
            self._procs[popen.pid] = popen
        return TaskProcess(
            launcher=self,
            pid=popen.pid,
            host=self.host,
            to_task=popen.stdin,
            from_task=popen.stdout,
            log_path=log_path,
        )

    def kill(self, proc: TaskProcess) -> None:
        popen = self._procs.get(proc.pid)
        if popen is None or popen.poll() is not None:
            return
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            try:
                popen.kill()
            except ProcessLookupError:
                pass
        try:
            popen.wait(timeout=10)
        except subprocess.TimeoutExpired:  # pragma: no cover - SIGKILL does not take 10 s
            pass

    def wait_exit(self, proc: TaskProcess) -> int | None:
        popen = self._procs.get(proc.pid)
        if popen is None:
            return None
        code = popen.wait()
        for stream in (popen.stdin, popen.stdout):
            try:
                stream.close()
            except (OSError, ValueError, BrokenPipeError):
                pass
        with self._lock:
            self._procs.pop(proc.pid, None)
        return code

    def read_log(self, proc: TaskProcess, tail: int | None = None) -> str:
        return read_tail(proc.log_path, tail)

    def security_note(self) -> str:
        if self.loopback_only:
            return (
                "task servers listen on 127.0.0.1 only, but run any TensorFlow graph "
                "sent to them by anyone on this machine"
            )
        reason = self.guard.reason if self.guard is not None else "loopback_only=False was asked for"
        return (
            "task servers listen on EVERY network interface and run any TensorFlow graph "
            f"sent to them ({reason})"
        )
