"""Make a process slow on purpose: a straggler you can see.

``python -m tfmagic.procs.throttle PID FACTOR [PERIOD_MS]`` lets process PID run
1/FACTOR of the time: every period it is resumed (SIGCONT) for PERIOD/FACTOR
and stopped (SIGSTOP) for the rest, the way ``cpulimit`` works.  Everything
that process does slows down, whoever asks it (the training engine, a
``%%tf_device`` cell, a TF1 session from another program): the slowness is a
property of the task, not a sleep in tfmagic's loop.

A task process starts this helper as its own child (see :mod:`tfmagic.task.probes`), so
it runs beside the task on whatever host the task is on, and dies with the
task's process group.  The helper always leaves the process running when it
ends (SIGTERM, the task gone, or its owner gone).
"""

from __future__ import annotations

import os
import signal
import sys
import time

DEFAULT_PERIOD_MS = 20.0


def run(pid: int, factor: float, period_ms: float = DEFAULT_PERIOD_MS) -> None:
    """Let ``pid`` run 1/factor of the wall time until this helper is told to stop.

    The pause is not a fixed sleep: a helper on a busy machine wakes late, and
    late wakeups added to both phases drift the share towards one half (a CI
    run measured a worker asked to run 1/8 of the time giving 30 % of the
    gradients).  So the time the process ran is measured, and it stays stopped
    until that is 1/factor of the time since the throttle began.  A helper that
    woke late during a pause (the process got less than its share) owes it no
    burst afterwards: the count starts again from there.
    """
    period = period_ms / 1000.0
    on = period / factor
    stopping = False

    def finish(*_):
        nonlocal stopping
        stopping = True

    signal.signal(signal.SIGTERM, finish)
    signal.signal(signal.SIGINT, finish)
    parent = os.getppid()
    began = time.monotonic()
    ran = 0.0
    try:
        while not stopping and os.getppid() == parent:
            resumed = time.monotonic()
            os.kill(pid, signal.SIGCONT)
            time.sleep(on)
            if stopping:
                break
            os.kill(pid, signal.SIGSTOP)
            now = time.monotonic()
            ran += now - resumed
            pause = began + ran * factor - now
            if pause > 0:
                time.sleep(pause)
            else:
                began -= pause
    except ProcessLookupError:
        return
    finally:
        try:
            os.kill(pid, signal.SIGCONT)
        except ProcessLookupError:
            pass


if __name__ == "__main__":
    args = sys.argv[1:]
    run(int(args[0]), float(args[1]), float(args[2]) if len(args) > 2 else DEFAULT_PERIOD_MS)
