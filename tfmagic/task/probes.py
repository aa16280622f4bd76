"""A task's urgent ops: answered on its reader thread, even while a cell runs.

What the owner asks to see or change at once (slow down, a line for the log,
a free port, CPU and memory, where it listens, its connections, every
thread's stack, crash, interrupt the running cell, start a cell waiting at
its barrier, a shared task's modelled death).  Each takes the runtime and the message; :data:`HANDLERS` maps
every urgent :class:`~tfmagic.protocol.Op` to its function (``urgent_<op>``, the
name a thread's stack shows while it answers).
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import traceback
from collections.abc import Callable
from typing import Any

from ..protocol import URGENT, Event, Op


def urgent_slow(rt, msg: dict[str, Any]) -> None:
    """Run at 1/factor speed (``tfmagic.procs.throttle``); factor 1 restores."""
    factor = float(msg.get("factor", 1.0))
    if rt.shared:  # the throttle pauses the whole process, every task in it
        rt.send(
            Event.ERROR,
            id=msg.get("id"),
            message=f"{rt.label} shares its process: it cannot be throttled alone",
        )
        return
    if rt.throttle is not None:
        rt.throttle.terminate()
        try:
            rt.throttle.wait(5)
        except subprocess.TimeoutExpired:
            rt.throttle.kill()
        rt.throttle = None
        os.kill(os.getpid(), signal.SIGCONT)
    if factor > 1.0:
        rt.throttle = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "tfmagic.procs.throttle",
                str(os.getpid()),
                str(factor),
                str(msg.get("period_ms", 20.0)),
            ],
            stdin=subprocess.DEVNULL,
            close_fds=True,
        )
    rt.slow_factor = factor
    print(
        f"tfmagic: running at 1/{factor:g} speed" if factor > 1 else "tfmagic: full speed",
        file=sys.__stderr__,
        flush=True,
    )
    rt.send(Event.SLOWED, id=msg.get("id"), factor=factor)


def urgent_note(rt, msg: dict[str, Any]) -> None:
    """A line for this task's log from its owner: the training engine writes each worker's
    progress here, so the log reads like the seeds' ``worker0.out`` and not only TensorFlow's."""
    text = str(msg.get("text", "")).replace("\n", " ")[:500]
    try:
        sys.__stderr__.write(f"tfmagic: {text}\n")
        sys.__stderr__.flush()
    except (OSError, ValueError):
        pass  # a full or closed log: the note is lost, the task goes on


def urgent_free_port(rt, msg: dict[str, Any]) -> None:
    """A port free on this task's host (remote launchers cannot look themselves)."""
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind((msg.get("host") or "", int(msg.get("port") or 0)))
            port = s.getsockname()[1]
    except OSError:
        port = 0  # the port asked about is taken here
    rt.send(Event.FREE_PORT, id=msg.get("id"), port=port)


def urgent_stats(rt, msg: dict[str, Any]) -> None:
    """CPU %, memory (PSS beside RSS) and uptime of this process, for a remote owner."""
    from ..procs.stats import cpu_percent, memory_of, uptime

    pid = os.getpid()
    mem = memory_of(pid) or {}
    rt.send(
        Event.STATS,
        id=msg.get("id"),
        cpu_percent=cpu_percent(pid),
        pss=mem.get("pss"),
        rss=mem.get("rss"),
        uptime_s=uptime(pid),
    )


def urgent_listening(rt, msg: dict[str, Any]) -> None:
    """The TCP addresses this process listens on (the owner checks the bind guard with it)."""
    from ..procs.stats import listening_addresses

    try:
        addresses = [[host, port] for host, port in listening_addresses(os.getpid())]
        rt.send(Event.LISTENING, id=msg.get("id"), pid=os.getpid(), addresses=addresses)
    except Exception as exc:  # noqa: BLE001 - the owner must not wait for an answer that never comes
        rt.send(Event.LISTENING, id=msg.get("id"), pid=os.getpid(), addresses=None, error=repr(exc))


