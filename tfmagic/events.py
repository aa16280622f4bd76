"""What happens, and who wants to know: one event type and one way to follow things.

A cluster (a task slowed, killed, restarted, lost, joined, leaving, left or
stayed after a removal that could not go on; the cluster stopped), a
training run (a worker lost or rejoined, a gradient dropped, a resume) and a
``%%tf_px`` cell (a step it reported) all say what happened with the same
:class:`Event`, and everything that follows something (the dashboard, a
training run following its cluster, TensorBoard writers, the notebook's
messages) does it the same way::

    sub = cluster.events.subscribe(print)   # print(event) for each event from now on
    ...
    sub.close()                             # or: with cluster.events.subscribe(f): ...

A :class:`Topic` delivers on the publisher's thread, in order; a follower
that raises is cut off from that one item, never the publisher (a broken
plot must not stop training).  Following costs nothing once closed: the
dashboard closes its subscriptions when it stops, a run when it ends.
"""

from __future__ import annotations

import logging
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any, Generic, TypeVar

from .spec import TaskName

log = logging.getLogger("tfmagic.events")

T = TypeVar("T")


@dataclass(frozen=True)
class Event:
    """Something worth marking: ``kind`` happened to ``task`` (None: to the whole cluster).

    ``step`` is the global step it happened at, when a run knows it;
    ``run`` names the run that recorded it (empty for cluster events).
    Kinds in use: ``start``, ``stop``, ``slow``, ``kill``, ``restart``,
    ``lost``, ``stopped`` (SIGSTOP seen), ``rejoin``, ``retry``,
    ``dropped``, ``resume``, ``rollback``, ``error``, ``detach``.
    """

    time: float
    kind: str
    task: TaskName | None = None
    detail: str = ""
    step: int | None = None
    run: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.task, str) and not isinstance(self.task, TaskName):
            object.__setattr__(self, "task", TaskName.parse(self.task) if self.task else None)

    @classmethod
    def now(cls, kind: str, task: TaskName | str | None = None, detail: str = "", **more: Any) -> Event:
        return cls(time.time(), kind, task, detail, **more)

    @property
    def who(self) -> str:
        """The task's name, or ``cluster`` for events of the whole cluster."""
        return self.task if self.task is not None else "cluster"

    def __str__(self) -> str:
        at = f" at step {self.step}" if self.step is not None else ""
        return f"{self.who} {self.kind}{at}" + (f": {self.detail}" if self.detail else "")


class Subscription:
    """A follower's hold on a :class:`Topic`; ``close()`` lets go (safe to call twice)."""

    def __init__(self, topic: Topic, callback: Callable[[Any], None]) -> None:
        self._topic = topic
        self.callback = callback

    @property
    def active(self) -> bool:
        return self._topic is not None and self in self._topic._subscriptions

    def close(self) -> None:
        topic, self._topic = self._topic, None
        if topic is not None:
            topic._remove(self)

    def __enter__(self) -> Subscription:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


@dataclass
class Topic(Generic[T]):
    """Items of one kind, published by one owner, delivered to every subscriber.

    With ``keep``, the topic also remembers its last ``keep`` items, so it
    reads as a log too: ``for event in cluster.events: ...``.
    """

    name: str = ""
    keep: int = 0
    _subscriptions: list[Subscription] = field(default_factory=list, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _log: deque = field(default_factory=deque, repr=False)

    def subscribe(self, callback: Callable[[T], None]) -> Subscription:
        """Call ``callback(item)`` for every item published from now on."""
        sub = Subscription(self, callback)
        with self._lock:
            self._subscriptions.append(sub)
        return sub

    def publish(self, item: T) -> None:
        with self._lock:
            if self.keep:
                self._log.append(item)
                while len(self._log) > self.keep:
                    self._log.popleft()
            subs = list(self._subscriptions)
        for sub in subs:
            try:
                sub.callback(item)
            except Exception:
                log.debug("a subscriber of %s failed on %r", self.name, item, exc_info=True)

    def _remove(self, sub: Subscription) -> None:
        with self._lock:
            if sub in self._subscriptions:
                self._subscriptions.remove(sub)

    @property
    def subscribers(self) -> int:
        """How many subscribers follow this topic now (tests check that none is left over)."""
        with self._lock:
            return len(self._subscriptions)

    def __iter__(self) -> Iterator[T]:
        """The kept items, oldest first (a copy: safe while more are published)."""
        with self._lock:
            return iter(list(self._log))

    def __len__(self) -> int:
        with self._lock:
            return len(self._log)


#: Training runs, comparisons and ``%%tf_px`` cells, published as they start: the
#: session follows it to know the last run (``%tf_dashboard`` shows it).
started: Topic = Topic("runs started", keep=1)
