"""A process's descendants, read from /proc with raw system calls only, and a keeper for them.

A task ends everything it started (:func:`kill_descendants`), including
children a cell started in sessions of their own, which a process-group kill
misses.  When the task itself is killed outright (SIGKILL from the kernel
because its owner died while it was stopped), it cannot do that; a
**keeper** process beside it can: ``python -m tfmagic.procs.tree PID`` notes
the task's descendants four times a second and, once the task is gone, kills
those still running.  Raw ``os`` calls only: the task calls this while dying,
when no Python stream or lock may be taken.
"""

from __future__ import annotations

import os
import signal
import sys
import time


def stat(pid: int | str) -> tuple[int, str, int] | None:
    """(parent pid, state letter, start time in ticks) from ``/proc/PID/stat``; None if gone."""
    try:
        fd = os.open(f"/proc/{pid}/stat", os.O_RDONLY)
        try:
            data = os.read(fd, 4096)
        finally:
            os.close(fd)
        fields = data.rpartition(b")")[2].split()  # the name before it may hold spaces and parentheses
        return int(fields[1]), fields[0].decode(), int(fields[19])
    except (OSError, IndexError, ValueError):
        return None


def _children_files(pid: int) -> list[str]:
    try:
        return [f"/proc/{pid}/task/{tid}/children" for tid in os.listdir(f"/proc/{pid}/task")]
    except OSError:
        return []


def descendants(root: int) -> dict[int, tuple[int, str, int]]:
    """Every descendant of ``root``: pid -> (parent pid, state, start time).  ``{}`` without /proc.

    Reads the kernel's per-thread ``children`` lists where it has them
    (``CONFIG_PROC_CHILDREN``), else every ``/proc/PID/stat``.
    """
    found: dict[int, tuple[int, str, int]] = {}
    if os.path.exists(f"/proc/{root}/task/{root}/children"):
        todo = [root]
        while todo:
            pid = todo.pop()
            for path in _children_files(pid):
                try:
                    fd = os.open(path, os.O_RDONLY)
                    try:
                        kids = os.read(fd, 65536).split()
                    finally:
                        os.close(fd)
                except OSError:
                    continue
                for kid in map(int, kids):
                    info = stat(kid)
                    if info is not None and kid not in found:
                        found[kid] = info
                        todo.append(kid)
        return found
    try:
        names = os.listdir("/proc")
    except OSError:
        return found
    table = {}
    for name in names:
        if name.isdigit():
            info = stat(name)
            if info is not None:
                table[int(name)] = info
    children: dict[int, list[int]] = {}
    for pid, (ppid, _, _) in table.items():
        children.setdefault(ppid, []).append(pid)
    todo = [root]
    while todo:
        for kid in children.get(todo.pop(), ()):
            if kid not in found:
                found[kid] = table[kid]
                todo.append(kid)
    return found


def kill_descendants(root: int | None = None, rounds: int = 20) -> None:
    """SIGKILL every live descendant of ``root`` (this process), again until none is left.

    Rounds catch what a dying descendant forked meanwhile (a child subreaper
    inherits those orphans, so they show up as descendants).
    """
    root = os.getpid() if root is None else root
    for _ in range(rounds):
        alive = [pid for pid, (_, state, _) in descendants(root).items() if state not in ("Z", "X")]
        if not alive:
            return
        for pid in alive:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.01)


def keep(pid: int, every: float = 0.25) -> None:
    """Watch ``pid``; once it is gone, SIGKILL the descendants it had (each checked by start time)."""
    me = os.getpid()
    first = stat(pid)
    if first is None:
        return
    known: dict[int, int] = {}
    while True:
        info = stat(pid)
        if info is None or info[2] != first[2] or info[1] in ("Z", "X"):
            break
        seen = {d: st for d, (_, _, st) in descendants(pid).items() if d != me}
        known = {**{d: st for d, st in known.items() if stat(d) is not None}, **seen}
        time.sleep(every)
    for d, started in known.items():
        now = stat(d)
        if now is not None and now[2] == started:
            try:
                os.kill(d, signal.SIGKILL)
            except OSError:
                pass


if __name__ == "__main__":
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    keep(int(sys.argv[1]))