def urgent_sockets(rt, msg: dict[str, Any]) -> None:
    """This process's TCP connections and the bytes each moved (for the traffic map on other hosts)."""
    from ..network.traffic import own_sockets

    found = [[x.pid, list(x.local), list(x.peer), x.sent, x.received] for x in own_sockets({os.getpid()})]
    rt.send(Event.SOCKETS, id=msg.get("id"), sockets=found)


def urgent_stacks(rt, msg: dict[str, Any]) -> None:
    """Every thread's Python stack, as text (why is this task hanging?)."""
    rt.send(
        Event.STACKS,
        id=msg.get("id"),
        pid=os.getpid(),
        task=rt.label,
        exec_id=rt.cells.current_exec,
        threads=thread_stacks(),
        hints=rt.cells.hints() if msg.get("hints") else [],
    )


def urgent_crash(rt, msg: dict[str, Any]) -> None:
    """End now, as a crash would (``cluster.kill`` of a task this owner cannot signal)."""
    rt.die("killed on purpose by the owner (a crash, injected)", code=-9)


def urgent_cut(rt, msg: dict[str, Any]) -> None:
    """Die alone, as modelled (a task sharing its process): cut the server off, keep the process.

    The owner marks the task killed once this answers; an ASSIGN then starts a new server on the
    same port (:meth:`~.runtime.TaskRuntime.assign`), as a restarted machine's would: empty.
    """
    if not rt.shared or rt.server is None or rt.listen_port is None:
        who = "has a process of its own" if not rt.shared else "serves nothing"
        rt.send(Event.ERROR, id=msg.get("id"), message=f"{rt.label} {who}: there is no server to cut off")
        return
    from .server import cut_off

    rt.cut_servers.append(rt.server)  # TensorFlow cannot stop or free a server: it stays, unreachable
    rt.server = None
    cut = cut_off(rt.listen_port)
    print(
        f"tfmagic: {rt.label} cut off ({cut} sockets on port {rt.listen_port}): dead, as modelled", flush=True
    )
    rt.send(Event.CUT, id=msg.get("id"), sockets=cut)


def urgent_interrupt(rt, msg: dict[str, Any]) -> None:
    """Raise KeyboardInterrupt in the running cell (if it is still that cell)."""
    rt.cells.interrupt(msg)


def urgent_go(rt, msg: dict[str, Any]) -> None:
    """Every target of a %%tf_px cell is ready: start its body now."""
    rt.cells.go(msg)


def thread_stacks() -> list[dict[str, Any]]:
    """Each Python thread's name, ids and current stack as text (main thread first)."""
    threads = {t.ident: t for t in threading.enumerate()}
    me = threading.get_ident()
    found = []
    for ident, frame in sys._current_frames().items():
        thread = threads.get(ident)
        found.append(
            {
                "name": thread.name if thread is not None else f"thread {ident}",
                "ident": ident,
                "native_id": getattr(thread, "native_id", None),
                "daemon": thread.daemon if thread is not None else None,
                "current": ident == me,
                "stack": "".join(traceback.format_stack(frame)),
            }
        )
    found.sort(key=lambda t: (t["name"] != "MainThread", t["name"]))
    return found


#: every urgent op's handler
HANDLERS: dict[Op, Callable[[Any, dict[str, Any]], None]] = {
    Op.SLOW: urgent_slow,
    Op.NOTE: urgent_note,
    Op.FREE_PORT: urgent_free_port,
    Op.STATS: urgent_stats,
    Op.LISTENING: urgent_listening,
    Op.SOCKETS: urgent_sockets,
    Op.STACKS: urgent_stacks,
    Op.CRASH: urgent_crash,
    Op.INTERRUPT: urgent_interrupt,
    Op.GO: urgent_go,
    Op.CUT: urgent_cut,
}
assert set(HANDLERS) == URGENT, "every urgent op has a handler, and only those"

__all__ = ["HANDLERS", "thread_stacks"]
