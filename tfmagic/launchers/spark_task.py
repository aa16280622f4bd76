"""The executor side of the Spark launcher: a relay between the driver and one task process.

Each Spark task of a tfmagic job runs :func:`relay_partition`.  It connects
back to the listener the launcher opened in the driver (the notebook kernel),
proves it knows the cluster's secret and checks that the driver knows it too,
then starts ``python -u -m tfmagic.task_main`` as its child and carries bytes
both ways: the driver's ops to the child's standard input and the child's
events back (the *control* connection, raw bytes, exactly what a local task
reads and writes on its pipes), and the child's standard error to the driver's
log file (the *log* connection, framed, which also carries the child's pid and
its exit code).

Why a child process and not TensorFlow inside the Spark worker: a TensorFlow
server cannot be stopped short of ending its process, and the pyspark worker
belongs to Spark.  The child is tied to the relay: when the driver goes away
(``stop``, or the kernel dies, even by ``kill -9``) the control connection
ends and the relay closes the child's standard input; when Spark kills the
task (job cancelled, driver lost) the relay's process dies, which closes that
pipe too.  Either way the task reads end-of-file and ends itself and its
process group (:mod:`tfmagic.task_main`).  A task that cannot read (stopped
with SIGSTOP, a debugger) is ended all the same: the kernel SIGKILLs it when
the relay dies (``TFMAGIC_PDEATHSIG``), and a relay whose driver went away
kills its task's process group if the task has not ended
:data:`ORPHAN_GRACE` seconds later.

This module imports only the standard library: the launcher ships it to the
executors by value inside the Spark closure, so the relay code always matches
the driver's, and the secret never appears on a command line or in an
environment.  The task process itself needs tfmagic and TensorFlow installed
for the executors' Python.
"""

from __future__ import annotations

import hashlib
import hmac
import json
import os
import signal
import socket
import struct
import subprocess
import sys
import threading
import time
from typing import Any

#: First line the driver sends on every connection (and the version of this wire format).
GREETING = b"TFMAGIC-SPARK/1"
#: Frames on the log connection: one kind byte, a 4-byte big-endian length, the payload.
PID, LOG, EXIT, ERROR = b"P", b"L", b"X", b"E"
HANDSHAKE_TIMEOUT = 15.0
#: Seconds a busy driver (one that hangs up before its greeting) is tried again for.
BUSY_PATIENCE = 30.0
#: Seconds a task has to end by itself after its driver's connection ended.
ORPHAN_GRACE = 5.0
#: Environment variables of the Spark worker a task must not inherit.
_DROP_ENV = ("PYTHON_WORKER_FACTORY_SECRET", "PYSPARK_GATEWAY_SECRET", "PYSPARK_GATEWAY_PORT")


def mac(secret: bytes, who: bytes, first: bytes, second: bytes) -> str:
    """The proof that ``who`` (``b"relay"`` or ``b"driver"``) holds ``secret``, over both nonces."""
    return hmac.new(secret, who + b"\0" + first + second, hashlib.sha256).hexdigest()


def frame(kind: bytes, payload: bytes) -> bytes:
    return kind + struct.pack(">I", len(payload)) + payload


def read_exact(sock: socket.socket, n: int) -> bytes | None:
    """``n`` bytes from ``sock``, or ``None`` at end-of-stream."""
    chunks, got = [], 0
    while got < n:
        chunk = sock.recv(n - got)
        if not chunk:
            return None
        chunks.append(chunk)
        got += len(chunk)
    return b"".join(chunks)


def read_frame(sock: socket.socket) -> tuple[bytes, bytes] | None:
    head = read_exact(sock, 5)
    if head is None:
        return None
    (length,) = struct.unpack(">I", head[1:])
    body = read_exact(sock, length) if length else b""
    if body is None:
        return None
    return head[:1], body


class _Closed(ConnectionError):
    """The peer hung up before sending a byte of the line."""


