"""The network shaper's process: a TCP relay that gives a task a modelled card and links (stdlib only).

Why a relay: shaping real traffic (``tc``) needs root and a network
namespace; a classroom Binder has neither.  A task whose network is modelled
serves on a private port; its address in the cluster (the one every worker,
ps and the kernel dial) is this relay's, which passes every byte on at the
modelled rate and after the modelled delay.  Everything that reaches the task
crosses the model, as it would cross the task's network card.

The model, per relayed task:

* its **card**: one rate per direction shared by all its connections (a
  full-duplex link: in and out do not compete), and a one-way delay;
* its **links**, one per source (a task, or the kernel): a rule for the
  source (``worker:0``, or ``worker:*`` for each worker) gives that source's
  connections a rate per direction of their own, shared by all connections
  from that source to this task, and a delay of their own.  A byte on a
  link crosses the link's bucket and the card's (it is sent when both have
  room: the slower one sets the pace), and waits both delays.

Delays are a delay line: chunks queue, they are not serialised behind each
other's delay.  A rate of ``None`` passes bytes at the machine's speed.

Which source a connection comes from is asked once, when it is accepted: the
relay tells its owner the connection's two addresses (``who``); the answer
(``source``: a task's name, ``kernel``, ``closed`` when the other end has
already gone, as a port probe's does, or null for a process the owner does
not know) usually comes within milliseconds, and the connection's bytes wait
for it up to :data:`WHO_WAIT_S` (a busy owner then delays no connection for
longer: the bytes cross the card only until the answer comes, and for good
if none comes within :data:`WHO_TIMEOUT_S`).  A connection whose source is
unknown crosses the card only.  Rules change live, also for connections
already open (a gRPC channel lives as long as its client).

Protocol: JSON lines on stdin (``{"op": "route", "name", "listen",
"target"}``, ``{"op": "shape", "name", "rate", "delay"}`` for the card,
``{"op": "link", "name", "source", "rate", "delay"}`` for a link rule (no
rate and no delay removes it), ``{"op": "source", "id", "source"}`` answering
``who``, ``{"op": "stats"}``), JSON lines on stdout (``listening``,
``shaped``, ``linked``, ``who``, ``stats``, ``error``).  It ends when stdin
closes (its owner went away) and, through PR_SET_PDEATHSIG, when its parent
dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import itertools
import json
import os
import signal
import sys
import threading
import time

CHUNK = 64 * 1024
#: Chunks a connection's line holds each way before the relay stops reading its sender (TCP's flow
#: control then holds the sender back): 2 MB, a 200 MB/s card's bytes in flight over 10 ms. Without
#: a bound, a sender faster than its receiver grew the relay by what it sent (800 MB: 863 MB).
LINE_CHUNKS = 32
#: A bucket may run ahead of its rate by this much (seconds of traffic): TCP's own
#: bursts pass, the mean rate holds.
BURST_S = 0.002
#: How long a new connection's bytes wait for its source to be named; after that they cross
#: the card only until the answer comes (from then on the link applies too) ...
WHO_WAIT_S = 0.5
#: ... or until this has passed without one: the card only, for good.
WHO_TIMEOUT_S = 10.0


class Bucket:
    """A shared virtual clock: each chunk reserves its transmission time at ``rate`` bytes/s."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self.free_at = 0.0
        self.bytes = 0
        #: bumped by every change of rate; a chunk waiting on the old rate reserves again
        self.generation = 0

    def set_rate(self, rate: float | None) -> None:
        """A new rate applies to the bytes already waiting too: the debt built at the old rate
        (seconds of it at 1 kbit) is dropped, and the waiting chunks reserve again."""
        if rate == self.rate:
            return
        self.rate = rate
        self.free_at = 0.0
        self.generation += 1

    def reserve(self, n: int, now: float) -> float:
        """The time ``n`` bytes have passed (``now`` without a rate)."""
        if not self.rate:
            return now
        self.free_at = max(self.free_at, now) + n / self.rate
        return self.free_at


#: how often a waiting chunk looks whether its rate or delay changed
RECHECK_S = 0.05


async def cross(n: int, *buckets: Bucket) -> None:
    """Pass ``n`` bytes through every bucket at once: they go when the slowest has room."""
    for b in buckets:
        b.bytes += n
    while True:
        now = time.monotonic()
        generations = [b.generation for b in buckets]
        until = max(b.reserve(n, now) for b in buckets)
        while (left := until - time.monotonic() - BURST_S) > 0:
            await asyncio.sleep(min(left, RECHECK_S))
            if [b.generation for b in buckets] != generations:
                break
        else:
            return


