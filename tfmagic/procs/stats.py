"""CPU and memory of task processes, measured the way users should read them.

Memory is reported as PSS beside RSS: TensorFlow processes share most of
their pages (the same libraries), so RSS counts the same memory once per
process and makes a cluster look about twice as costly as it is.
"""

from __future__ import annotations

import threading
import time

import psutil

_lock = threading.Lock()
_last_cpu: dict[int, tuple[float, float, float]] = {}  # pid -> (create_time, wall, cpu seconds)


def memory_of(pid: int) -> dict[str, int] | None:
    """``{"rss": bytes, "pss": bytes}`` of a process, or ``None`` if it is gone."""
    try:
        proc = psutil.Process(pid)
        try:
            info = proc.memory_full_info()
            return {"rss": info.rss, "pss": getattr(info, "pss", info.rss)}
        except (psutil.AccessDenied, OSError):
            return {"rss": proc.memory_info().rss, "pss": 0}
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def cpu_percent(pid: int) -> float | None:
    """CPU use since the previous call for this pid (since start the first time).

    100 means one full core.  Keeping our own previous sample (instead of
    psutil's blocking ``interval=``) lets a status table of many tasks be
    taken at once, and a refreshing dashboard get a true recent rate.
    """
    try:
        proc = psutil.Process(pid)
        with proc.oneshot():
            created = proc.create_time()
            times = proc.cpu_times()
    except (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied):
        return None
    cpu = times.user + times.system
    now = time.time()
    with _lock:
        prev = _last_cpu.get(pid)
        _last_cpu[pid] = (created, now, cpu)
    if prev is None or prev[0] != created or now - prev[1] < 0.05:
        wall, used = now - created, cpu
    else:
        wall, used = now - prev[1], cpu - prev[2]
    return round(100.0 * used / wall, 1) if wall > 0 else 0.0


def uptime(pid: int) -> float | None:
    try:
        return time.time() - psutil.Process(pid).create_time()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None


def listening_addresses(pid: int) -> list[tuple[str, int]]:
    """The TCP addresses ``pid`` listens on, as sorted ``(host, port)``; ``[]`` if it is gone.

    IPv6 sockets show as such (``"::"``, ``"::ffff:127.0.0.1"``).  Raises
    ``psutil.AccessDenied`` for another user's process rather than answer
    ``[]`` for what it could not see.
    """
    try:
        proc = psutil.Process(pid)
        connections = getattr(proc, "net_connections", None) or proc.connections  # psutil < 6
        found = connections(kind="tcp")
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return []
    return sorted({(c.laddr.ip, c.laddr.port) for c in found if c.status == psutil.CONN_LISTEN})


def run_state(pid: int) -> str | None:
    """``running``, ``stopped`` (SIGSTOP, or a debugger), ``zombie`` ... of a process; None if it is gone.

    A task stopped from outside cannot answer its channel or its gRPC
    peers, and TensorFlow's client then waits for it for ever: the status
    table and the hang doctor say so instead of showing it as running.
    """
    try:
        status = psutil.Process(pid).status()
    except (psutil.NoSuchProcess, psutil.ZombieProcess):
        return None
    if status in (psutil.STATUS_STOPPED, psutil.STATUS_TRACING_STOP):
        return "stopped"
    if status == psutil.STATUS_ZOMBIE:
        return "zombie"
    return "running"


def listener_of(port: int) -> str | None:
    """``pid 1234 (python3)``: the local process listening on TCP ``port``, if this process may see it.

    Said when a task cannot bind its port, so the person knows what to stop
    instead of reading "address in use".
    """
    try:
        for conn in psutil.net_connections(kind="tcp"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port and conn.pid:
                try:
                    name = psutil.Process(conn.pid).name()
                except psutil.Error:
                    name = "?"
                return f"pid {conn.pid} ({name})"
    except (psutil.Error, OSError):
        return None
    return None
