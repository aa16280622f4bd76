"""A task's lifeline: nothing it starts outlives its owner, on any path.

A task ends itself and everything it started (its descendants, also those a
cell moved to a session of their own: the task is their *child subreaper*, so
orphans re-parent to it) when its channel reaches end-of-file (the owner died,
even by ``kill -9``), when its parent changes (:class:`ParentWatch`), when its
parent dies while it is stopped (``PR_SET_PDEATHSIG``, :func:`tie_to_owner`),
or when the owner says ``stop``.  A keeper process beside it
(:func:`start_keeper`) ends what the task started if the task itself is
killed outright.  :func:`end_now` is the one way out, and nothing in it can block.
"""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
import time
import traceback
from collections.abc import Callable
from typing import NoReturn

from ..procs.tree import descendants, kill_descendants

#: A private directory holding this task's bind library (see :func:`guard_self`), removed at its end.
_guard_tmpdir: str | None = None

_PR_SET_PDEATHSIG = 1
_PR_SET_CHILD_SUBREAPER = 36


def keep_guard_dir(path: str | None) -> None:
    """The folder of a privately built bind library, removed by :func:`end_now`."""
    global _guard_tmpdir
    _guard_tmpdir = path


def end_now(reason: str, code: int = 1) -> NoReturn:
    """End this process and everything it started, now; nothing here can block.

    The reason goes to the log with one non-blocking ``os.write`` on fd 2: no
    Python stream and no lock, because during a cell ``sys.stderr`` is the
    stream to the owner, whose lock the dying thread may hold itself (a cell
    printing when the channel broke) and whose pipe may be gone.  Then every
    descendant gets SIGKILL (also those in sessions of their own, which a
    group kill misses), then the process group, this process included.
    """
    try:
        os.set_blocking(2, False)
        os.write(2, f"tfmagic task {os.getpid()}: exiting: {reason}\n".encode(errors="replace"))
    except Exception:  # noqa: BLE001 - a full or closed log must not keep us alive
        pass
    kill_descendants()
    if _guard_tmpdir:
        try:
            for name in os.listdir(_guard_tmpdir):
                os.unlink(os.path.join(_guard_tmpdir, name))
            os.rmdir(_guard_tmpdir)
        except OSError:
            pass
    try:
        if os.getpgid(0) == os.getpid():
            os.killpg(os.getpid(), signal.SIGKILL)  # the leader of its group: nothing may outlive it
    except OSError:
        pass
    if code < 0:  # a crash on purpose (``crash``): die of that signal, as a real one would
        try:
            os.kill(os.getpid(), -code)
        except OSError:
            pass
    os._exit(code)


class ParentWatch:
    """A thread's body: end the task when its parent changes; reap the orphans it adopted."""

    def __init__(self, die: Callable[[str], None]) -> None:
        self.die = die
        self.parent = os.getppid()
        self._adopted: set[tuple[int, int]] = set()  # (pid, start time) of descendants we did not spawn

    def run(self) -> None:
        for tick in itertools.count(1):
            time.sleep(0.5)
            if os.getppid() != self.parent:
                self.die("the owner process is gone (parent changed)")
            if tick % 4 == 0:
                try:
                    self.reap_adopted()
                except Exception:  # noqa: BLE001 - this thread must keep watching the parent
                    traceback.print_exc(file=sys.__stderr__)

    def reap_adopted(self) -> None:
        """Reap orphans that re-parented to this task (its cells' grandchildren) once they end.

        As child subreaper the task inherits them, and their zombies would stay
        until it ends.  Only descendants seen earlier under another parent are
        reaped: a zombie the task spawned itself belongs to whoever waits for
        it (``subprocess`` would take a stolen status for exit code 0).
        """
        me = os.getpid()
        table = descendants(me)
        for pid, (ppid, state, start) in table.items():
            if ppid == me and state == "Z" and (pid, start) in self._adopted:
                try:
                    os.waitpid(pid, os.WNOHANG)
                except OSError:
                    pass
        seen = {(pid, start) for pid, (_, _, start) in table.items()}
        self._adopted = (self._adopted & seen) | {
            (pid, start) for pid, (ppid, _, start) in table.items() if ppid != me
        }


def _prctl(option: int, value: int) -> bool:
    """Linux's prctl(2); ``False`` where there is none (other systems) or it fails."""
    if not sys.platform.startswith("linux"):
        return False
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        return libc.prctl(option, value, 0, 0, 0) == 0
    except (OSError, AttributeError):
        return False


def tie_to_owner() -> None:
    """First thing a task does: make sure nothing it starts can outlive its owner.

    * Child subreaper: orphans of the cells' processes (a daemon, a child in a
      session of its own whose parent exited) re-parent to this task instead
      of init, so :func:`kill_descendants` finds them when the task ends.
    * ``TFMAGIC_PDEATHSIG=1``: the kernel sends SIGKILL when the parent dies,
      which reaches a stopped (SIGSTOP, a debugger) task that can never read
      end-of-file.  It fires when the parent *thread* exits, so only an owner
      that spawns tasks from a thread living as long as itself sets it.  If
      the parent already died before this line ran (``TFMAGIC_OWNER_PID``, the
      owner's pid, differs from ours) the task ends at once.

    Both are set again after :func:`guard_self`'s ``exec``, which keeps them anyway.
    """
    _prctl(_PR_SET_CHILD_SUBREAPER, 1)
    if os.environ.get("TFMAGIC_PDEATHSIG") == "1":
        _prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
        owner = os.environ.get("TFMAGIC_OWNER_PID", "")
        if owner.isdigit() and os.getppid() != int(owner):
            end_now(f"the owner (pid {owner}) was gone before this task started")


def guard_self() -> None:
    """Keep this task's servers on one address, on whatever host it runs.

    A remote launcher cannot hand the task a preload library built on the
    owner's machine (another host may have another libc), so it sets
    ``TFMAGIC_GUARD_HOST`` and the task builds the library on its own host and
    re-executes itself with it, before TensorFlow is imported (``exec`` keeps
    the pid and the owner's channel).  When that is not possible here the
    reason travels in the ``hello`` event and the owner tells the user.
    """
    host = os.environ.get("TFMAGIC_GUARD_HOST")
    if not host or os.environ.get("TFMAGIC_BIND_HOST"):
        return
    from ..network.bindguard import bind_guard, built_privately

    guard = bind_guard(host)
    if not guard.available:
        os.environ["TFMAGIC_GUARD_FAILED"] = guard.reason
        return
    env = {**os.environ, **guard.env}
    if built_privately(guard.library):
        # Built privately (this host's cache could be written by others); ``exec``
        # skips the exit handler that would remove it, so the task does at its end.
        env["TFMAGIC_GUARD_TMPDIR"] = os.path.dirname(guard.library)
    sys.stdout.flush()
    os.execve(sys.executable, [sys.executable, "-u", "-m", "tfmagic.task_main"], env)


def start_keeper() -> None:
    """A keeper beside this task ends what the task started if the task is killed outright.

    ``PR_SET_PDEATHSIG`` SIGKILLs a task whose owner died while it could not
    read its channel (stopped); a SIGKILLed task cannot end its children, and
    those a cell started in sessions of their own would live on.  The keeper
    (:mod:`tfmagic.procs.tree`) does it.  Started before TensorFlow is imported.
    """
    subprocess.Popen(
        [sys.executable, "-m", "tfmagic.procs.tree", str(os.getpid())],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        close_fds=True,
    )


__all__ = ["ParentWatch", "end_now", "guard_self", "keep_guard_dir", "start_keeper", "tie_to_owner"]
