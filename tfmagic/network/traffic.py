"""What moves over each link, measured by the operating system, not estimated from tensor sizes.

Every TCP connection between the cluster's processes carries gRPC: the
kernel to each task, each worker to each ps (and back).  Linux counts the
bytes each socket sent and received (``ss -ti``: ``bytes_sent``,
``bytes_received``), so the traffic of a link is what its sockets say.  A
connection belongs to the link from the process that opened it (its peer
is a task's listening address) to that task; the bytes it sent went one
way and those it received the other.

A :class:`TrafficMeter` samples the sockets of the cluster's processes once
a second (on SSH hosts each task reads its own sockets on its host and
answers over its channel) and keeps, per link, the bytes since the cluster
started (closed connections keep their last count) and a recent rate.
Cost: one ``ss`` call a second without ``-p`` (its owner lookup reads every
process's descriptors; the meter reads only the cluster's own, see
:func:`socket_inodes`), a few milliseconds; see ``bench/inside.py``.
"""

from __future__ import annotations

import re
import shutil
import subprocess
import threading
import time
from collections import deque
from dataclasses import dataclass, field

from ..gilshare import yielding
from ..protocol import Op
from .sockets import socket_inodes

_ADDR = re.compile(r"^(.*):([0-9]+)$")
_PID = re.compile(r"pid=([0-9]+)")
_SENT = re.compile(r"bytes_sent:([0-9]+)")
_ACKED = re.compile(r"bytes_acked:([0-9]+)")
_RECV = re.compile(r"bytes_received:([0-9]+)")
_INODE = re.compile(r"\bino:([0-9]+)")


@dataclass(frozen=True)
class Socket:
    """One established TCP connection of a process, with the bytes it moved so far."""

    pid: int
    local: tuple[str, int]
    peer: tuple[str, int]
    sent: int
    received: int


def _host(text: str) -> str:
    text = text.strip("[]")
    return text.removeprefix("::ffff:")


def parse_ss(output: str, pids: set[int] | None = None, owners: dict[int, int] | None = None) -> list[Socket]:
    """Sockets from ``ss -tinpH state established`` output (only those of ``pids`` when given).

    With ``owners`` (socket inode -> pid, see :func:`socket_inodes`) the output is ``ss -tineH``'s
    and each socket's pid is its inode's owner instead of ``ss -p``'s ``pid=``.
    """
    out = []
    lines = output.splitlines()
    i = 0
    while i < len(lines):
        head = lines[i]
        info = lines[i + 1] if i + 1 < len(lines) and lines[i + 1].startswith(("\t", " ")) else ""
        i += 2 if info else 1
        parts = head.split()
        if len(parts) < 4:
            continue
        if owners is None:
            m_pid = _PID.search(head)
            pid = int(m_pid.group(1)) if m_pid else None
        else:
            m_ino = _INODE.search(head)
            pid = owners.get(int(m_ino.group(1))) if m_ino else None
        if pid is None:
            continue
        if pids is not None and pid not in pids:
            continue
        local, peer = _ADDR.match(parts[2]), _ADDR.match(parts[3])
        if not local or not peer:
            continue
        sent = _SENT.search(info) or _ACKED.search(info)
        received = _RECV.search(info)
        out.append(
            Socket(
                pid,
                (_host(local.group(1)), int(local.group(2))),
                (_host(peer.group(1)), int(peer.group(2))),
                int(sent.group(1)) if sent else 0,
                int(received.group(1)) if received else 0,
            )
        )
    return out


def own_sockets(pids: set[int] | None = None) -> list[Socket]:
    """This host's established TCP sockets of ``pids`` (all when None); [] without ``ss``."""
    ss = shutil.which("ss")
    if ss is None:
        return []
    flags = "-tinpH" if pids is None else "-tineH"
    try:
        out = subprocess.run(
            [ss, flags, "state", "established"], capture_output=True, text=True, timeout=10
        ).stdout
    except (OSError, subprocess.TimeoutExpired):
        return []
    return parse_ss(out, pids, None if pids is None else socket_inodes(pids))


@dataclass
class Link:
    """Bytes from ``src`` to ``dst`` since the cluster started, and how fast lately."""

    src: str
    dst: str
    bytes: int = 0
    rate: float = 0.0  # bytes per second over the last few seconds
    history: deque = field(default_factory=lambda: deque(maxlen=10), repr=False)  # (time, bytes)


