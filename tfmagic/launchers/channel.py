"""The owner-side handle of one task process: a byte channel that speaks :mod:`tfmagic.protocol`.

Local, SSH and Spark tasks all look the same from here: two byte streams (the
task's stdin and a private copy of its stdout, carried by a pipe, an SSH
session or a relayed socket) and a launcher that knows how to kill the
process and wait for its end.  A reader thread turns the task's events into
state changes, so ``state`` is always current without polling the process;
everything the task says is also published on ``messages`` for whoever
follows it (a cluster start, a ``%%tf_px`` cell).
"""

from __future__ import annotations

import os
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import IO, TYPE_CHECKING, Any

from .. import protocol
from ..errors import WaitTimedOut
from ..events import Topic
from ..procs import owner
from ..protocol import Event, Op
from ..spec import TaskName
from .base import TaskState

if TYPE_CHECKING:
    from .base import Launcher


class TaskProcess:
    """One background process hosting (or ready to host) a task.

    A launcher creates it around the process's channel; :meth:`request`
    sends an op and waits for the event that answers it, :meth:`assign`
    gives a spare process its role.
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
        #: the other tasks' handles of the same process (``processes=``): what ends it ends them
        self.shared_with: list[TaskProcess] = []
        self._to_task = to_task
        self._from_task = from_task
        self._send_lock = threading.Lock()
        self._cond = threading.Condition()
        self._replies: dict[Any, dict[str, Any]] = {}
        self._next_id = 0
        #: every event the task sends, and a last ``{"event": "exit", "code": ...}``
        self.messages: Topic[dict[str, Any]] = Topic(f"messages of process {pid}")
        self.recent_events: deque[dict[str, Any]] = deque(maxlen=50)
        self._reader = threading.Thread(target=self._read_events, name=f"tfmagic-task-{pid}", daemon=True)
        owner.register(self)
        self._reader.start()

    # -- events ------------------------------------------------------------
    def _read_events(self) -> None:
        while True:
            try:
                line = self._from_task.readline()
            except (OSError, ValueError):  # a reset socket (a relay killed), a closed pipe: the end
                line = b""
            if not line:
                break
            msg = protocol.decode(line)
            if msg is not None:
                self._on_event(msg)
        code = self.launcher.wait_exit(self)
        with self._cond:
            self.exit_code = code
            if self.state is not TaskState.FAILED:
                self.state = TaskState.EXITED
            self._cond.notify_all()
        owner.forget(self)
        self.messages.publish({"event": Event.EXIT, "code": code})

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
        self.messages.publish(msg)

    def wait_for(self, predicate: Callable[[], bool], timeout: float | None) -> bool:
        """Block until ``predicate()`` holds (checked under the state lock)."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while not predicate():
                remaining = None if deadline is None else deadline - time.monotonic()
                if remaining is not None and remaining <= 0:
                    return False
                self._cond.wait(0.25 if remaining is None else min(remaining, 0.25))
            return True

    # -- ops ---------------------------------------------------------------
    def send(self, op: Op, **fields: Any) -> None:
        fields["op"] = op
        with self._send_lock:
            try:
                protocol.send(self._to_task, fields)
            except (BrokenPipeError, OSError, ValueError):
                pass  # the reader thread will see the exit

    def request(self, op: Op, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        """Send ``op`` and wait for the event that answers it."""
        with self._cond:
            self._next_id += 1
            rid = f"{os.getpid()}-{self._next_id}"
        self.send(op, id=rid, **fields)
        if not self.wait_for(lambda: rid in self._replies or not self.alive, timeout):
            with self._cond:
                self._replies.pop(rid, None)
            raise WaitTimedOut(f"{self.label} did not answer {op!r} within {timeout:g} s")
        with self._cond:
            reply = self._replies.pop(rid, None)
        if reply is None:
            raise ProcessLookupError(f"{self.label} ended before answering {op!r}")
        return reply

    def forget_reply(self, rid: Any) -> None:
        """Drop the answer to ``rid`` (a ``%%tf_px`` cell's, which it reads from ``messages``)."""
        with self._cond:
            self._replies.pop(rid, None)

    def assign(self, task: TaskName, cluster: dict[str, list[str]], **fields: Any) -> None:
        """Give this process its role; the answer arrives as an event."""
        with self._cond:
            self.task = task
            self.port = int(cluster[task.job][task.index].rsplit(":", 1)[1])
            self.state = TaskState.ASSIGNING
            if fields.get("log"):
                self.log_path = fields["log"]
        self.send(Op.ASSIGN, job=task.job, index=task.index, cluster=cluster, **fields)

    @property
    def alive(self) -> bool:
        return self.exit_code is None and self.state not in (TaskState.EXITED, TaskState.KILLED)

    def cut_off(self, timeout: float = 5.0) -> int:
        """Kill a task that shares its process alone, as modelled: its server is cut off
        (:func:`tfmagic.task.server.cut_off`), its process serves the others on. From then on it is
        not alive, as a killed process is not; :meth:`revive` readies it for its role again.
        Returns how many sockets were cut."""
        reply = self.request(Op.CUT, timeout=timeout)
        if reply.get("event") != Event.CUT:
            raise ProcessLookupError(reply.get("message") or f"{self.label} could not be cut off")
        self.mark_cut_off()
        return int(reply.get("sockets") or 0)

    def mark_cut_off(self) -> None:
        """Its server is cut off (:meth:`cut_off`), or a new one failed to start (a restart's)."""
        with self._cond:
            if self.exit_code is None:
                self.state = TaskState.KILLED
            self._cond.notify_all()

    def revive(self) -> None:
        """A task cut off (:meth:`cut_off`) waits for its role again, as a warm spare does."""
        with self._cond:
            if self.state is TaskState.KILLED and self.exit_code is None:
                self.state = TaskState.SPARE
            self._cond.notify_all()

    @property
    def label(self) -> str:
        who = self.task if self.task is not None else "spare process"
        return f"{who} (pid {self.pid})"

    def close_channel(self) -> None:
        """Close this handle's two streams (the process ended; a shared one's streams are its own)."""
        for stream in (self._to_task, self._from_task):
            try:
                stream.close()
            except (OSError, ValueError):
                pass

    def kill(self) -> None:
        """End the process and everything it started, now; safe to call twice."""
        self.launcher.kill(self)

    def join(self, timeout: float | None = 5.0) -> bool:
        self._reader.join(timeout)
        return not self._reader.is_alive()

    def log_tail(self, lines: int = 20) -> str:
        return self.launcher.read_log(self, tail=lines)
