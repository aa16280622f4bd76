"""Task processes on this machine: one spawned Python process per task, or several tasks a process."""

from __future__ import annotations

import math
import os
import subprocess
import sys

from ..errors import BadArgument
from ..network import ports
from .base import TaskHandle
from .channel import TaskProcess
from .process import TASK_ENV, PopenLauncher, pythonpath_with_package

#: tasks a process holds with ``processes="auto"``
AUTO_TASKS_PER_PROCESS = 16


def process_sizes(tasks: int, processes: int | str) -> list[int]:
    """How many of ``tasks`` each process holds: ``processes`` of them (or one per 16, ``"auto"``), evenly.

    >>> process_sizes(34, "auto"), process_sizes(3, 2), process_sizes(5, 9)
    ([12, 11, 11], [2, 1], [1, 1, 1, 1, 1])
    """
    n = math.ceil(tasks / AUTO_TASKS_PER_PROCESS) if processes == "auto" else min(int(processes), tasks)
    base, extra = divmod(tasks, max(1, n))
    return [base + (1 if i < extra else 0) for i in range(max(1, n))]


def check_processes(processes, tasks: int) -> int | str | None:
    """``processes`` as a start takes it: ``None``, ``"auto"`` or a whole number from 1 to ``tasks``."""
    if processes is None or processes == "auto":
        return processes
    if isinstance(processes, bool) or not isinstance(processes, (int, str)) or not str(processes).isdigit():
        raise BadArgument(f"processes must be a whole number of processes or 'auto', not {processes!r}")
    n = int(processes)
    if not 1 <= n <= tasks:
        raise BadArgument(
            f"processes={n}: the {tasks} tasks need from 1 to {tasks} processes "
            f"(1: every task in one process; {tasks}: one each, the default; 'auto': one per "
            f"{AUTO_TASKS_PER_PROCESS} tasks)"
        )
    return None if n == tasks else n


def check_shared(processes, tasks: int, options: dict) -> int | str | None:
    """``processes`` for a LocalCluster of ``tasks`` with these other ``options``, or one line."""
    if options.get("launcher") is not None:
        raise BadArgument("processes= is for LocalCluster's own launcher; give it to LocalLauncher instead")
    if options.get("collective") or options.get("worker_gpus"):
        raise BadArgument(
            "tasks sharing processes (processes=) run on CPU and serve a parameter-server cluster: "
            "collective= and worker_gpus= need a process per task"
        )
    return check_processes(processes, tasks)


class LocalLauncher(PopenLauncher):
    """Spawns task processes on this machine (``python -m tfmagic.task_main``).

    Each process gets its own session (process group), so a kill takes its
    children along; its standard input is a pipe only this owner holds, so it
    dies with the owner, and it asks the kernel to kill it if this process
    dies while it cannot read that pipe (stopped).  With ``loopback_only=True``
    (the default) the servers are kept on 127.0.0.1 by :mod:`tfmagic.network.bindguard`
    when that is possible here.

    ``processes`` (a number, or ``"auto"``: one process per 16 tasks) puts the tasks a start
    asks for into that many processes (:mod:`tfmagic.task.host`), each task still a gRPC server
    of its own with its own channel; a task started later (a restart, an add) gets a process of
    its own. Shared processes take no warm spares, and run on CPU only.
    """

    name = "local"
    makes_spares = True

    def __init__(
        self,
        *,
        loopback_only: bool = True,
        env: dict[str, str | None] | None = None,
        python: str | list[str] | None = None,
        processes: int | str | None = None,
    ):
        super().__init__()
        self.processes = processes
        if processes is not None:
            self.makes_spares = False  # a spare is one process for one task
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

    def placement(self) -> tuple:
        return (self.name, self.processes)

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
        changes["PYTHONPATH"] = pythonpath_with_package(env.get("PYTHONPATH"))
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

    def spawn_many(self, log_paths: list[str], hosts: list[str]) -> list[TaskHandle]:
        """One process per task, or with ``processes`` set, the tasks spread over that many."""
        if self.processes is None or len(log_paths) < 2:
            return super().spawn_many(log_paths, hosts)
        out: list[TaskHandle] = []
        start = 0
        try:
            for size in process_sizes(len(log_paths), self.processes):
                out.extend(self.spawn_shared(log_paths[start : start + size]))
                start += size
        except BaseException:
            for proc in out:
                proc.kill()
            raise
        return out

    def spawn_shared(self, log_paths: list[str]) -> list[TaskProcess]:
        """One process for the tasks of ``log_paths``: a pair of pipes each, one log (each task's
        log path a link to it)."""
        if len(log_paths) == 1:
            return [self.spawn(log_paths[0])]
        first, last = (os.path.basename(p).removesuffix(".log") for p in (log_paths[0], log_paths[-1]))
        log_path = os.path.join(os.path.dirname(log_paths[0]), f"shared-{first}-to-{last}.log")
        for path in log_paths:
            if os.path.lexists(path):
                os.unlink(path)
            os.symlink(os.path.basename(log_path), path)
        ops = [os.pipe() for _ in log_paths]  # owner writes, task reads
        events = [os.pipe() for _ in log_paths]  # task writes, owner reads
        child_ends = [o[0] for o in ops] + [e[1] for e in events]
        env = self.environment()
        env["TFMAGIC_CHANNELS"] = ",".join(f"{o[0]}:{e[1]}" for o, e in zip(ops, events, strict=True))
        env["CUDA_VISIBLE_DEVICES"] = ""  # one environment for every task of the process: CPU only
        env.setdefault("MALLOC_ARENA_MAX", "2")  # glibc's arenas: 8 a core, each keeping what was freed
        note = f"tfmagic: one process for {len(log_paths)} tasks (processes=); their log is this file\n"
        try:
            popen = self._spawn_logged(
                [*self.python, "-m", "tfmagic.task_main"],
                log_path,
                env=env,
                note=note,
                handles=len(log_paths),
                stdin=subprocess.DEVNULL,  # each task's channel tells it when its owner went
                stdout=subprocess.DEVNULL,
                pass_fds=child_ends,
            )
        except BaseException:
            for o, e in zip(ops, events, strict=True):
                for fd in (*o, *e):
                    os.close(fd)
            raise
        for fd in child_ends:
            os.close(fd)
        procs = [
            TaskProcess(
                launcher=self,
                pid=popen.pid,
                host=self.host,
                to_task=os.fdopen(o[1], "wb", buffering=0),
                from_task=os.fdopen(e[0], "rb"),
                log_path=log_path,
            )
            for o, e in zip(ops, events, strict=True)
        ]
        for proc in procs:
            proc.shared_with = [p for p in procs if p is not proc]
        return procs

    # -- answered here, faster than asking the task ---------------------------
    def relay_host(self) -> str | None:
        return self.host

    def pick_port(self, proc: TaskHandle) -> int:
        return ports.free_port(self.host)

    def listening(self, proc: TaskHandle) -> list[tuple[str, int]]:
        """Seen from outside the task (its own answer could come from planted code)."""
        from ..procs.stats import listening_addresses

        return listening_addresses(proc.pid)

    def task_log(self, log_path: str) -> str | None:
        return log_path  # a task sharing a process ignores it: the process keeps one log

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