class Model:
    """A rate each way and a one-way delay: a task's card, or one source's link to it."""

    def __init__(self) -> None:
        self.inbound = Bucket()  # to the task
        self.outbound = Bucket()  # from the task
        self.delay = 0.0

    def set(self, rate: float | None, delay: float) -> None:
        for bucket in (self.inbound, self.outbound):
            bucket.set_rate(float(rate) if rate else None)
        self.delay = float(delay or 0.0)

    def stats(self) -> dict:
        return {
            "in": self.inbound.bytes,
            "out": self.outbound.bytes,
            "rate": self.inbound.rate,
            "delay": self.delay,
        }


class Connection:
    """One accepted connection: its source (None until the owner has named it) and that source's link."""

    __slots__ = ("source", "link")

    def __init__(self) -> None:
        self.source: str | None = None
        self.link: Model | None = None


class Route:
    """One relayed task: where its relay listens, where the task really serves, its card and links."""

    def __init__(self, name: str, target: tuple[str, int], who, peers=None) -> None:
        self.name = name
        self.target = target
        #: the only addresses a connection may come from (None: any); the rest are closed unread
        self.peers = set(peers) if peers is not None else None
        self.card = Model()
        self.rules: dict[str, tuple[float | None, float]] = {}  # source pattern -> (rate, delay)
        self.links: dict[str, Model] = {}  # each source seen so far -> its link
        #: source ("unknown", "closed") -> connections accepted; "refused": closed unread (``peers``)
        self.connections: dict[str, int] = {}
        self.server: asyncio.base_events.Server | None = None
        self._who = who

    def rule_for(self, source: str) -> tuple[str, tuple[float | None, float]] | None:
        """The rule that applies to ``source``: its own, else its job's (``worker:*``)."""
        for pattern in (source, source.partition(":")[0] + ":*"):
            if pattern in self.rules:
                return pattern, self.rules[pattern]
        return None

    def _apply_rule(self, source: str, link: Model) -> None:
        """Set ``link`` to the rule that applies to ``source`` now (none: no limit, no delay)."""
        found = self.rule_for(source)
        link.set(*(found[1] if found else (None, 0.0)))

    def link_of(self, source: str) -> Model:
        link = self.links.get(source)
        if link is None:
            link = self.links[source] = Model()
            self._apply_rule(source, link)
        return link

    def set_rule(self, pattern: str, rate: float | None, delay: float) -> None:
        if not rate and not delay:
            self.rules.pop(pattern, None)
        else:
            self.rules[pattern] = (rate, delay)
        for source, link in self.links.items():
            self._apply_rule(source, link)

    def _named(self, conn: Connection, answer: asyncio.Future) -> None:
        """The owner named the connection's source (or could not): its link applies from now on."""
        if answer.cancelled():
            return
        source = answer.result() if answer.exception() is None else None
        conn.source = source if isinstance(source, str) and source else "unknown"
        self.connections[conn.source] = self.connections.get(conn.source, 0) + 1
        conn.link = self.link_of(conn.source) if conn.source not in ("unknown", "closed") else None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        peer = writer.get_extra_info("peername")
        if self.peers is not None and (not peer or peer[0] not in self.peers):
            self.connections["refused"] = self.connections.get("refused", 0) + 1
            writer.transport.abort()  # a stranger: nothing read, nothing passed on
            return
        conn = Connection()
        who = asyncio.ensure_future(
            self._who(self.name, writer.get_extra_info("peername"), writer.get_extra_info("sockname"))
        )
        who.add_done_callback(lambda done: self._named(conn, done))
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            who.cancel()
            writer.close()
            return
        with contextlib.suppress(asyncio.TimeoutError):
            await asyncio.wait_for(asyncio.shield(who), WHO_WAIT_S)
        for w in (writer, up_w):
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(6, 1, 1)  # TCP_NODELAY: the model adds the delay, not Nagle
        await asyncio.gather(
            self._pump(reader, up_w, "inbound", conn), self._pump(up_r, writer, "outbound", conn)
        )
        for w in (writer, up_w):
            with contextlib.suppress(Exception):
                w.close()

    async def _pump(
        self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, way: str, conn: Connection
    ) -> None:
        line: asyncio.Queue = asyncio.Queue(maxsize=LINE_CHUNKS)
        card = getattr(self.card, way)

        def delay() -> float:  # read when delivering: a new delay applies to bytes already queued
            link = conn.link
            return self.card.delay + (link.delay if link is not None else 0.0)

        async def deliver() -> None:
            while True:
                item = await line.get()
                if item is None:
                    break
                sent, data = item
                while (left := sent + delay() - time.monotonic()) > 0:
                    await asyncio.sleep(min(left, RECHECK_S))
                dst.write(data)
                await dst.drain()

        sender = asyncio.ensure_future(deliver())

        async def queue(item) -> None:
            """Into the line, waiting while it is full; the receiver's side failing ends the wait."""
            put = asyncio.ensure_future(line.put(item))
            await asyncio.wait({put, sender}, return_when=asyncio.FIRST_COMPLETED)
            if not put.done():
                put.cancel()
                raise ConnectionError("the receiving side ended")

        ended = False  # the source half-closed: pass that on once the line has delivered
        try:
            while True:
                data = await src.read(CHUNK)
                if not data:
                    ended = True
                    break
                link = conn.link
                if link is None:
                    await cross(len(data), card)
                else:
                    await cross(len(data), card, getattr(link, way))
                await queue((time.monotonic(), data))
        except (ConnectionError, OSError):
            pass
        finally:
            with contextlib.suppress(Exception):
                await queue(None)
            with contextlib.suppress(Exception):
                await sender
            with contextlib.suppress(Exception):
                if ended and dst.can_write_eof():
                    dst.write_eof()
                else:
                    dst.close()

    def stats(self) -> dict:
        return {
            **self.card.stats(),
            "rules": {p: {"rate": r, "delay": d} for p, (r, d) in self.rules.items()},
            "links": {
                s: {**m.stats(), "rule": (self.rule_for(s) or (None,))[0]} for s, m in self.links.items()
            },
            "connections": dict(self.connections),
        }


