"""The process throttle (``python -m tfmagic.procs.throttle``) gives a process the share of time it was asked for.

A real busy process, a real helper: the process's CPU time over wall time is
its share, because alone it would use a whole core.  Until 2026-11-27 the
helper slept fixed on and off times, and its late wakeups (the signals, the
interpreter, a busy machine) drifted the share: asked for 1/8, it measured
0.257 on an idle machine, and a CI run saw a worker slowed 8x give 30 % of
the gradients.  The bound here is loose (the machine is shared) but a drift
towards one half fails it.
"""

from __future__ import annotations

import subprocess
import sys
import time

import psutil
import pytest

pytestmark = pytest.mark.unit


def _share(factor: float, seconds: float = 3.0) -> float:
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    helper = None
    try:
        proc = psutil.Process(busy.pid)
        time.sleep(0.2)
        helper = subprocess.Popen(
            [sys.executable, "-m", "tfmagic.procs.throttle", str(busy.pid), str(factor)]
        )
        time.sleep(0.3)  # the helper's interpreter starting, the process still at full speed
        cpu0, t0 = sum(proc.cpu_times()[:2]), time.monotonic()
        time.sleep(seconds)
        cpu1, t1 = sum(proc.cpu_times()[:2]), time.monotonic()
        return (cpu1 - cpu0) / (t1 - t0)
    finally:
        if helper is not None:
            helper.terminate()
            assert helper.wait(10) == 0 or helper.returncode < 0
        busy.kill()
        busy.wait(10)


def test_a_throttled_process_runs_the_share_it_was_asked_for():
    share = _share(8)
    assert 0.5 / 8 < share < 1.5 / 8, f"asked for 1/8 = 0.125 of the time, it ran {share:.3f}"


def test_the_helper_leaves_the_process_running_when_it_ends():
    busy = subprocess.Popen([sys.executable, "-c", "while True: pass"])
    try:
        helper = subprocess.Popen([sys.executable, "-m", "tfmagic.procs.throttle", str(busy.pid), "50"])
        time.sleep(0.5)
        helper.terminate()
        helper.wait(10)
        time.sleep(0.1)
        assert psutil.Process(busy.pid).status() != psutil.STATUS_STOPPED
    finally:
        busy.kill()
        busy.wait(10)