def read_line(sock: socket.socket, limit: int = 4096) -> bytes:
    """One ``\\n``-terminated line, read byte by byte so nothing after it is consumed."""
    out = bytearray()
    while len(out) < limit:
        b = sock.recv(1)
        if not b:
            if not out:
                raise _Closed("the peer closed the connection")
            raise ConnectionError("the peer closed the connection in the middle of a line")
        if b == b"\n":
            return bytes(out)
        out += b
    raise ConnectionError(f"the peer sent a line longer than {limit} bytes")


def keepalive(sock: socket.socket) -> None:
    """Notice a vanished peer (host down, cable out) in about half a minute."""
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in (("TCP_KEEPIDLE", 10), ("TCP_KEEPINTVL", 5), ("TCP_KEEPCNT", 3)):
        if hasattr(socket, name):
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


def _greeted(config: dict[str, Any]) -> tuple[socket.socket, bytes]:
    """A connection to the driver and its greeting line.

    The driver bounds how many handshakes run at once and hangs up on a
    connection beyond them before greeting it (strangers may be keeping it
    busy): that connection is tried again, with a growing pause, for up to
    :data:`BUSY_PATIENCE` seconds.
    """
    deadline = time.monotonic() + BUSY_PATIENCE
    pause = 0.1
    while True:
        sock = socket.create_connection((config["host"], config["port"]), timeout=HANDSHAKE_TIMEOUT)
        try:
            keepalive(sock)
            return sock, read_line(sock)
        except (_Closed, ConnectionResetError):  # hung up before its greeting: busy
            sock.close()
            if time.monotonic() + pause > deadline:
                raise
        except BaseException:
            sock.close()
            raise
        time.sleep(pause)
        pause = min(pause * 2, 2.0)


def connect(config: dict[str, Any], hello: dict[str, Any]) -> tuple[socket.socket, dict[str, Any]]:
    """Open one authenticated connection to the driver and introduce this relay.

    Mutual: the relay proves it holds the secret, then the driver proves it
    does (so a relay never hands its task to whoever took the driver's port).
    Returns the socket and the driver's answer (``{"ok": bool, ...}``).
    """
    sock, greeting = _greeted(config)
    try:
        name, _, server_nonce_hex = greeting.partition(b" ")
        if name != GREETING:
            raise ConnectionError(f"not a tfmagic driver: {greeting[:60]!r}")
        server_nonce = bytes.fromhex(server_nonce_hex.decode())
        nonce = os.urandom(32)
        secret = bytes.fromhex(config["secret"])
        sock.sendall(
            nonce.hex().encode() + b" " + mac(secret, b"relay", server_nonce, nonce).encode() + b"\n"
        )
        proof = read_line(sock).decode()
        if not hmac.compare_digest(proof, mac(secret, b"driver", nonce, server_nonce)):
            raise ConnectionError("the driver could not prove it holds the cluster's secret")
        sock.sendall(json.dumps(hello).encode() + b"\n")
        answer = json.loads(read_line(sock))
        sock.settimeout(None)
        return sock, answer
    except BaseException:
        sock.close()
        raise


def child_environment(config: dict[str, Any], address: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if k not in _DROP_ENV}
    for key, value in (config.get("env") or {}).items():
        if value is None:
            env.pop(key, None)
        else:
            env[key] = str(value)
    # The kernel SIGKILLs the task when this relay dies, even a task stopped with SIGSTOP
    # (which cannot read the end of its channel).  Linux sends it when the *thread* that
    # started the child ends: :func:`relay` starts the child and then waits for it in the
    # same thread, so that thread outlives the task's need of it.
    env["TFMAGIC_PDEATHSIG"] = "1"
    env["TFMAGIC_OWNER_PID"] = str(os.getpid())
    if config.get("guard"):
        env["TFMAGIC_GUARD_HOST"] = address
    extra = config.get("pythonpath")
    if extra and os.path.isdir(os.path.join(extra, "tfmagic")):
        path = env.get("PYTHONPATH", "")
        env["PYTHONPATH"] = extra + (os.pathsep + path if path else "")
    return env


