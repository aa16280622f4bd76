"""Who is waiting on whom, right now: the registry the hang doctor reads.

Whatever in this process waits on a task says so here while it waits: a
training run's call to a worker, a sync step waiting for gradients, a
``%%tf_device`` cell, a ``%%tf_px`` cell in some task, a cluster start, a
checkpoint read.  A wait is cheap to note (a dict entry) and gone when the
wait ends, so ``cluster.why()`` can answer "who waits on whom, since when"
at any moment, and say why in words.
"""

from __future__ import annotations

import contextlib
import itertools
import threading
import time
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

_lock = threading.Lock()
_waits: dict[int, Wait] = {}
_ids = itertools.count(1)


@dataclass
class Wait:
    """``waiter`` has waited on ``on`` (tasks) since ``since`` (time.time()); ``detail`` says for what."""

    waiter: str
    on: tuple[str, ...]
    since: float = field(default_factory=time.time)
    detail: str = ""
    cluster: int | None = None

    @property
    def seconds(self) -> float:
        return time.time() - self.since


def begin(waiter: str, on: Iterable[str], detail: str = "", cluster: int | None = None) -> int:
    """Note a wait; returns a token for :func:`end`."""
    token = next(_ids)
    with _lock:
        _waits[token] = Wait(waiter, tuple(on), time.time(), detail, cluster)
    return token


def update(token: int, on: Iterable[str] | None = None, detail: str | None = None) -> None:
    """Change what a wait waits on (a sync step: the workers still missing)."""
    with _lock:
        w = _waits.get(token)
        if w is not None:
            if on is not None:
                w.on = tuple(on)
            if detail is not None:
                w.detail = detail


def end(token: int) -> None:
    with _lock:
        _waits.pop(token, None)


@contextlib.contextmanager
def waiting(waiter: str, on: Iterable[str], detail: str = "", cluster: int | None = None) -> Iterator[int]:
    token = begin(waiter, on, detail, cluster)
    try:
        yield token
    finally:
        end(token)


def current(older_than: float = 0.0) -> list[Wait]:
    """Every wait under way that has lasted at least ``older_than`` seconds, longest first."""
    now = time.time()
    with _lock:
        found = [w for w in _waits.values() if now - w.since >= older_than]
    return sorted(found, key=lambda w: w.since)
