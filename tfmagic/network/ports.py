"""Ports and addresses: the few network questions tfmagic asks, answered in one place.

Standard library only, so the task process (:mod:`tfmagic.task_main`) uses
the same answers as its owner.
"""

from __future__ import annotations

import socket


def free_port(host: str = "127.0.0.1") -> int:
    """A port nobody listens on right now on ``host``.

    It may be taken before the caller binds it: a cluster start retries with
    fresh ports when that happens.
    """
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def port_is_free(host: str, port: int) -> bool:
    """Whether ``host:port`` can be bound here now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as probe:
        try:
            probe.bind((host, port))
        except OSError:
            return False
    return True


def split(address: str) -> tuple[str, int]:
    """``("10.0.0.2", 2222)`` from ``"10.0.0.2:2222"``."""
    host, _, port = address.rpartition(":")
    return host.strip("[]"), int(port)


def port_answers(address: str, timeout: float = 2.0) -> bool:
    """Whether something accepts TCP connections at ``host:port``."""
    host, port = split(address)
    try:
        socket.create_connection((host, port), timeout=timeout).close()
    except OSError:
        return False
    return True


def grpc_answers(address: str, timeout: float = 3.0) -> bool:
    """Whether a gRPC server (a TensorFlow task) answers at ``host:port`` within ``timeout``.

    Stricter than :func:`port_answers`: a port that accepts connections but
    never speaks HTTP/2 (a stuck process, something else on that port) would
    make TensorFlow's client wait for it for ever; this says no after
    ``timeout`` instead.
    """
    import grpc  # installed with TensorFlow

    channel = grpc.insecure_channel(address)
    try:
        grpc.channel_ready_future(channel).result(timeout=timeout)
        return True
    except grpc.FutureTimeoutError:
        return False
    finally:
        channel.close()


def route_address(to_host: str) -> str:
    """This machine's address on the route to ``to_host`` (no packet is sent)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as probe:
        probe.connect((to_host, 9))
        return probe.getsockname()[0]
