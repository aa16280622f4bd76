"""Spare task processes: TensorFlow's server core already imported, waiting for a role.

Importing TensorFlow (even only its server core, see
:class:`tfmagic.task.server.ServerCore`) and starting Python costs most of a
cluster's start.  After a cluster starts, the pool spawns as many spares as the
largest cluster started so far has tasks, in the background, so the *next*
start (any shape up to that size) or a task restart takes warm processes and
answers in well under a second.  A shape bigger than any before pays the
import for its extra tasks once.

Spares belong to the process that made them: they outlive a cluster's
``stop`` but never their owner (they end with it like every task, see
:mod:`tfmagic.procs.owner`).  They cost memory, so the pool keeps within a budget:
``auto`` (the default) allows a quarter of this machine's memory, at most
4 GiB, and none at all under 4 GiB (Binder); set a number of bytes, a string
such as ``"1.5GB"``, or ``0`` to turn spares off
(``tfmagic.set_spare_budget`` or the ``TFMAGIC_SPARE_BUDGET`` variable).
"""

from __future__ import annotations

import os
import threading
from itertools import count
from typing import TYPE_CHECKING

from .errors import TfmagicError
from .procs import owner
from .units import parse_bytes

if TYPE_CHECKING:
    from .launchers.base import Launcher
    from .launchers.channel import TaskProcess

#: Memory one spare costs before we have measured one (PSS measured here:
#: 0.18 GB beside other TensorFlow processes, 0.37 GB alone; the safe side).
DEFAULT_SPARE_BYTES = 420 * 2**20


def memory_limit() -> int:
    """The lowest memory limit on this process: the machine's, or any cgroup's on its way up
    (see :mod:`tfmagic.procs.memory`)."""
    from .procs.memory import memory_limit as lowest

    return lowest()


def auto_budget() -> int:
    """A quarter of :func:`memory_limit`, at most 4 GiB; none under 4 GiB."""
    limit = memory_limit()
    if limit < 4 * 2**30:
        return 0
    return min(limit // 4, 4 * 2**30)


class SparePool:
    """Warm processes per launcher signature, kept within a memory budget."""

    def __init__(self, budget: int | str | None = None) -> None:
        if budget is None:
            budget = os.environ.get("TFMAGIC_SPARE_BUDGET", "auto")
        self._budget = parse_bytes(budget)
        self._lock = threading.RLock()
        self._spares: list[TaskProcess] = []
        self._seq = count(1)
        self._closed = False
        self._largest: dict = {}  # launcher signature -> the most spares a fill asked for

    # -- budget ------------------------------------------------------------
    @property
    def budget(self) -> int:
        return auto_budget() if self._budget == "auto" else int(self._budget)

    def set_budget(self, budget: int | float | str | None) -> None:
        self._budget = parse_bytes(budget)
        self.trim()

    def spare_cost(self) -> int:
        """PSS of one spare, measured on a live spare when there is one."""
        from .procs.stats import memory_of

        for proc in self.processes():
            if proc.warm_at is not None:
                mem = memory_of(proc.pid)
                if mem and mem.get("pss"):
                    return int(mem["pss"])
        return DEFAULT_SPARE_BYTES

    def capacity(self) -> int:
        """How many spares the budget allows."""
        budget = self.budget
        return 0 if budget <= 0 else budget // self.spare_cost()

    # -- spares ------------------------------------------------------------
    def processes(self) -> list[TaskProcess]:
        with self._lock:
            self._spares = [p for p in self._spares if p.alive and p.task is None]
            return list(self._spares)

    def count(self, launcher: Launcher) -> int:
        """How many live spares ``launcher`` could take now."""
        with self._lock:
            return sum(
                1
                for p in self._spares
                if p.alive and p.task is None and p.launcher.signature == launcher.signature
            )

    def take(self, launcher: Launcher, n: int) -> list[TaskProcess]:
        """Up to ``n`` spares that ``launcher`` could have made, warm ones first."""
        with self._lock:
            fit = [
                p
                for p in self._spares
                if p.alive and p.task is None and p.launcher.signature == launcher.signature
            ]
            fit.sort(key=lambda p: (p.warm_at is None, p.spawned_at))
            chosen = fit[:n]
            self._spares = [p for p in self._spares if p not in chosen]
        return chosen

    def fill(self, launcher: Launcher, n: int) -> list[TaskProcess]:
        """Spawn spares until ``n`` fit ``launcher`` (within the budget); returns new ones.

        ``n`` never drops below the largest cluster filled for this launcher so
        far: a class that goes 1+4 -> 1+1 -> 1+4 finds the last start warm too.
        """
        capacity = self.capacity()  # measures a spare: outside the lock
        with self._lock:
            if self._closed:
                return []
            n = max(n, self._largest.get(launcher.signature, 0))
            self._largest[launcher.signature] = n
            have = sum(
                1
                for p in self._spares
                if p.alive and p.task is None and p.launcher.signature == launcher.signature
            )
            room = capacity - len([p for p in self._spares if p.alive])
            todo = max(0, min(n - have, room, self._quota_room()))
        made = []
        for _ in range(todo):
            log = owner.runtime_dir() / f"spare-{next(self._seq)}.log"
            proc = launcher.spawn(str(log))
            made.append(proc)
            with self._lock:
                self._spares.append(proc)
        return made

    @staticmethod
    def _quota_room() -> int:
        """Spares a hub's task limit leaves room for (spares are task processes: they count)."""
        from .procs import quota

        try:
            max_tasks, _ = quota.limits()
        except TfmagicError:  # a malformed limit: the next start says so; no spares meanwhile
            return 0
        return 1 << 30 if max_tasks is None else max(0, max_tasks - len(quota.user_tasks()))

    def fill_later(self, launcher: Launcher, n: int) -> threading.Thread:
        """:meth:`fill` on a background thread, so a start returns at once."""
        thread = threading.Thread(target=self.fill, args=(launcher, n), name="tfmagic-spares", daemon=True)
        thread.start()
        return thread

    def trim(self) -> int:
        """Kill spares beyond the budget (all of them when the budget is 0)."""
        extra = self.processes()[self.capacity() :] if self.budget > 0 else self.processes()
        for proc in extra:
            proc.kill()
        with self._lock:
            self._spares = [p for p in self._spares if p not in extra]
        return len(extra)

    def shutdown(self) -> None:
        """Kill every spare; the pool then makes no more until :meth:`reopen`."""
        with self._lock:
            self._closed = True
            spares, self._spares = self._spares, []
        for proc in spares:
            proc.kill()

    def reopen(self) -> None:
        with self._lock:
            self._closed = False


_default: SparePool | None = None
_default_lock = threading.Lock()


def default_pool() -> SparePool:
    """The pool shared by every cluster this process starts."""
    global _default
    with _default_lock:
        if _default is None:
            _default = SparePool()
        return _default


def set_spare_budget(budget: int | float | str | None) -> None:
    """Set how much memory spare processes may use: ``"2GB"``, ``0`` (off) or ``"auto"``."""
    default_pool().set_budget(budget)
