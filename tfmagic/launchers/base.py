"""The launcher contract and the owner-side handle of one task process."""

from __future__ import annotations

import enum
import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, Any

from .. import owner, protocol
from ..spec import TaskName


class TaskState(str, enum.Enum):
    """Life of a task process, as the owner sees it."""

    IMPORTING = "importing"  # started, importing TensorFlow
    SPARE = "spare"  # TensorFlow imported, waiting for a role
    ASSIGNING = "starting"  # role sent, server not up yet
    RUNNING = "running"  # server accepts connections
    FAILED = "failed"  # could not take its role
    EXITED = "exited"  # process ended

    def __str__(self) -> str:
        return self.value


class TaskProcess:
    """Owner-side handle of one background process hosting (or ready to host) a task.

    A launcher creates it around a byte channel (the process's stdin and
    stdout); a reader thread turns the task's events into state changes, so
    ``state`` is always current without polling the process.
    """

    def __init__(
        self,
        *,
        launcher: Launcher,
        pid: int,
        host: str,
        to_task: IO[bytes],
        from_task: IO[bytes],
        log_path: str,
    ) -> None:
        self.launcher = launcher
        self.pid = pid
        self.host = host
        #: The address its server binds to when it must be one interface only ("" = any).
        self.bind_host: str | None = None
        #: The pid on the task's own host (differs from ``pid`` for remote launchers).
        self.task_pid: int = pid
        self.task_hostname: str | None = None
        #: How the launcher reaches the task's host (an SSH destination, a Spark executor).
        self.destination: str | None = None
        self.guard_failed: str | None = None
        self.log_path = log_path
        self.spawned_at = time.time()
        self.warm_at: float | None = None
        self.running_at: float | None = None
        self.import_s: float | None = None
        self.tf_version: str | None = None
        #: whether the task has TensorFlow's whole Python API (else only its server core)
        self.api_complete = False
        self.task: TaskName | None = None
        self.port: int | None = None
        self.state = TaskState.IMPORTING
        self.exit_code: int | None = None
        self.failure: str | None = None
        self._to_task = to_task
        self._from_task = from_task
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[Any, dict[str, Any]] = {}
        self._next_id = 0
        self.listeners: list[Callable[[TaskProcess, dict[str, Any]], None]] = []
        self.recent_events: deque[dict[str, Any]] = deque(maxlen=50)
        self._reader = threading.Thread(target=self._read_events, name=f"tfmagic-task-{pid}", daemon=True)
        owner.register(self)
        self._reader.start()

    # -- events ------------------------------------------------------------
    def _read_events(self) -> None:
        for line in iter(self._from_task.readline, b""):
            msg = protocol.decode(line)
            if msg is None:
                continue
            self._on_event(msg)
        code = self.launcher.wait_exit(self)
        with self._cond:
            self.exit_code = code
            if self.state is not TaskState.FAILED:
                self.state = TaskState.EXITED
            self._cond.notify_all()
        owner.forget(self)
        for listener in list(self.listeners):
            listener(self, {"event": "exit", "code": code})

    def _on_event(self, msg: dict[str, Any]) -> None:
        event = msg.get("event")
        with self._cond:
            self.recent_events.append(msg)
            if event == protocol.HELLO:
                self.task_pid = msg.get("pid") or self.pid
                self.task_hostname = msg.get("host")
                self.guard_failed = msg.get("guard_failed")
                if msg.get("bind_host"):
                    self.bind_host = msg["bind_host"]
            elif event == protocol.WARM:
                self.warm_at = time.time()
                self.import_s = msg.get("import_s")
                self.tf_version = msg.get("tf_version")
                self.api_complete = bool(msg.get("api", True))
                if self.state is TaskState.IMPORTING:
                    self.state = TaskState.SPARE
            elif event == protocol.READY:
                self.state = TaskState.RUNNING
                self.running_at = time.time()
            elif event in (protocol.ASSIGN_FAILED, protocol.FATAL):
                self.state = TaskState.FAILED
                self.failure = msg.get("message")
            if msg.get("id") is not None:
                self._replies[msg["id"]] = msg
            self._cond.notify_all()
        for listener in list(self.listeners):
            listener(self, msg)

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``predicate()`` holds (checked under the state lock)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not predicate():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(remaining if remaining is None else min(remaining, 0.25))
            return True

    # -- ops ---------------------------------------------------------------
    def send(self, op: str, **fields: Any) -> None:
        fields["op"] = op
        with self._send_lock:
            try:
                protocol.send(self._to_task, fields)
            except (BrokenPipeError, OSError, ValueError):
                pass  # the reader thread will see the exit

    def request(self, op: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        """Send ``op`` and wait for the event that answers it."""
        with self._cond:
            self._next_id += 1
            rid = f"{os.getpid()}-{self._next_id}"
        self.send(op, id=rid, **fields)
        if not self.wait_for(lambda: rid in self._replies or not self.alive, timeout):
            raise TimeoutError(f"{self.label} did not answer {op!r} within {timeout:g} s")
        with self._cond:
            reply = self._replies.pop(rid, None)
        if reply is None:
            raise ProcessLookupError(f"{self.label} ended before answering {op!r}")
        return reply

    def assign(self, task: TaskName, cluster: dict[str, list[str]], **fields: Any) -> None:
        """Give this process its role; the answer arrives as an event."""
        with self._cond:
            self.task = task
            self.port = int(cluster[task.job][task.index].rsplit(":", 1)[1])
            self.state = TaskState.ASSIGNING
            if fields.get("log"):
                self.log_path = fields["log"]
        self.send("assign", job=task.job, index=task.index, cluster=cluster, **fields)

    @property
    def alive(self) -> bool:
        return self.exit_code is None and self.state is not TaskState.EXITED

    @property
    def label(self) -> str:
        who = str(self.task) if self.task is not None else "spare process"
        return f"{who} (pid {self.pid})"

    def kill(self) -> None:
        """End the process and its group now; safe to call twice."""
        self.launcher.kill(self)

    def join(self, timeout: float | None = 5.0) -> bool:
        self._reader.join(timeout)
        return not self._reader.is_alive()

    def log_tail(self, lines: int = 20) -> str:
        return self.launcher.read_log(self, tail=lines)


class Launcher:
    """How task processes are started, killed and read on one kind of host.

    Subclasses implement :meth:`spawn`, :meth:`kill`, :meth:`wait_exit` and
    :meth:`read_log`; the rest has defaults for processes on this machine.
    ``signature`` says which spare processes are interchangeable: a spare made
    by a launcher with another signature (other environment, other host) is
    never given a role here.

    A *remote* launcher (SSH, Spark) runs tasks where this process cannot see
    their pids: it picks ports, measures and kills through the task's own
    channel (:meth:`pick_port`, :meth:`stats`, :meth:`kill` ask the task), and
    the task's log streams back over that channel instead of being a file the
    task writes (:meth:`task_log` is ``None``).
    """

    name = "base"
    host = "127.0.0.1"
    #: Tasks run where their pid means nothing here.
    remote = False
    #: Warm spare processes (see :mod:`tfmagic.pool`) make sense for this launcher.
    spares = True

    @property
    def signature(self) -> tuple:
        return (self.name, self.host)

    def hosts_for(self, count: int) -> list[str]:
        """Where each of ``count`` tasks goes (the host part of its address)."""
        return [self.host] * count

    def spawn(self, log_path: str, host: str | None = None) -> TaskProcess:  # pragma: no cover
        raise NotImplementedError

    def spawn_many(self, log_paths: list[str], hosts: list[str]) -> list[TaskProcess]:
        """Start one process per log path, on the given hosts (Spark starts them as one job)."""
        return [self.spawn(log, host) for log, host in zip(log_paths, hosts)]

    def kill(self, proc: TaskProcess) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def wait_exit(self, proc: TaskProcess) -> int | None:  # pragma: no cover - interface
        raise NotImplementedError

    def read_log(self, proc: TaskProcess, tail: int | None = None) -> str:  # pragma: no cover
        raise NotImplementedError

    def pick_port(self, proc: TaskProcess | None = None) -> int:
        """A free port for ``proc``'s server, on its host; the task answers for remote launchers."""
        if proc is None or not self.remote:
            from .local import free_port

            return free_port(self.host)
        return int(proc.request("free_port", timeout=30.0, host=proc.bind_host or "")["port"])

    def prepare(self, cluster: dict[str, list[str]], procs: dict) -> None:
        """Called once the addresses are chosen, before any task takes its role (tunnels go here)."""

    def task_log(self, log_path: str) -> str | None:
        """The log file the task itself writes (``None``: its stderr comes back to us)."""
        return None if self.remote else log_path

    def stats(self, proc: TaskProcess, memory: bool = True) -> dict[str, Any] | None:
        """``{"cpu_percent", "pss", "rss", "uptime_s"}`` of a live task, or ``None``.

        ``memory=False`` leaves out PSS and RSS (None) where that saves work:
        PSS walks every mapping of the process (about 45 ms for a TensorFlow
        task here), which a dashboard refreshing twice a second cannot afford.
        """
        if not proc.alive:
            return None
        if self.remote:
            try:
                reply = proc.request("stats", timeout=3.0)
            except (TimeoutError, ProcessLookupError):
                return None
            return {k: reply.get(k) for k in ("cpu_percent", "pss", "rss", "uptime_s")}
        from ..procstats import cpu_percent, memory_of, uptime

        mem = (memory_of(proc.pid) or {}) if memory else {}
        return {
            "cpu_percent": cpu_percent(proc.pid),
            "pss": mem.get("pss"),
            "rss": mem.get("rss"),
            "uptime_s": uptime(proc.pid),
        }

    def client_address(self, cluster: Any) -> str | None:
        """``host:port`` where the tasks reach this process as a client (``None``: TF's default,
        ``localhost``, which works while every task shares this machine's loopback)."""
        return None

    #: True when something outside TensorFlow (an SSH tunnel) forwards to the client
    #: address's port, so the client may not move to another port (see client.connect).
    client_port_fixed: bool = False

    def diagnose(self, proc: TaskProcess, log_tail: str) -> str:
        """What the user should do about a task that did not come up ("" if nothing to add)."""
        return ""

    def close(self) -> None:
        """End anything the launcher itself holds (tunnels, a Spark job); tasks are killed apart."""

    def security_note(self) -> str:
        return ""