def _pump_in(sock: socket.socket, child: subprocess.Popen) -> None:
    """Driver → task; end-of-stream here is the task's lifeline ending."""
    fd = child.stdin.fileno()
    try:
        while True:
            data = sock.recv(65536)
            if not data:
                break
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
    except OSError:
        pass
    finally:
        try:
            child.stdin.close()
        except OSError:
            pass
    # The driver is gone (or ended the task's channel): a task that does not end by itself
    # (stopped? stuck?) is ended with its process group.
    try:
        child.wait(ORPHAN_GRACE)
    except subprocess.TimeoutExpired:
        try:
            os.killpg(child.pid, signal.SIGKILL)
        except OSError:
            pass


def _pump_out(child: subprocess.Popen, sock: socket.socket) -> None:
    """Task → driver (its events)."""
    fd = child.stdout.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            sock.sendall(data)
    except OSError:
        pass
    finally:
        try:
            sock.shutdown(socket.SHUT_WR)
        except OSError:
            pass


def _pump_log(child: subprocess.Popen, log: socket.socket, lock: threading.Lock) -> None:
    """Task's standard error → the driver's log file."""
    fd = child.stderr.fileno()
    try:
        while True:
            data = os.read(fd, 65536)
            if not data:
                break
            with lock:
                log.sendall(frame(LOG, data))
    except OSError:
        pass


def relay(config: dict[str, Any], slot: int, attempt: int) -> int | None:
    """Serve one task slot; returns the task's exit code (``None``: the driver refused us)."""
    hello = {
        "batch": config["batch"],
        "slot": slot,
        "attempt": attempt,
        "relay_pid": os.getpid(),
        "hostname": socket.gethostname(),
    }
    control, answer = connect(config, {**hello, "channel": "control"})
    if not answer.get("ok"):
        control.close()
        return None  # a retried attempt of a slot that was served already, or a stopped batch
    address = control.getsockname()[0]
    try:
        log, answer = connect(config, {**hello, "channel": "log"})
    except BaseException:
        control.close()
        raise
    if not answer.get("ok"):
        control.close()
        log.close()
        return None
    lock = threading.Lock()

    def send(kind: bytes, payload: dict[str, Any] | bytes) -> None:
        data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
        with lock:
            try:
                log.sendall(frame(kind, data))
            except OSError:
                pass

    python = config.get("python") or sys.executable
    # Started from this thread, which then waits for the child: see child_environment.
    try:
        child = subprocess.Popen(
            [python, "-u", "-m", "tfmagic.task_main"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            env=child_environment(config, address),
            start_new_session=True,
            close_fds=True,
        )
    except OSError as exc:
        send(ERROR, {"message": f"could not start {python} on {socket.gethostname()}: {exc}"})
        send(EXIT, {"code": 127})
        for s in (control, log):
            s.close()
        return 127
    send(PID, {"pid": child.pid, "address": address, "hostname": socket.gethostname(), "python": python})
    pumps = [
        threading.Thread(target=_pump_in, args=(control, child), daemon=True),
        threading.Thread(target=_pump_out, args=(child, control), daemon=True),
        threading.Thread(target=_pump_log, args=(child, log, lock), daemon=True),
    ]
    for t in pumps:
        t.start()
    code = child.wait()
    deadline = time.monotonic() + 5
    for t in pumps[1:]:
        t.join(max(0.0, deadline - time.monotonic()))
    send(EXIT, {"code": code})
    for s in (control, log):
        try:
            s.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        s.close()
    return code


def relay_partition(config: dict[str, Any], iterator):
    """The function Spark runs for each partition (one partition = one task slot)."""
    for _ in iterator:
        pass
    slot, attempt = 0, 0
    try:
        from pyspark import TaskContext

        ctx = TaskContext.get()
        if ctx is not None:
            slot, attempt = ctx.partitionId(), ctx.attemptNumber()
    except ImportError:  # pragma: no cover - always there inside a Spark worker
        pass
    error = None
    try:
        code = relay(config, slot, attempt)
    except Exception as exc:  # noqa: BLE001 - a failed barrier task would take the others down
        error = f"{type(exc).__name__}: {exc}"
        sys.stderr.write(f"tfmagic relay for slot {slot} on {socket.gethostname()}: {error}\n")
        code = None
    yield (slot, code, error)
