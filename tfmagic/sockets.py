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
    want_port = f"{local[1]:04X}"
    want = (_plain(local[0]), local[1], _plain(remote[0]), remote[1])
    for fields, family in _rows():
        if (
            fields[1].endswith(want_port)
            and (*_address(fields[1], family), *_address(fields[2], family)) == want
        ):
            return int(fields[9])
    return None


def _address(text: str, family: int) -> tuple[str, int]:
    """``0100007F:1F90`` -> (``127.0.0.1``, 8080): /proc/net/tcp writes each 32-bit word in host order."""
    hexip, _, hexport = text.partition(":")
    raw = bytes.fromhex(hexip)
    raw = b"".join(raw[i : i + 4][::-1] for i in range(0, len(raw), 4)) if sys.byteorder == "little" else raw
    return _plain(socket.inet_ntop(family, raw)), int(hexport, 16)


def _plain(host: str) -> str:
    return host.removeprefix("::ffff:")
