"""The listener the relays connect back to: authentication, slots, and the log connections.

Each Spark task's relay (:mod:`tfmagic.launchers.spark_task`) opens two
connections to this listener, a *control* one (the task's channel) and a
*log* one (framed: the task's pid, its stderr, its exit code).  Each must
first pass a mutual HMAC challenge-response over a nonce from each side
with the per-cluster secret (compared with :func:`hmac.compare_digest`),
then introduce itself as a slot of a job; :class:`Relay` hands it to that
slot through its ``claim`` callback.

Anyone on the network (or any local user) can connect, so what a stranger
can cost is bounded:

* at most :data:`MAX_HANDSHAKES` handshakes run at once, one short-lived
  thread each; a connection beyond that is closed at once, without a thread;
* a handshake must be over within :data:`HANDSHAKE_SECONDS` (a whole-line
  deadline, not a per-read one, so dripping bytes does not help);
* a refusal is counted (``refused_count``) and the last few are kept with
  peer and reason (``refused``); it is logged at debug level only, never
  printed into the notebook: ``status`` says how many were refused.

A relay turned away by a busy listener tries again (see ``spark_task.connect``).
"""

from __future__ import annotations

import hmac
import json
import logging
import secrets
import socket
import threading
import time
from collections import deque
from collections.abc import Callable
from typing import Any, NamedTuple

from .. import spark_task
from .jobs import Slot

log = logging.getLogger("tfmagic.spark")

#: Handshakes that may run at once; a connection beyond them is closed at once.
MAX_HANDSHAKES = 8
#: Seconds a connection has to complete its handshake (a relay needs milliseconds).
HANDSHAKE_SECONDS = 5.0
#: Refusals kept with their peer and reason (all are counted).
KEEP_REFUSALS = 20


class Refusal(NamedTuple):
    time: float
    peer: str
    reason: str


class _Refused(Exception):
    """A handshake that ends in a refusal, with the reason."""


def _read_line(conn: socket.socket, deadline: float, limit: int) -> bytes:
    """One ``\\n``-terminated line by ``deadline`` (byte by byte: nothing after it is consumed)."""
    out = bytearray()
    while len(out) < limit:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise _Refused(
                f"said nothing within {HANDSHAKE_SECONDS:g} s"
                if not out
                else f"did not finish its handshake within {HANDSHAKE_SECONDS:g} s"
            )
        conn.settimeout(remaining)
        try:
            b = conn.recv(1)
        except TimeoutError:
            continue  # the deadline check above says which
        if not b:
            raise _Refused("hung up during the handshake")
        if b == b"\n":
            return bytes(out)
        out += b
    raise _Refused(f"sent a line longer than {limit} bytes")


