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
        self.log_path = log_path
        self.spawned_at = time.time()
        self.warm_at: float | None = None
        self.running_at: float | None = None
        self.import_s: float | None = None
        self.tf_version: str | None = None
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
            if event == protocol.WARM:
                self.warm_at = time.time()
                self.import_s = msg.get("import_s")
                self.tf_version = msg.get("tf_version")
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

    Subclasses implement :meth:`spawn`, :meth:`kill`, :meth:`wait_exit`,
    :meth:`read_log` and :meth:`pick_port`.  ``signature`` says which spare
    processes are interchangeable: a spare made by a launcher with another
    signature (other environment, other host) is never given a role here.
    """

    name = "base"
    host = "127.0.0.1"

    @property
    def signature(self) -> tuple:
        return (self.name, self.host)

    def spawn(self, log_path: str) -> TaskProcess:  # pragma: no cover - interface
        raise NotImplementedError

    def kill(self, proc: TaskProcess) -> None:  # pragma: no cover - interface
        raise NotImplementedError

    def wait_exit(self, proc: TaskProcess) -> int | None:  # pragma: no cover - interface
        raise NotImplementedError

    def read_log(self, proc: TaskProcess, tail: int | None = None) -> str:  # pragma: no cover
        raise NotImplementedError

    def pick_port(self) -> int:  # pragma: no cover - interface
        raise NotImplementedError

    def security_note(self) -> str:
        return ""
