"""Which process holds a TCP socket, read from ``/proc`` (Linux; empty answers elsewhere).

Three parts of tfmagic ask it: the traffic meter (the sockets of the cluster's own processes),
the network relay (who is at the other end of a connection it accepted) and TensorBoard (that the
process listening on its port is the TensorBoard it started, not another user's). ``ss -p`` would
answer too, but reads the descriptors of every process on the machine for each question.
"""

from __future__ import annotations

import os
import socket
import sys

_TABLES = (("/proc/net/tcp", socket.AF_INET), ("/proc/net/tcp6", socket.AF_INET6))
_LISTEN = "0A"


def socket_inodes(pids: set[int]) -> dict[int, int]:
    """Socket inode -> pid, for the sockets ``pids`` hold (read from ``/proc/PID/fd``)."""
    found: dict[int, int] = {}
    for pid in pids:
        fd_dir = f"/proc/{pid}/fd"
        try:
            names = os.listdir(fd_dir)
        except OSError:
            continue
        for name in names:
            try:
                target = os.readlink(f"{fd_dir}/{name}")
            except OSError:
                continue
            if target.startswith("socket:["):
                found[int(target[8:-1])] = pid
    return found


def _rows():
    """``(fields, family)`` for each socket row of ``/proc/net/tcp`` and ``tcp6`` (the header left out)."""
    for table, family in _TABLES:
        try:
            with open(table) as f:
                next(f, None)
                for row in f:
                    fields = row.split()
                    if len(fields) > 9:
                        yield fields, family
        except OSError:
            continue


def listening_inodes(port: int) -> set[int]:
    """The inodes of the sockets listening on ``port`` (any address, IPv4 or IPv6)."""
    return {
        int(fields[9])
        for fields, _family in _rows()
        if fields[3] == _LISTEN and int(fields[1].rsplit(":", 1)[1], 16) == port
    }


def listening_ports(pids: set[int]) -> set[int]:
    """The TCP ports on which sockets held by ``pids`` listen (how a server that was given port 0
    is found: the port is known only once the process holding it has bound it)."""
    held = socket_inodes(pids)
    return {
        int(fields[1].rsplit(":", 1)[1], 16)
        for fields, _family in _rows()
        if fields[3] == _LISTEN and int(fields[9]) in held
    }


def holder(inodes: set[int]) -> int | None:
    """The pid of a process holding one of ``inodes`` (None: none whose descriptors we can read,
    for example another user's)."""
    if not inodes:
        return None
    try:
        pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return None
    for pid in pids:
        for inode, owner in socket_inodes({pid}).items():
            if inode in inodes:
                return owner
    return None


def connection_inode(local: tuple[str, int], remote: tuple[str, int]) -> int | None:
    """The inode of the TCP socket bound to ``local`` and connected to ``remote``."""
    found = connection(local, remote)
    return found[0] if found else None


def connection(local: tuple[str, int], remote: tuple[str, int]) -> tuple[int, int] | None:
    """``(inode, uid)`` of the TCP socket bound to ``local`` and connected to ``remote``: the uid owns it.

    The row is found by comparing the table's own text with the two addresses written the way the
    kernel writes them (each in both tables' forms), not by decoding every row: a relay asked about
    one connection among hundreds (a stranger's burst) reads the table once and decodes nothing.
    The uid lets a caller refuse another user's socket without reading any process's descriptors.
    """
    wanted = {(mine, theirs) for mine in _spellings(*local) for theirs in _spellings(*remote)}
    for fields, _family in _rows():
        if (fields[1], fields[2]) in wanted:
            return int(fields[9]), int(fields[7])
    return None


def _spellings(host: str, port: int) -> list[str]:
    """``127.0.0.1``, 8080 -> ``["0100007F:1F90", "0000000000000000FFFF00000100007F:1F90"]``: how
    ``/proc/net/tcp`` (one 32-bit word) and ``tcp6`` (an IPv4-mapped address) write it.  Each 32-bit
    word is in host order."""
    host = _plain(host)
    forms = []
    try:
        v4 = socket.inet_pton(socket.AF_INET, host)
        forms = [v4, socket.inet_pton(socket.AF_INET6, "::ffff:" + host)]
    except OSError:
        try:
            forms = [socket.inet_pton(socket.AF_INET6, host)]
        except OSError:
            return []
    little = sys.byteorder == "little"
    return [
        "".join(
            (raw[i : i + 4][::-1] if little else raw[i : i + 4]).hex().upper() for i in range(0, len(raw), 4)
        )
        + f":{port:04X}"
        for raw in forms
    ]


def _plain(host: str) -> str:
    return host.removeprefix("::ffff:")
