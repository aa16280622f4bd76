"""Tasks tfmagic did not start (an attached cluster): addresses, alive while they answer.

Stands where a launcher and its process handles would: there is nothing to
start, kill or read, and each of those says so (:class:`~tfmagic.errors.NotOwned`)
instead of failing somewhere deeper.  All tfmagic can know of a process it
does not own is whether its port answers, checked at most once a second.
"""

from __future__ import annotations

import time
from typing import Any

from ..errors import NotOwned
from ..events import Topic
from ..network import ports
from ..spec import TaskName
from .base import Launcher, TaskHandle, TaskState


class AttachedTask:
    """A task tfmagic did not start: an address, alive while it accepts connections."""

    state = TaskState.RUNNING
    pid = task_pid = None
    exit_code = None
    failure = None
    destination = None
    bind_host = None
    log_path = ""

    def __init__(self, address: str, task: TaskName | None = None) -> None:
        self.address = address
        self.task = task
        self.host = address.rsplit(":", 1)[0]
        self.messages: Topic[dict[str, Any]] = Topic(f"messages of {address}")
        self._checked = 0.0
        self._alive = True

    @property
    def alive(self) -> bool:
        now = time.monotonic()
        if now - self._checked > 1.0:
            self._checked = now
            self._alive = ports.port_answers(self.address, timeout=1.0)
        return self._alive

    @property
    def label(self) -> str:
        return f"the task at {self.address}"

    def log_tail(self, lines: int = 20) -> str:
        return ""

    def request(self, op: str, timeout: float = 10.0, **fields: Any) -> dict[str, Any]:
        raise NotOwned(f"{self.label} was not started by tfmagic; it cannot be asked to {op}")

    def send(self, op: str, **fields: Any) -> None:
        raise NotOwned(f"{self.label} was not started by tfmagic; it cannot be asked to {op}")

    def kill(self) -> None:
        raise NotOwned(f"{self.label} was not started by tfmagic, which leaves it running")


class AttachedLauncher(Launcher):
    """Nothing to start, nothing to kill: the tasks belong to whoever started them."""

    name = "attached"

    def placement(self) -> tuple:
        return (self.name,)

    def describe(self) -> str:
        return ", attached"

    def spawn(self, log_path: str, host: str | None = None) -> TaskHandle:
        raise NotOwned("tfmagic did not start this cluster and cannot start tasks in it")

    def kill(self, proc: TaskHandle) -> None:
        raise NotOwned(f"{proc.label} was not started by tfmagic, which leaves it running")

    def wait_exit(self, proc: TaskHandle) -> int | None:
        return None

    def read_log(self, proc: TaskHandle, tail: int | None = None) -> str:
        return (
            f"(tfmagic did not start {proc.label}; its log is wherever it was started, "
            "for example the terminal or the scheduler's output file)"
        )

    def stats(self, proc: TaskHandle, memory: bool = True) -> dict[str, Any] | None:
        return None

    def listening(self, proc: TaskHandle) -> list[tuple[str, int]]:
        return []

    def security_note(self) -> str:
        return (
            "tfmagic did not start these servers and cannot limit who reaches them: TensorFlow servers run "
            "any graph anyone who can reach their port sends"
        )
