"""This process's own TensorFlow server (the client's): kept on loopback, reached from other hosts
only through a door that admits the cluster's hosts.

Why: connecting to a cluster makes TensorFlow start a gRPC server inside the client (the notebook
kernel), bound to every interface (the address is fixed in TensorFlow) and running any graph it is
sent, as the user, with no login.  A task process is kept off the network by preloading the bind
library (:mod:`tfmagic.network.bindguard`); the kernel is already running when it connects, so nothing can be
preloaded into it.  Instead, before its first connection, :func:`keep_local` points the ``bind()``
entries of TensorFlow's own libraries (not the kernel's ZeroMQ sockets, not Python's) at the same
rewrite, so the server listens on ``127.0.0.1`` only.

Tasks on other hosts (SSH without tunnels, Spark on other machines) pull the tensors the client made
from this server, at this machine's address on the route to them.  For those, :func:`open_door`
listens on that one address and the client's port and passes on connections from the cluster's own
hosts only; anyone else is refused before a byte reaches TensorFlow.

Other users of this machine reach ``127.0.0.1`` too: their connections are closed before TensorFlow
sees them (the bind library's peer check, :func:`~tfmagic.network.bindguard.own_peers_this_process`).
What stays open: any process of this user, and a door admits every process of the hosts it admits.  :func:`describe` says where the
server listens, measured from this process's socket table, not assumed.
"""

from __future__ import annotations

import ipaddress
import os
import socket
import threading
from dataclasses import dataclass, field

LOOPBACK = "127.0.0.1"

#: Every TensorFlow server makes ``TF_GRPC_WORKER_CACHE_QUEUES`` completion queues for its calls to
#: other tasks, a polling thread each: 64 by default (``CreateGrpcWorkerEnv``, TensorFlow's
#: grpc_worker_cache.cc), 60 threads a task that a laptop's few cores never use.  Tasks get 4: a task
#: of 1 ps + 4 workers went from 107 threads to 47, memory and async updates a second unchanged
#: within the noise (``python bench/grpc_queues.py``).  Not the client: set in the kernel as it
#: connects (any value), reads of a ps's variables after a worker was removed failed with "Socket
#: closed" (8 runs of 8; 0 of 6 without it); the kernel keeps TensorFlow's default.
#: And each server's worker service serves with ``TFMAGIC_SERVING_THREADS`` threads instead of
#: TensorFlow's 8, through the bind library that every task preloads (``_native/servethreads.c``):
#: the calls those threads post before any arrives were most of a task's memory.
GRPC_ENV = {
    "TF_GRPC_WORKER_CACHE_QUEUES": os.environ.get("TF_GRPC_WORKER_CACHE_QUEUES", "4"),
    "TFMAGIC_SERVING_THREADS": os.environ.get("TFMAGIC_SERVING_THREADS", "1"),
}

_lock = threading.Lock()


@dataclass
class _State:
    tried: bool = False
    guarded: bool = False
    own_peers: bool = False  # loopback connections of other users are closed before TensorFlow
    reason: str = ""
    doors: dict[str, _Door] = field(default_factory=dict)


_state = _State()


def keep_local() -> bool:
    """Keep the TensorFlow server this process starts on its first connection on loopback.

    Call before that connection (TensorFlow must be imported: its libraries are what gets
    changed).  Returns whether the guard is in place; when it is not, :func:`describe` says why.
    Idempotent.
    """
    with _lock:
        if _state.tried:
            return _state.guarded
        _state.tried = True
        from .bindguard import guard_this_process, own_peers_this_process

        changed, reason = guard_this_process(LOOPBACK)
        _state.guarded = changed > 0
        _state.reason = reason
        _state.own_peers = _state.guarded and own_peers_this_process() > 0
        return _state.guarded


def serve_lightly() -> int:
    """The TensorFlow server this process starts on its first connection serves with the tasks'
    threads (``GRPC_ENV``), not TensorFlow's 8; returns how many library entries changed (0: none
    could, and the server is TensorFlow's own, about 33 MB heavier).  Call before that connection."""
    from .bindguard import serving_threads_this_process

    return serving_threads_this_process(int(GRPC_ENV["TFMAGIC_SERVING_THREADS"]))


def _dead_peer_s(text: str | None, default: float = 30.0) -> float:
    try:
        value = float(text) if text else default
    except ValueError:
        return default  # a malformed setting keeps the default rather than failing every connection
    return value if value >= 0 else default


#: How long this process's TensorFlow waits on a peer that stopped answering before its calls fail
#: (``TFMAGIC_DEAD_PEER_S``; 0 keeps TCP's own, about 15 minutes): a node that died without a word
#: otherwise holds the kernel's next connection that long.
DEAD_PEER_S = _dead_peer_s(os.environ.get("TFMAGIC_DEAD_PEER_S"))


