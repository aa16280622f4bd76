"""Background work in the kernel that does not hold training up: a short GIL switch interval while it runs.

The kernel is the training engine's client: its threads spend a step waiting
in gRPC (without Python's global lock) and then need the lock back for a
fraction of a millisecond of Python before the next call.  A thread that
draws a dashboard frame holds the lock for tens of milliseconds of
matplotlib; a thread coming back from its call asks for the lock and, by
CPython's rule, gets it only after the *switch interval* (5 ms by default)
has passed.  Every step that ends while a frame is drawn is held up by up to
5 ms, a large share of a 4 to 8 ms step.

:func:`yielding` lowers the interval while such background work runs (and
restores it when the last such piece ends), so a waiting engine thread gets
the lock within half a millisecond.  It is process-wide (CPython has one
interval), counted, and safe from any thread.
"""

from __future__ import annotations

import sys
import threading
from collections.abc import Iterator
from contextlib import contextmanager

__all__ = ["BACKGROUND_INTERVAL", "yielding"]

#: the switch interval while background work runs (seconds); CPython's default is 0.005
BACKGROUND_INTERVAL = 0.0005

_lock = threading.Lock()
_users = 0
_saved: float | None = None


@contextmanager
def yielding(interval: float = BACKGROUND_INTERVAL) -> Iterator[None]:
    """Run the block with a switch interval of at most ``interval``; the old one comes back after.

    >>> before = sys.getswitchinterval()
    >>> with yielding(0.001):
    ...     sys.getswitchinterval() <= 0.001
    True
    >>> sys.getswitchinterval() == before
    True
    """
    global _users, _saved
    with _lock:
        if _users == 0:
            _saved = sys.getswitchinterval()
            sys.setswitchinterval(min(interval, _saved))
        _users += 1
    try:
        yield
    finally:
        with _lock:
            _users -= 1
            if _users == 0 and _saved is not None:
                sys.setswitchinterval(_saved)
                _saved = None