class TrafficMeter:
    """Samples the cluster's sockets and keeps the bytes per link (see the module docstring)."""

    def __init__(self, cluster, every: float = 1.0) -> None:
        self.cluster = cluster
        self.every = every
        self._lock = threading.Lock()
        self._conns: dict[tuple, tuple[str, str, int, int]] = {}  # socket key -> (src, dst, sent, received)
        self._links: dict[tuple[str, str], Link] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.samples = 0
        self.sample_s = 0.0  # seconds spent sampling, in all

    # -- who is who --------------------------------------------------------------
    def _endpoints(self) -> tuple[dict[tuple[str, int], str], dict[int, str]]:
        """Listening addresses -> task, and pids on this host -> process name (task or 'kernel')."""
        from .. import client

        defn = self.cluster.cluster_def
        listening: dict[tuple[str, int], str] = {}
        pids: dict[int, str] = {}
        if defn is None:
            return listening, pids
        for task in defn.tasks():
            host, _, port = defn.address(task).rpartition(":")
            for h in {host, "127.0.0.1"} if host in ("localhost", "127.0.0.1") else {host}:
                listening[(h, int(port))] = task
        port = client.client_port() if client._port is not None else None
        if port is not None:
            for h in ("127.0.0.1", "::1", "0.0.0.0", "::"):
                listening[(h, port)] = "kernel"
        import os

        pids[os.getpid()] = "kernel"
        for task, proc in self.cluster.procs.items():
            if proc.pid is not None and not getattr(proc, "destination", None):
                pids[proc.task_pid] = task
        return listening, pids

    def sample(self) -> None:
        """Read every socket once and fold the counters into the links."""
        t0 = time.perf_counter()
        listening, pids = self._endpoints()
        sockets = own_sockets(set(pids))
        named = [(pids[s.pid], s) for s in sockets]
        for task, proc in self.cluster.procs.items():  # tasks on other hosts read their own sockets
            if getattr(proc, "destination", None) and proc.alive:
                try:
                    reply = proc.request(Op.SOCKETS, timeout=3)
                except Exception:  # noqa: BLE001 - a task that cannot answer now is sampled next time
                    continue
                for s in reply.get("sockets") or []:
                    named.append((task, Socket(s[0], tuple(s[1]), tuple(s[2]), s[3], s[4])))
        now = time.time()
        with self._lock:
            for owner, s in named:
                dst = listening.get(s.peer) or listening.get(
                    ("127.0.0.1", s.peer[1]) if s.peer[0] in ("localhost", "::1") else s.peer
                )
                if dst is None or dst == owner:
                    continue  # the accepting side of a connection: counted from the side that opened it
                key = (owner, s.local, s.peer)
                self._conns[key] = (owner, dst, s.sent, s.received)
            totals: dict[tuple[str, str], int] = {}
            for src, dst, sent, received in self._conns.values():
                totals[(src, dst)] = totals.get((src, dst), 0) + sent
                totals[(dst, src)] = totals.get((dst, src), 0) + received
            for key, total in totals.items():
                link = self._links.setdefault(key, Link(*key))
                link.bytes = max(link.bytes, total)
                link.history.append((now, link.bytes))
                (t_old, b_old) = link.history[0]
                link.rate = (link.bytes - b_old) / (now - t_old) if now > t_old else 0.0
        self.samples += 1
        self.sample_s += time.perf_counter() - t0

    def start(self) -> TrafficMeter:
        if self._thread is None or not self._thread.is_alive():
            self._stop.clear()
            self._thread = threading.Thread(target=self._loop, name="tfmagic-traffic", daemon=True)
            self._thread.start()
        return self

    def _loop(self) -> None:
        while not self._stop.wait(self.every):
            if not self.cluster.running:
                break
            try:
                with yielding():  # parsing ss holds the GIL: the engine's threads get it back fast
                    self.sample()
            except Exception:  # noqa: BLE001 - a sample that fails is taken again a second later
                pass

    def stop(self) -> None:
        self._stop.set()

    def links(self) -> list[Link]:
        with self._lock:
            return sorted(self._links.values(), key=lambda link: (link.src, link.dst))

    def traffic(self) -> Traffic:
        """A sample taken now: every link's bytes since the start, and its rate."""
        self.sample()
        return Traffic(
            [
                dict(src=link.src, dst=link.dst, bytes=link.bytes, bytes_per_s=link.rate)
                for link in self.links()
            ]
        )


@dataclass
class Traffic:
    """Bytes per link since the cluster started: ``rows`` (src, dst, bytes, bytes_per_s)."""

    rows: list[dict]

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def between(self, src: str, dst: str) -> int:
        return sum(r["bytes"] for r in self.rows if r["src"] == src and r["dst"] == dst)

    def __str__(self) -> str:
        from ..units import human_bytes

        lines = ["src        dst        bytes      now"]
        for r in self.rows:
            lines.append(
                f"{r['src']:10s} {r['dst']:10s} {human_bytes(r['bytes']):>9s} {human_bytes(int(r['bytes_per_s'])):>8s}/s"
            )
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))
