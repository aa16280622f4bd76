"""The network shaper's process: a TCP relay that gives a task a modelled link (stdlib only).

Why a relay: shaping real traffic (``tc``) needs root and a network
namespace; a classroom Binder has neither.  A task whose link is modelled
serves on a private port; its address in the cluster (the one every worker,
ps and the kernel dial) is this relay's, which passes every byte on at the
modelled rate and after the modelled delay.  Everything that reaches the task
crosses the model, as it would cross the task's network card.

The model, per shaped task (its "card"): one rate per direction shared by all
its connections (a full-duplex link: in and out do not compete), and a
one-way delay added to every chunk (a delay line: chunks queue, they are not
serialised behind each other's delay).  A rate of ``None`` passes bytes at
the machine's speed.

Protocol: JSON lines on stdin (``{"op": "route", "name", "listen", "target"}``,
``{"op": "shape", "name", "rate", "delay"}``, ``{"op": "stats"}``), JSON
lines on stdout (``listening``, ``stats``, ``error``).  It ends when stdin
closes (its owner went away) and, through PR_SET_PDEATHSIG, when its parent
dies.
"""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import json
import os
import signal
import sys
import threading
import time

CHUNK = 64 * 1024
#: A bucket may run ahead of its rate by this much (seconds of traffic): TCP's own
#: bursts pass, the mean rate holds.
BURST_S = 0.002


class Bucket:
    """A shared virtual clock: each chunk reserves its transmission time at ``rate`` bytes/s."""

    def __init__(self) -> None:
        self.rate: float | None = None
        self.free_at = 0.0
        self.bytes = 0

    async def take(self, n: int) -> None:
        self.bytes += n
        if not self.rate:
            return
        now = time.monotonic()
        self.free_at = max(self.free_at, now) + n / self.rate
        wait = self.free_at - now - BURST_S
        if wait > 0:
            await asyncio.sleep(wait)


class Route:
    """One shaped task: where its relay listens, where the task really serves, its model."""

    def __init__(self, name: str, target: tuple[str, int]) -> None:
        self.name = name
        self.target = target
        self.inbound = Bucket()  # to the task
        self.outbound = Bucket()  # from the task
        self.delay = 0.0
        self.server: asyncio.base_events.Server | None = None

    async def serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            up_r, up_w = await asyncio.open_connection(*self.target)
        except OSError:
            writer.close()
            return
        for w in (writer, up_w):
            sock = w.get_extra_info("socket")
            if sock is not None:
                with contextlib.suppress(OSError):
                    sock.setsockopt(6, 1, 1)  # TCP_NODELAY: the model adds the delay, not Nagle
        await asyncio.gather(self._pump(reader, up_w, self.inbound), self._pump(up_r, writer, self.outbound))

    async def _pump(self, src: asyncio.StreamReader, dst: asyncio.StreamWriter, bucket: Bucket) -> None:
        line: asyncio.Queue = asyncio.Queue()

        async def deliver() -> None:
            while True:
                item = await line.get()
                if item is None:
                    break
                due, data = item
                left = due - time.monotonic()
                if left > 0:
                    await asyncio.sleep(left)
                dst.write(data)
                await dst.drain()

        sender = asyncio.ensure_future(deliver())
        try:
            while True:
                data = await src.read(CHUNK)
                if not data:
                    break
                await bucket.take(len(data))
                await line.put((time.monotonic() + self.delay, data))
        except (ConnectionError, OSError):
            pass
        finally:
            await line.put(None)
            with contextlib.suppress(Exception):
                await sender
            with contextlib.suppress(Exception):
                dst.close()


def _say(**fields) -> None:
    sys.stdout.write(json.dumps(fields) + "\n")
    sys.stdout.flush()


async def _main() -> None:
    loop = asyncio.get_running_loop()
    routes: dict[str, Route] = {}
    ops: asyncio.Queue = asyncio.Queue()

    def read_stdin() -> None:
        for raw in sys.stdin:
            loop.call_soon_threadsafe(ops.put_nowait, raw)
        loop.call_soon_threadsafe(ops.put_nowait, None)

    threading.Thread(target=read_stdin, daemon=True).start()
    while True:
        raw = await ops.get()
        if raw is None:
            return  # the owner went away
        try:
            msg = json.loads(raw)
            op = msg.get("op")
            if op == "route":
                host, _, port = msg["target"].rpartition(":")
                route = Route(msg["name"], (host, int(port)))
                route.server = await asyncio.start_server(
                    route.serve, msg.get("host", "127.0.0.1"), int(msg["listen"])
                )
                routes[route.name] = route
                _say(event="listening", id=msg.get("id"), name=route.name, port=int(msg["listen"]))
            elif op == "shape":
                route = routes[msg["name"]]
                rate = msg.get("rate")
                route.inbound.rate = route.outbound.rate = float(rate) if rate else None
                route.delay = float(msg.get("delay") or 0.0)
                _say(event="shaped", id=msg.get("id"), name=route.name)
            elif op == "stats":
                _say(
                    event="stats",
                    id=msg.get("id"),
                    routes={
                        n: {
                            "in": r.inbound.bytes,
                            "out": r.outbound.bytes,
                            "rate": r.inbound.rate,
                            "delay": r.delay,
                        }
                        for n, r in routes.items()
                    },
                )
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
