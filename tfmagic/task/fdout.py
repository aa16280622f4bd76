"""File descriptor 1 of a task, read by a thread: what C code or a child process writes there
reaches the running ``%%tf_px`` cell, as ``print`` does, and the task's log otherwise.

A cell's ``print`` goes through ``sys.stdout``, which a running cell replaces
(:mod:`.cells`); ``os.write(1, ...)``, a C extension's ``printf`` and a child
process (``subprocess.run(["nvidia-smi"])``) write to the file descriptor
itself, which was the log: their output never reached the cell.  ipykernel
captures a kernel's descriptors the same way (a pipe and a reading thread).

The thread never blocks on anything but the pipe (a writer to a full pipe
would hang), and :func:`drain` lets a cell wait, briefly, for what it wrote
just before it ended.
"""

from __future__ import annotations

import fcntl
import os
import struct
import sys
import termios
import threading
import time

_pipe_r: int | None = None
_busy = threading.Event()  # the thread holds bytes it has read and not yet passed on


def capture() -> None:
    """From now on fd 1 is a pipe; call after fd 2 points at the task's log."""
    global _pipe_r
    if _pipe_r is not None:
        return
    r, w = os.pipe()
    os.dup2(w, 1)
    os.close(w)
    os.set_inheritable(1, True)
    _pipe_r = r
    threading.Thread(target=_pump, args=(r,), name="tfmagic-fd1", daemon=True).start()


def _pump(r: int) -> None:
    while True:
        try:
            data = os.read(r, 65536)
        except InterruptedError:
            continue
        except OSError:
            return
        if not data:
            return
        _busy.set()
        try:
            _pass_on(data)
        finally:
            _busy.clear()


def _pass_on(data: bytes) -> None:
    stream = sys.stdout
    if hasattr(stream, "exec_id"):  # a running cell's stream: it writes the log too
        try:
            stream.buffer.write(data)
            return
        except Exception:  # noqa: BLE001 - never lose the bytes, never stop the pump
            pass
    try:
        os.write(2, data)
    except OSError:
        pass


def _pending() -> int:
    if _pipe_r is None:
        return 0
    try:
        return struct.unpack("i", fcntl.ioctl(_pipe_r, termios.FIONREAD, b"\0\0\0\0"))[0]
    except OSError:
        return 0


def drain(timeout: float = 0.5) -> None:
    """Wait until what was written to fd 1 so far has been passed on (at most ``timeout`` s)."""
    deadline = time.monotonic() + timeout
    while (_pending() or _busy.is_set()) and time.monotonic() < deadline:
        time.sleep(0.002)