def _say(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def _main() -> None:
    loop = asyncio.get_running_loop()
    routes: dict[str, Route] = {}
    ops: asyncio.Queue = asyncio.Queue()
    asked: dict[str, asyncio.Future] = {}
    ids = itertools.count(1)

    async def who(name: str, peer, local) -> str | None:
        """Ask the owner which process holds the other end of this connection (once per connection)."""
        ask = f"w{next(ids)}"
        answer = asked[ask] = loop.create_future()
        _say(event="who", id=ask, name=name, peer=list(peer[:2]), local=list(local[:2]))
        try:
            return await asyncio.wait_for(answer, WHO_TIMEOUT_S)
        except asyncio.TimeoutError:
            return None
        finally:
            asked.pop(ask, None)

    def read_stdin() -> None:
        for raw in sys.stdin:
            loop.call_soon_threadsafe(ops.put_nowait, raw)
        loop.call_soon_threadsafe(ops.put_nowait, None)

    threading.Thread(target=read_stdin, daemon=True).start()
    while True:
        raw = await ops.get()
        if raw is None:
            return  # the owner went away
        msg = None
        try:
            msg = json.loads(raw)
            op = msg.get("op")
            if op == "source":
                answer = asked.get(msg.get("id"))
                if answer is not None and not answer.done():
                    answer.set_result(msg.get("source"))
            elif op == "route":
                host, _, port = msg["target"].rpartition(":")
                route = Route(msg["name"], (host, int(port)), who, msg.get("peers"))
                route.server = await asyncio.start_server(
                    route.serve, msg.get("host", "127.0.0.1"), int(msg["listen"])
                )
                routes[route.name] = route
                _say(event="listening", id=msg.get("id"), name=route.name, port=int(msg["listen"]))
            elif op == "shape":
                route = routes[msg["name"]]
                route.card.set(msg.get("rate"), msg.get("delay"))
                _say(event="shaped", id=msg.get("id"), name=route.name)
            elif op == "link":
                route = routes[msg["name"]]
                route.set_rule(str(msg["source"]), msg.get("rate"), float(msg.get("delay") or 0.0))
                _say(event="linked", id=msg.get("id"), name=route.name, source=msg["source"])
            elif op == "stats":
                _say(event="stats", id=msg.get("id"), routes={n: r.stats() for n, r in routes.items()})
            else:
                raise ValueError(f"unknown op {op!r}")
        except Exception as exc:  # noqa: BLE001 - the owner gets the reason, the relay goes on
            _say(
                event="error",
                id=(msg.get("id") if isinstance(msg, dict) else None),
                message=f"{type(exc).__name__}: {exc}",
            )


def main() -> None:
    with contextlib.suppress(Exception):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG
    if os.getppid() == 1:
        return
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    asyncio.run(_main())


if __name__ == "__main__":
    main()