def give_up_on_silent_peers() -> int:
    """The connections TensorFlow opens from this process from now on fail ``DEAD_PEER_S`` after
    their peer stops answering; returns how many library entries changed (0: none could).  Call
    before the first connection."""
    from .bindguard import dead_peer_this_process

    return dead_peer_this_process(DEAD_PEER_S) if DEAD_PEER_S > 0 else 0


def is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return host == "localhost"


def open_door(host: str, port: int, peers: set[str]) -> _Door | None:
    """Let ``peers`` (IP addresses) reach the client's server at ``host:port``; None if not needed.

    Not needed (None) when ``host`` is loopback, or when the guard is not in place (the server then
    listens on every interface already).  The client is connected to one cluster at a time, so a
    door admits the hosts of the cluster connected now, and every other door is closed.
    """
    needed = _state.guarded and not is_loopback(host)
    with _lock:
        for other in [h for h in _state.doors if h != host or not needed]:
            _state.doors.pop(other).close()
        if not needed:
            return None
        door = _state.doors.get(host)
        if door is None or not door.alive():
            door = _Door(host, port, peers)
            _state.doors[host] = door
        else:
            door.peers = set(peers)
        return door


def close_doors() -> None:
    """Close every door (the cluster whose tasks they admitted stopped)."""
    with _lock:
        while _state.doors:
            _state.doors.popitem()[1].close()


def listening(port: int) -> list[tuple[str, int]]:
    """Where this process listens on ``port``, measured (``[]``: not yet)."""
    import os

    from ..procs.stats import listening_addresses

    return [(h, p) for h, p in listening_addresses(os.getpid()) if p == port]


def describe(port: int | None = None) -> str:
    """One clause for the security line: where this process's TensorFlow server listens.

    Measured when the server is up (``port`` given and listening), else what the next connection
    will do.
    """
    doors = [d for d in _state.doors.values() if d.alive()]
    where = listening(port) if port is not None else []
    hosts = sorted({h.removeprefix("::ffff:") for h, _ in where} - {d.host for d in doors})
    if any(h in ("0.0.0.0", "::") for h in hosts):
        why = f" ({_state.reason})" if _state.reason else ""
        return f"this kernel serves TensorFlow on EVERY network interface (port {port}){why}"
    mine = ", to your own processes only" if _state.own_peers else ""
    if where:
        said = f"this kernel serves TensorFlow on {', '.join(hosts)} only (port {port}){mine}"
    else:
        # why the next connection's server will not be kept on loopback ("" when it will be)
        if _state.tried:
            reason = _state.reason
        else:
            from .bindguard import bind_guard

            reason = bind_guard(LOOPBACK).reason
        if reason:
            return f"once connected, this kernel serves TensorFlow on EVERY network interface ({reason})"
        from .bindguard import peers_checkable

        mine = ", to your own processes only" if peers_checkable() else ""
        said = f"once connected, this kernel serves TensorFlow on {LOOPBACK} only{mine}"
    for door in doors:
        said += f", and admits {', '.join(sorted(door.peers))} at {door.host}:{door.port} ({door.refused} others refused)"
    return said


class _Door:
    """A listening socket on ``host:port`` passing connections from ``peers`` to ``127.0.0.1:port``."""

    def __init__(self, host: str, port: int, peers: set[str]) -> None:
        self.host = host
        self.port = port
        self.peers = set(peers)
        self.refused = 0
        self.admitted = 0
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._thread = threading.Thread(target=self._serve, name=f"tfmagic-door-{host}", daemon=True)
        self._thread.start()

    def alive(self) -> bool:
        return self._thread.is_alive()

    def close(self) -> None:
        try:
            self._sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._sock.close()

    def _serve(self) -> None:
        while True:
            try:
                conn, peer = self._sock.accept()
            except OSError:
                return
            if peer[0] not in self.peers:
                self.refused += 1
                conn.close()
                continue
            self.admitted += 1
            try:
                inner = socket.create_connection((LOOPBACK, self.port), timeout=5)
            except OSError:
                conn.close()
                continue
            inner.settimeout(None)
            for src, dst in ((conn, inner), (inner, conn)):
                threading.Thread(target=_pump, args=(src, dst), name="tfmagic-door-pump", daemon=True).start()


def _pump(src: socket.socket, dst: socket.socket) -> None:
    try:
        while data := src.recv(1 << 16):
            dst.sendall(data)
    except OSError:
        pass
    finally:
        for s in (src, dst):
            try:
                s.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
        src.close()


def peers_of(addresses: list[str]) -> set[str]:
    """The IPv4 addresses of the hosts in ``host:port`` task addresses."""
    found: set[str] = set()
    for address in addresses:
        found |= host_addresses(address.rsplit(":", 1)[0])
    return found


def host_addresses(host: str) -> set[str]:
    """The IPv4 addresses a connection from ``host`` (a name or an address) can show; none if unknown."""
    try:
        infos = socket.getaddrinfo(host.strip("[]"), None, socket.AF_INET, socket.SOCK_STREAM)
    except OSError:
        return set()
    return {info[4][0] for info in infos}
