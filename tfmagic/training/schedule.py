"""Scripted events: slow, kill or restart a task when a run reaches a chosen update.

A live demo that says "now slow worker 1" races its reader: a 2,500-update
run can be over before the cell that slows the worker is run.  Given in
advance, the event happens at its update, every time::

    run = tfmagic.train(cluster, "async", steps=2500, block=False,
                        events="500: slow worker:1 4; 900: kill worker:2; 1300: restart worker:2")
    run.schedule(step=1800, slow=("worker:1", 1))

The events are the cluster's own (``slow``, ``kill``, ``restart``), so they
are marked on the dashboard where they happened, like any other.
"""

from __future__ import annotations

import re
import threading
from dataclasses import dataclass

from ..errors import TrainingError
from ..spec import TaskName

VERBS = ("slow", "kill", "restart")
_ITEM = re.compile(r"^\s*([0-9]+)\s*:\s*(\w+)\s+(\S+)(?:\s+(\S+))?\s*$", re.ASCII)


@dataclass
class Scheduled:
    """``verb`` on ``task`` once the run has made ``step`` updates (``factor`` for slow)."""

    step: int
    verb: str
    task: TaskName
    factor: float | None = None
    done: bool = False

    def __str__(self) -> str:
        extra = f" {self.factor:g}" if self.factor is not None else ""
        return f"{self.step}: {self.verb} {self.task}{extra}"


def parse(text: str, cluster) -> list[Scheduled]:
    """``"500: slow worker:1 4; 900: kill worker:2"`` -> events; one line per mistake."""
    out = []
    for part in filter(str.strip, text.split(";")):
        m = _ITEM.match(part)
        if not m:
            raise TrainingError(
                f"{part.strip()!r} is not an event; write 'STEP: slow TASK FACTOR', 'STEP: kill TASK' or "
                "'STEP: restart TASK', separated by ';'"
            )
        step, verb, task, arg = m.groups()
        out.append(make(int(step), verb, task, arg, cluster))
    return out


def make(step: int, verb: str, task, arg, cluster) -> Scheduled:
    if verb not in VERBS:
        raise TrainingError(f"unknown event {verb!r}; use one of {', '.join(VERBS)}")
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise TrainingError(f"an event's step is a whole number >= 1, not {step!r}")
    t = cluster.check_task(task)
    factor = None
    if verb == "slow":
        try:
            factor = float(arg)
        except (TypeError, ValueError):
            raise TrainingError(f"slow {t} needs a factor, e.g. '{step}: slow {t} 4' (1 restores)") from None
        if not factor >= 1 or factor == float("inf"):
            raise TrainingError(f"slow {t} {arg}: the factor is a number >= 1 (1 restores full speed)")
    elif arg is not None:
        raise TrainingError(f"{verb} {t} takes no number ({arg!r})")
    if verb == "restart" and t.job == "ps":
        # a live ps restarted is a new, empty one: the run's variables go with the old process
        raise TrainingError(
            f"a scheduled restart of {t} would end the run (its variables go with the old process); "
            f"schedule '{step}: kill {t}' to show a lost ps, or restart a worker"
        )
    return Scheduled(step, verb, t, factor)


class Schedule:
    """A run's scripted events, fired from its history as updates are recorded."""

    def __init__(self, run) -> None:
        self.run = run
        self.events: list[Scheduled] = []
        self._lock = threading.Lock()
        self._sub = None

    def add(self, events: list[Scheduled]) -> None:
        last = getattr(self.run, "steps", None)
        late = [e for e in events if isinstance(last, int) and e.step > last]
        if late:  # it would never happen, and nothing would say so
            raise TrainingError(
                f"the event '{late[0]}' is after the run's last update ({last}): schedule it at a step "
                f"from 1 to {last}, or train for more steps"
            )
        with self._lock:
            self.events.extend(events)
            self.events.sort(key=lambda e: e.step)
            pending = any(not e.done for e in self.events)
        if self._sub is None and pending:
            self._sub = self.run.history.feed.subscribe(self._on_item)

    def _on_item(self, item) -> None:
        step = getattr(item, "step", None) if type(item).__name__ == "GlobalStep" else None
        if step is None:
            return
        with self._lock:
            due = [e for e in self.events if not e.done and e.step <= step]
            for e in due:
                e.done = True
        for e in due:  # on a thread of its own: a restart takes a moment, training goes on
            threading.Thread(
                target=self._fire, args=(e, step), name=f"tfmagic-event-{e.verb}", daemon=True
            ).start()

    def _fire(self, e: Scheduled, step: int) -> None:
        cluster = self.run.cluster
        try:
            if e.verb == "slow":
                cluster.slow(e.task, e.factor)
            elif e.verb == "kill":
                cluster.kill(e.task)
            else:
                cluster.restart(e.task, force=True)
        except Exception as exc:  # noqa: BLE001 - told in the run's history, not raised into a thread
            self.run.history.add_event("event-failed", e.task, f"{e}: {type(exc).__name__}: {exc}", step=step)

    def close(self) -> None:
        if self._sub is not None:
            self._sub.close()
            self._sub = None