class Relay:
    """The listener the relays connect back to (opened on the first job, closed by :meth:`close`).

    ``claim(hello, conn)`` gives an authenticated connection its slot, or
    says why it gets none; ``bind_address()`` is where to listen.
    """

    def __init__(
        self,
        claim: Callable[[dict[str, Any], socket.socket], tuple[Slot | None, str]],
        bind_address: Callable[[], str],
        *,
        max_handshakes: int = MAX_HANDSHAKES,
        handshake_seconds: float = HANDSHAKE_SECONDS,
    ) -> None:
        self.claim = claim
        self.bind_address = bind_address
        self.secret = secrets.token_bytes(32)
        self.max_handshakes = max_handshakes
        self.handshake_seconds = handshake_seconds
        #: the listening socket (``None`` before the first job and after :meth:`close`)
        self.sock: socket.socket | None = None
        #: the last refusals, newest last; ``refused_count`` counts them all
        self.refused: deque[Refusal] = deque(maxlen=KEEP_REFUSALS)
        self.refused_count = 0
        self._handshakes = threading.BoundedSemaphore(max_handshakes)
        self._lock = threading.Lock()

    # -- the listener -----------------------------------------------------------------
    def listen(self) -> int:
        """Open the listener if it is not open; its port."""
        with self._lock:
            if self.sock is None:
                sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
                sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
                sock.bind((self.bind_address(), 0))
                sock.listen(128)
                self.sock = sock
                threading.Thread(
                    target=self._accept, args=(sock,), name="tfmagic-spark-listen", daemon=True
                ).start()
            return self.sock.getsockname()[1]

    @property
    def port(self) -> int | None:
        sock = self.sock
        return sock.getsockname()[1] if sock is not None else None

    def close(self) -> None:
        with self._lock:
            sock, self.sock = self.sock, None
        if sock is not None:
            try:  # close() alone does not wake the thread blocked in accept() on Linux
                sock.shutdown(socket.SHUT_RDWR)
            except OSError:
                pass
            sock.close()

    def _accept(self, listener: socket.socket) -> None:
        while True:
            try:
                conn, peer = listener.accept()
            except OSError:
                return  # closed
            where = f"{peer[0]}:{peer[1]}"
            if not self._handshakes.acquire(blocking=False):
                self._refuse(conn, where, f"{self.max_handshakes} handshakes were under way already")
                continue
            try:
                threading.Thread(
                    target=self._handshake, args=(conn, where), name="tfmagic-spark-conn", daemon=True
                ).start()
            except RuntimeError:  # no thread to be had
                self._handshakes.release()
                self._refuse(conn, where, "no thread for its handshake")

    # -- refusals -------------------------------------------------------------------------
    def _refuse(self, conn: socket.socket, peer: str, reason: str) -> None:
        with self._lock:
            self.refused.append(Refusal(time.time(), peer, reason))
            self.refused_count += 1
        log.debug("spark listener: refused a connection from %s: %s", peer, reason)
        try:
            conn.close()
        except OSError:
            pass

    def refusals_note(self) -> str:
        """``"3 strangers refused, the last from 127.0.0.1:5555 (said nothing within 5 s)"``."""
        with self._lock:
            count, last = self.refused_count, (self.refused[-1] if self.refused else None)
        text = f"{count} stranger{'s' if count != 1 else ''} refused"
        if last is not None:
            text += f", the last from {last.peer} ({last.reason})"
        return text

    # -- one connection ------------------------------------------------------------------
    def _handshake(self, conn: socket.socket, peer: str) -> None:
        """Authenticate one connection (mutually), then hand it to its slot."""
        try:
            hello = self._authenticate(conn, peer)
            if hello is None:
                return
            slot, why = self.claim(hello, conn)
            try:
                conn.settimeout(self.handshake_seconds)
                conn.sendall(json.dumps({"ok": slot is not None, "why": why}).encode() + b"\n")
            except OSError:
                conn.close()
                return
            if slot is None:
                log.debug("spark listener: turned away a relay from %s: %s", peer, why)
                conn.close()
                return
            try:
                conn.settimeout(None)
                spark_task.keepalive(conn)
            except OSError:  # its slot's cluster closed it meanwhile (stopped as the relay dialled in)
                return
        finally:
            self._handshakes.release()
        if conn is slot.log_sock:
            threading.Thread(
                target=read_log, args=(slot, conn), name="tfmagic-spark-log", daemon=True
            ).start()

    def _authenticate(self, conn: socket.socket, peer: str) -> dict[str, Any] | None:
        """The relay's introduction, once both sides proved they hold the secret (``None``: refused)."""
        deadline = time.monotonic() + self.handshake_seconds
        try:
            conn.settimeout(self.handshake_seconds)
            nonce = secrets.token_bytes(32)
            conn.sendall(spark_task.GREETING + b" " + nonce.hex().encode() + b"\n")
            line = _read_line(conn, deadline, 200).decode("ascii", "replace")
            their_hex, _, proof = line.partition(" ")
            try:
                theirs = bytes.fromhex(their_hex)
            except ValueError:
                theirs = b""
            expected = spark_task.mac(self.secret, b"relay", nonce, theirs)
            if len(theirs) != 32 or not hmac.compare_digest(proof.encode(), expected.encode()):
                raise _Refused("it does not know the cluster's secret")
            conn.settimeout(max(0.1, deadline - time.monotonic()))
            conn.sendall(spark_task.mac(self.secret, b"driver", theirs, nonce).encode() + b"\n")
            hello = json.loads(_read_line(conn, deadline, 4096))
            if not isinstance(hello, dict):
                raise _Refused("its introduction is not a JSON object")
            return hello
        except _Refused as exc:
            self._refuse(conn, peer, str(exc))
        except (OSError, ValueError) as exc:
            self._refuse(conn, peer, f"handshake failed ({type(exc).__name__}: {exc})")
        return None


def read_log(slot: Slot, conn: socket.socket) -> None:
    """Frames from a relay: the child's pid, its stderr (into the log file), its exit code."""
    try:
        with open(slot.log_path, "ab") as out:
            while True:
                try:
                    got = spark_task.read_frame(conn)
                except OSError:
                    got = None
                if got is None:
                    break
                kind, body = got
                if kind == spark_task.LOG:
                    out.write(body)
                    out.flush()
                elif kind == spark_task.PID:
                    info = json.loads(body)
                    slot.pid = int(info["pid"])
                    slot.address = info.get("address")
                    slot.hostname = info.get("hostname") or slot.hostname
                    out.write(
                        f"tfmagic: spark: task process {slot.pid} started by a relay (pid "
                        f"{slot.relay_pid}, attempt {slot.attempt}) on {slot.hostname} ({slot.address})\n".encode()
                    )
                    out.flush()
                    slot.started.set()
                elif kind == spark_task.EXIT:
                    slot.exit_code = json.loads(body).get("code")
                elif kind == spark_task.ERROR:
                    slot.error = json.loads(body).get("message")
                    out.write(f"tfmagic: spark: {slot.error}\n".encode())
                    out.flush()
    finally:
        slot.done.set()
        slot.started.set()
