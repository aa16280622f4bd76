"""Which process holds a socket, read from /proc (no processes started: this one's own sockets)."""

from __future__ import annotations

import os
import socket

import pytest

from tfmagic.network import sockets

pytestmark = pytest.mark.unit


def test_the_listener_and_both_ends_of_a_connection_are_found_as_this_process():
    server = socket.create_server(("127.0.0.1", 0))
    port = server.getsockname()[1]
    try:
        listening = sockets.listening_inodes(port)
        assert listening and sockets.holder(listening) == os.getpid()
        client = socket.create_connection(("127.0.0.1", port))
        accepted, _ = server.accept()
        try:
            mine = sockets.socket_inodes({os.getpid()})
            inode = sockets.connection_inode(client.getsockname(), accepted.getsockname())
            assert inode is not None and mine[inode] == os.getpid()
            assert sockets.connection_inode(accepted.getsockname(), client.getsockname()) != inode
        finally:
            client.close()
            accepted.close()
    finally:
        server.close()
    assert sockets.listening_inodes(port) == set() and sockets.holder(set()) is None
