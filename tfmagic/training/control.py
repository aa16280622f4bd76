"""How a run's threads learn that it should end, and why."""

from __future__ import annotations

import threading

from ..errors import TrainingError


class Control:
    """A run's stop flag, the condition its threads wait on, and the error that ended it (if any)."""

    def __init__(self) -> None:
        self.stopped = threading.Event()
        self.cond = threading.Condition()
        self.fatal: TrainingError | None = None
        #: why the run ended without an error of its own (``stop()``, the cluster stopped)
        self.reason: str | None = None

    @property
    def stopping(self) -> bool:
        return self.stopped.is_set()

    def stop(self, reason: str | None = None) -> None:
        if reason and self.reason is None:
            self.reason = reason
        self.stopped.set()
        self.wake()

    def fail(self, error: TrainingError) -> None:
        if self.fatal is None:
            self.fatal = error
        self.stop()

    def wake(self) -> None:
        with self.cond:
            self.cond.notify_all()

    def reset(self) -> None:
        self.stopped.clear()
        self.fatal = None
        self.reason = None
