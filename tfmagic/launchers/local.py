"""Task processes on this machine: one spawned Python process per task."""

from __future__ import annotations

import os
import sys

from ..network import ports
from .base import TaskHandle
from .channel import TaskProcess
from .process import PACKAGE_PARENT, TASK_ENV, PopenLauncher


class LocalLauncher(PopenLauncher):
    """Spawns task processes on this machine (``python -m tfmagic.task_main``).

    Each process gets its own session (process group), so a kill takes its
    children along; its standard input is a pipe only this owner holds, so it
    dies with the owner, and it asks the kernel to kill it if this process
    dies while it cannot read that pipe (stopped).  With ``loopback_only=True``
    (the default) the servers are kept on 127.0.0.1 by :mod:`tfmagic.network.bindguard`
    when that is possible here.
    """

    name = "local"
    makes_spares = True

    def __init__(
        self,
        *,
        loopback_only: bool = True,
        env: dict[str, str | None] | None = None,
        python: str | list[str] | None = None,
    ):
        super().__init__()
        self.host = "127.0.0.1"
        if python is None:
            python = [sys.executable]
        self.python = [python] if isinstance(python, str) else list(python)
        self.guard = None
        if loopback_only:
            from ..network import bindguard

            self.guard = bindguard.bind_guard(self.host)
        self.extra_env = dict(env or {})

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
            from ..network import bindguard

            changes.update(bindguard.bind_guard(self.host, base_env=env).env)
        path = env.get("PYTHONPATH", "")
        changes["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + path if path else "")
        # the task dies with this process even while it cannot read its channel (SIGSTOP)
        changes["TFMAGIC_PDEATHSIG"] = "1"
        changes["TFMAGIC_OWNER_PID"] = str(os.getpid())
        for key, value in changes.items():
            if value is None:
                env.pop(key, None)
            else:
                env[key] = value
        return env

    def spawn(self, log_path: str, host: str | None = None) -> TaskProcess:
        return self._start(
            [*self.python, "-m", "tfmagic.task_main"], log_path, host=self.host, env=self.environment()
        )

    # -- answered here, faster than asking the task ---------------------------
    def pick_port(self, proc: TaskHandle) -> int:
        return ports.free_port(self.host)

    def listening(self, proc: TaskHandle) -> list[tuple[str, int]]:
        """Seen from outside the task (its own answer could come from planted code)."""
        from ..procs.stats import listening_addresses

        return listening_addresses(proc.pid)

    def task_log(self, log_path: str) -> str | None:
        return log_path

    def stats(self, proc: TaskHandle, memory: bool = True) -> dict | None:
        if not proc.alive:
            return None
        from ..procs.stats import cpu_percent, memory_of, run_state, uptime

        mem = (memory_of(proc.pid) or {}) if memory else {}
        return {
            "cpu_percent": cpu_percent(proc.pid),
            "pss": mem.get("pss"),
            "rss": mem.get("rss"),
            "uptime_s": uptime(proc.pid),
            "run_state": run_state(proc.pid),
        }

    def security_note(self) -> str:
        if self.loopback_only:
            from ..network.bindguard import peers_checkable

            if peers_checkable():
                return (
                    "task servers listen on 127.0.0.1 only and admit your own processes only, "
                    "but run any TensorFlow graph those send"
                )
            return (
                "task servers listen on 127.0.0.1 only, but run any TensorFlow graph sent to them by "
                "anyone on this machine (its socket table, /proc/net/tcp, cannot be read here)"
            )
        reason = self.guard.reason if self.guard is not None else "loopback_only=False was asked for"
        return (
            "task servers listen on EVERY network interface and run any TensorFlow graph "
            f"sent to them ({reason})"
        )
