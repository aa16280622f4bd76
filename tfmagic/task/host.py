"""One process hosting several tasks (``processes=``): a runtime per task, each on a channel of its own.

A classroom machine or Binder's 2 GB cannot hold 34 task processes (about 0.1 GB each); TensorFlow
can hold many servers in one process (its own multi-worker tests build clusters that way), each a
real gRPC server with its own address, devices and variables. The owner starts this process with
one pair of pipes per task (``TFMAGIC_CHANNELS``: ``ops:events`` descriptors, comma separated) and
talks to each task exactly as to a process of its own; what belongs to the process is set up here
once: standard input and output away from the channels, the watch on the parent, TensorFlow's
server core (imported once, shared).

What one task cannot do alone here, it refuses in one line: a ``%%tf_px`` cell (its namespace,
fd 1, its interrupt are the process's) and a throttle (it pauses the whole process). A kill of one
of them is modelled instead: its server is cut off (:func:`.server.cut_off`) and a restart starts
a new one over the same channel.

All the servers of a process share one pool of inter-op threads, sized by the first server's
config; a unary call holds one of them while its function waits for the ps's part, so the owner
gives these servers at least their number + 2 (``bench/shared_process.py`` shows the hang with fewer).
"""

from __future__ import annotations

import os
import sys
import threading

from .cells import NoInput
from .lifeline import ParentWatch, end_now
from .runtime import TaskRuntime, quiet_stdio
from .server import ServerCore


def channels(spec: str) -> list[tuple[int, int]]:
    """``"3:4,5:6"`` -> ``[(3, 4), (5, 6)]``: each task's (ops in, events out) descriptors.

    >>> channels("3:4,5:6")
    [(3, 4), (5, 6)]
    """
    pairs = []
    for part in spec.split(","):
        ops, events = part.split(":")
        pairs.append((int(ops), int(events)))
    return pairs


def run(spec: str) -> None:
    """Serve every channel of ``spec`` until the owner goes (any channel's end ends the process)."""
    pairs = channels(spec)
    quiet_stdio()  # the channels are pipes of their own: fd 1 is the log, fd 0 /dev/null
    print(f"tfmagic: process {os.getpid()} hosts {len(pairs)} tasks, a channel each", flush=True)
    try:
        core = ServerCore()
    except Exception:  # noqa: BLE001 - each runtime tries again and tells its owner why
        core = None
    runtimes = [TaskRuntime(channel=pair, core=core) for pair in pairs]
    sys.stdin = NoInput(runtimes[0])
    threading.Thread(target=ParentWatch(end_now).run, name="tfmagic-parent", daemon=True).start()
    for i, rt in enumerate(runtimes):
        threading.Thread(target=rt.run, name=f"tfmagic-task-{i}", daemon=True).start()
    threading.Event().wait()  # the runtimes end the process (end_now) when the owner goes


__all__ = ["channels", "run"]
