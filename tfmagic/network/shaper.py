"""A modelled network for the miniature cluster: a task's card and each link to it, at a chosen rate and delay, without root.

On one machine every link is loopback: gigabytes a second, microseconds.
The parameter-server bottleneck (d2l's chapter does the arithmetic on paper:
every worker reads all parameters from the ps and writes all gradients
back, so a ps's link bounds the step) cannot be seen there.  Here it can.

**Cards.** ``LocalCluster(net="ps:0 rate=100mbit delay=2ms")`` /
``%tf_cluster start --net "ps:* rate=100mbit"`` gives the named tasks a
modelled network card: a relay process (:mod:`tfmagic.network.relay`) that
every connection to them crosses at that rate (each direction, shared by all
connections) and after that delay.  A task named without a model
(``net="ps:*"``) gets a relay with no limit: it passes bytes as they come,
ready for limits set later; its cost is a Python process's copy of each chunk
(about 200 MB/s each way through it here, against 500 MB/s for loopback).

**Links.** A link is a source (a task, or ``kernel``: this process, the
cluster's client) to a relayed task: ``worker:0->ps:0`` (spaces around the
arrow are allowed, quoted: ``"worker:0 -> ps:0"``; ``worker:*->ps:0`` gives
each worker a link of its own at that rate).  ``net="worker:0->ps:0
rate=10mbit; ps:* rate=100mbit"`` at start, ``cluster.net("worker:0->ps:0",
rate="10mbit", delay="5ms")`` / ``%tf_cluster net worker:0->ps:0 --rate
10mbit`` live.  A link's rate holds each way (what the source sends to the
task, and what it receives from it), shared by all the source's connections
to that task; when the task's card is limited too, the bytes cross both (the
slower sets the pace, and the delays add).  A link rule at start gives its
task a relay (with no card limit unless one is named).

Which tasks have a relay is chosen when the cluster starts (their address in
the cluster is the relay's, and TensorFlow's servers cannot change address
under a connected client); rates and delays of cards and links change live,
also for connections already open, and ``rate=None`` (with no delay) lifts a
limit.  ``cluster.net()`` / ``%tf_cluster net`` lists every card and link
model with the bytes that crossed it.  A cluster started without ``net`` has
no relay and pays nothing.

How the relay knows a connection's source: every connection arrives on
loopback, so its address says nothing.  When the relay accepts one it asks
its owner (the :class:`Shaper` in the kernel) once, with the connection's
addresses; the Shaper finds the other end's socket in ``/proc/net/tcp``
(``tcp6``) and its owner among the cluster's task processes and the kernel
from their descriptors (``socket_inodes``, passed in by the cluster).  That
costs a few milliseconds per connection, none per byte.

Limits, said plainly: modelled are a relayed task's card and the links
into it, both directions; not modelled are links into tasks without a relay,
bytes between processes that bypass the cluster's addresses, loss, jitter
and a router's queue limits (the relay reads from a sender only as fast as
the model passes, so a sender waits on TCP's flow control, and nothing is
dropped).  A connection whose source
the Shaper cannot name (a process that is neither a task nor the kernel, or
no answer within the relay's 10 s) crosses the card only; while the answer is
awaited its bytes wait at most 0.5 s, then cross the card only until it comes
(see :mod:`tfmagic.network.relay`).  The relay is a Python process,
so it passes at most a few hundred MB/s here (:data:`RELAY_LIMIT_BYTES_S`; a
rate above that is not kept).

Where it listens: on loopback for tasks on this machine.  Tasks on other machines (Slurm's nodes,
Spark's executors) keep serving there, and their address in the cluster becomes a port of the
relay's on the address they reach this machine at (``Launcher.relay_host``); such a port admits
the cluster's hosts only (``peers``) and closes other connections unread.  Their connections' sources
are not in this machine's socket table: the tasks on the connection's host are asked for their own
sockets instead (``remote``, the ``sockets`` op), which takes a round trip to each.
"""

from __future__ import annotations

import itertools
import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable

from ..errors import BadNet
from .links import (  # noqa: F401 - the vocabulary, read as the relay's (netshape.LinkModel)
    CLOSED,
    KERNEL,
    RELAY_LIMIT_BYTES_S,
    LinkModel,
    NetModels,
    matches,
    parse_delay,
    parse_net,
    parse_rate,
    parse_target,
)
from .sockets import connection

__all__ = ["BadNet", "LinkModel", "NetModels", "Shaper", "parse_net", "parse_rate", "parse_target"]

_serials = itertools.count(1)


class _RelayEnded(Exception):
    """The relay process ended under a request (said as a :class:`BadNet` if it stays down)."""


#: how long a request to the relay may take before the relay is said not to answer
ASK_TIMEOUT_S = 10.0


class Shaper:
    """The relay process of one cluster, its routes and its models (see the module docstring).

    ``sources()`` gives pid -> name (each task's process, and this process as ``kernel``);
    ``owners(pids)`` gives socket inode -> pid for those pids (the cluster passes
    :func:`tfmagic.network.traffic.socket_inodes`).  Without them every connection crosses the card only.
    ``remote(peer)`` names the task on another machine that holds a connection from ``peer``.
    """

    def __init__(
        self,
        sources: Callable[[], dict[int, str]] | None = None,
        owners: Callable[[set[int]], dict[int, int]] | None = None,
        on_event: Callable[[str], None] | None = None,
        remote: Callable[[tuple[str, int]], str | None] | None = None,
    ) -> None:
        #: told, in a sentence, when the relay process ends on its own and what was done about it
        self.on_event = on_event
        self._restarts: list[float] = []
        #: when (time.monotonic()) the relay was last started again on its ports (None: never)
        self.restarted_at: float | None = None
        #: tells this Shaper's threads from another's (the pid changes when the relay restarts)
        self.serial = next(_serials)
        #: each relayed task: (the port the relay listens on, where the task serves)
        self.given_routes: dict[str, dict] = {}
        self._closing = False
        self._spawn()
        #: each relayed task's card
        self.models: dict[str, LinkModel] = {}
        #: each link rule: (source pattern, relayed task) -> model
        self.links: dict[tuple[str, str], LinkModel] = {}
        #: connections whose source was looked up, and the seconds that took in all (one thread each)
        self.lookups = 0
        self.lookup_s = 0.0
        self._sources = sources
        self._owners = owners
        self._remote = remote
        self._ask_lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._count_lock = threading.Lock()
        self._who_queue: queue.Queue = queue.Queue()
        self._who_started = False  # its WHO_THREADS threads start on the first lookup
        self._ids = itertools.count(1)
        from ..procs import owner

        owner.register(self)

    def _spawn(self) -> None:
        from ..launchers.process import spawn

        self.proc = spawn(
            [sys.executable, "-m", "tfmagic.network.relay"],
            stdin=-1,
            stdout=-1,
            stderr=None,
            env=_env(),
        )
        self.pid = self.proc.pid
        self._replies: queue.Queue = queue.Queue()
        proc = self.proc
        self._reader = threading.Thread(
            target=self._read, args=(proc, self._replies), name=f"tfmagic-shaper-{self.pid}", daemon=True
        )
        self._reader.start()

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def state(self) -> str:
        """``running``, ``stopped`` (SIGSTOP: it passes nothing) or ``ended (exit code N)``."""
        code = self.proc.poll()
        if code is not None:
            return f"ended (exit code {code})"
        try:
            with open(f"/proc/{self.pid}/stat") as f:
                run_state = f.read().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError):
            return "running"
        return "stopped" if run_state in ("T", "t") else "running"

    def restart(self) -> int:
        """A new relay process on the same ports with the same cards and links; returns its pid.

        The tasks keep running and keep their state: only the connections through the old relay
        are cut, and TensorFlow connects again through the new one.
        """
        with self._ask_lock:
            self._end_process()
            from ..procs import owner

            owner.forget(self)  # known by pid
            self._spawn()
            owner.register(self)
            self._closing = False
            self.restarted_at = time.monotonic()
        for name, route in self.given_routes.items():
            self._ask(op="route", name=name, **route)
            model = self.models[name]
            self._ask(op="shape", name=name, rate=model.rate, delay=model.delay)
        for (source, name), model in self.links.items():
            self._ask(op="link", name=name, source=source, rate=model.rate, delay=model.delay)
        return self.pid

    # -- talking to the relay ------------------------------------------------------
    def _write(self, msg: dict) -> None:
        with self._write_lock:
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()

    def _read(self, proc, replies: queue.Queue) -> None:
        """The relay's lines: answers to requests, and ``who`` asks, answered here."""
        try:
            for line in proc.stdout:
                try:
                    msg = json.loads(line)
                except ValueError:
                    continue
                if msg.get("event") == "who":  # looked up beside, so answers to requests never wait on it
                    self._who_asked(msg)
                else:
                    replies.put(msg)
        except (OSError, ValueError):
            pass
        replies.put(None)
        if proc is self.proc and not self._closing:
            try:
                code = proc.wait(5)
            except Exception:  # noqa: BLE001 - its output closed first; the code may come later
                code = proc.poll()
            self._ended(proc.pid, code)

    #: restarts of a relay that ended on its own, at most this many a minute (then it stays down)
    RESTARTS_PER_MINUTE = 3

    def _ended(self, pid: int, code: int | None) -> None:
        """The relay ended without kill() (killed by someone, crashed): start it again, same ports,
        same models; the tasks behind it lose nothing. A relay that keeps ending stays down."""
        now = time.monotonic()
        self._restarts = [t for t in self._restarts if now - t < 60]
        ended = f"the network relay (pid {pid}) ended (exit code {code})"
        if len(self._restarts) >= self.RESTARTS_PER_MINUTE:
            said = (
                f"{ended}, its {len(self._restarts) + 1}th end within a minute: it stays down, and "
                f"connections to {', '.join(self.models)} fail until cluster.restart_relay()"
            )
        else:
            self._restarts.append(now)
            try:
                new = self.restart()
                said = f"{ended}; restarted as pid {new} on the same ports, with the same cards and links"
            except Exception as exc:  # noqa: BLE001 - said, and the doctor names the relay
                said = f"{ended} and did not start again ({exc}); cluster.restart_relay() tries again"
        if self.on_event is not None:
            self.on_event(said)

    #: threads that look up who holds a connection's other end: a burst of connections (a stranger's
    #: 300 cost 141 threads) waits in a queue instead
    WHO_THREADS = 2

    def _who_asked(self, msg: dict) -> None:
        with self._count_lock:
            if not self._who_started:
                self._who_started = True
                for _ in range(self.WHO_THREADS):
                    threading.Thread(
                        target=self._who_worker, name=f"tfmagic-shaper-who-{self.serial}", daemon=True
                    ).start()
        self._who_queue.put(msg)

    def _who_worker(self) -> None:
        while (msg := self._who_queue.get()) is not None:  # None: the relay was killed for good
            self._answer_who(msg)

    def _answer_who(self, msg: dict) -> None:
        try:
            source = self.source_of(tuple(msg["peer"]), tuple(msg["local"]))
        except Exception:  # noqa: BLE001 - a lookup that fails leaves the connection on the card only
            source = None
        try:
            self._write({"op": "source", "id": msg.get("id"), "source": source})
        except (OSError, ValueError):
            pass

    def source_of(self, peer: tuple[str, int], local: tuple[str, int]) -> str | None:
        """Who holds the other end of the relay's connection ``local`` <- ``peer``: a task, ``kernel``,
        :data:`CLOSED` (no process holds it any more: a port probe that connected and left), or None
        (a process that is neither a task nor the kernel)."""
        if self._sources is None or self._owners is None:
            return None
        t0 = time.perf_counter()
        try:
            if peer[0] != local[0] and not _is_loopback(peer[0]):
                # another machine's: its sockets are not in this machine's table; its tasks say
                return self._remote((peer[0], int(peer[1]))) if self._remote is not None else None
            found = connection((peer[0], int(peer[1])), (local[0], int(local[1])))
            if not found or not found[0]:  # no row, or a row no process holds (TIME_WAIT, FIN_WAIT: inode 0)
                return CLOSED
            inode, uid = found
            if uid != os.getuid():  # another user's: none of ours, known without reading descriptors
                return None
            sources = self._sources()
            pid = self._owners(set(sources)).get(inode)
            return sources.get(pid) if pid is not None else None
        finally:
            with self._count_lock:
                self.lookups += 1
                self.lookup_s += time.perf_counter() - t0

    #: how long a request waits for a relay that ended on its own to be started again
    RESTART_WAIT_S = 10.0

    def _ask(self, **msg) -> dict:
        """Send one request and return its answer; a relay that ended on its own is waited for
        while its reader thread starts it again (:meth:`_ended`), and the request sent once more:
        a card changed just after a kill was refused ("has ended") a moment before the relay was
        back."""
        reader = self._reader  # the reader of the relay this request goes to
        try:
            reply = self._ask_once(dict(msg))
        except _RelayEnded as ended:
            if self._closing or reader is threading.current_thread():  # restart() re-sending routes
                raise BadNet(str(ended)) from None
            # (its process may not be reaped yet, so `alive` may still say yes: its reader knows)
            reader.join(self.RESTART_WAIT_S)
            try:
                reply = self._ask_once(dict(msg))
            except _RelayEnded as again:
                raise BadNet(str(again)) from None
        if reply.get("event") == "error":
            raise BadNet(f"the network relay refused {msg['op']}: {reply.get('message')}")
        return reply

    def _ask_once(self, msg: dict) -> dict:
        with self._ask_lock:
            if not self.alive:
                raise _RelayEnded(
                    f"the network relay (pid {self.pid}) has ended; cluster.restart_relay() starts it"
                )
            if self.state() == "stopped":  # it would not answer: say so now, not after ASK_TIMEOUT_S
                raise BadNet(
                    f"the network relay (pid {self.pid}) is stopped (SIGSTOP) and passes nothing; "
                    f"continue it (kill -CONT {self.pid}) or cluster.restart_relay()"
                )
            msg["id"] = ask = next(self._ids)
            try:
                self._write(msg)
            except (OSError, ValueError):
                raise _RelayEnded(
                    f"the network relay (pid {self.pid}) has ended; cluster.restart_relay() starts it"
                ) from None
            deadline = time.monotonic() + ASK_TIMEOUT_S
            while True:
                try:
                    reply = self._replies.get(timeout=max(0.0, deadline - time.monotonic()))
                except queue.Empty:
                    raise BadNet(
                        f"the network relay (pid {self.pid}) did not answer {msg['op']} within {ASK_TIMEOUT_S:g} s"
                    ) from None
                if reply is None:
                    self._replies.put(None)  # every later request sees the end too
                    raise _RelayEnded(f"the network relay refused {msg['op']}: it ended")
                if reply.get("id") == ask:
                    return reply  # (a late answer to a request that timed out is dropped)

    # -- routes and models -----------------------------------------------------------
    def route(
        self,
        name: str,
        listen: int,
        target: str,
        model: LinkModel,
        host: str = "127.0.0.1",
        peers: list[str] | None = None,
    ) -> None:
        """Relay ``host:listen`` (the task's address in the cluster) to ``target`` (where it serves).

        ``peers``: the only addresses a connection may come from (a relay on an address other
        machines reach admits the cluster's hosts and closes the rest at once); None: any, as on
        loopback, where the bind library's owner check in the task stands behind the relay."""
        route = {"listen": listen, "target": target, "host": host, "peers": peers}
        self._ask(op="route", name=name, **route)
        self.given_routes[name] = route
        self._ask(op="shape", name=name, rate=model.rate, delay=model.delay)
        self.models[name] = model

    def shape(self, name: str, model: LinkModel) -> None:
        """A new rate and delay for a relayed task's card, live."""
        if name not in self.models:
            raise BadNet(f"{name} has no modelled link")
        self._ask(op="shape", name=name, rate=model.rate, delay=model.delay)
        self.models[name] = model

    def link(self, source: str, name: str, model: LinkModel) -> None:
        """A rule for the link from ``source`` (a task, ``job:*`` or ``kernel``) to the relayed task ``name``, live.

        A lifted model (no rate, no delay) removes the rule.
        """
        if name not in self.models:
            raise BadNet(f"{name} has no relay")
        self._ask(op="link", name=name, source=source, rate=model.rate, delay=model.delay)
        if model.lifted:
            self.links.pop((source, name), None)
        else:
            self.links[(source, name)] = model

    def routes(self) -> dict:
        """What the relay counted: per relayed task its card's bytes, rules, links (per source seen), connections."""
        return self._ask(op="stats").get("routes", {})

    def report(self) -> NetModels:
        """Every card and link rule with the bytes that crossed it."""
        stats = self.routes()
        rows = []
        for name, model in self.models.items():
            st = stats.get(name, {})
            rows.append(_row("card", None, name, model, st.get("in", 0), st.get("out", 0)))
            for (source, dst), rule in self.links.items():
                if dst == name:
                    crossed = [s for s in st.get("links", {}).values() if s.get("rule") == source]
                    to_task, from_task = sum(s["in"] for s in crossed), sum(s["out"] for s in crossed)
                    rows.append(_row("link", source, dst, rule, to_task, from_task))
        return NetModels(rows)

    def kill(self) -> None:
        with self._count_lock:
            if self._who_started:
                for _ in range(self.WHO_THREADS):
                    self._who_queue.put(None)
        self._end_process()
        from ..procs import owner

        owner.forget(self)

    def _end_process(self) -> None:
        """SIGKILL the relay process (said on purpose: its reader does not restart it) and close its pipes."""
        self._closing = True
        if self.alive:
            try:
                self.proc.kill()
            except OSError:
                pass
        try:
            self.proc.wait(5)
        except Exception:  # noqa: BLE001 - it was SIGKILLed; the keeper reaps what remains
            pass
        for stream in (self.proc.stdin, self.proc.stdout):
            try:
                stream.close()
            except OSError:
                pass


def _row(kind: str, src: str | None, dst: str, model: LinkModel, to_task: int, from_task: int) -> dict:
    return dict(
        kind=kind, src=src, dst=dst, rate=model.rate, delay=model.delay, to_task=to_task, from_task=from_task
    )


def _is_loopback(host: str) -> bool:
    from .clientserver import is_loopback

    return is_loopback(host)


def _env() -> dict[str, str]:
    import os

    from ..launchers.process import pythonpath_with_package

    env = dict(os.environ)
    env["PYTHONPATH"] = pythonpath_with_package(env.get("PYTHONPATH"))
    return env
