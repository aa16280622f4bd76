"""A modelled network for the miniature cluster: a task's link at a chosen rate and delay, without root.

On one machine every link is loopback: gigabytes a second, microseconds.
The parameter-server bottleneck (d2l's chapter does the arithmetic on paper:
every worker reads all parameters from the ps and writes all gradients
back, so a ps's link bounds the step) cannot be seen there.  Here it can:
``LocalCluster(net="ps:0 rate=100mbit delay=2ms")`` / ``%tf_cluster start
--net "ps:* rate=100mbit"`` gives the named tasks a modelled network card, a
relay process (:mod:`tfmagic.shaper_main`) that every connection to them
crosses at that rate (each direction, shared by all connections) and after
that delay.

Which tasks are shaped is chosen when the cluster starts (their address in
the cluster is the relay's, and TensorFlow's servers cannot change address
under a connected client); their rate and delay change live
(``cluster.net("ps:0", rate="50mbit")``, ``%tf_cluster net ps:0 --rate
50mbit``), and ``rate=None`` lifts the limit.  A cluster started without
``net`` has no relay and pays nothing.

Limits, said plainly: the model shapes what reaches and leaves a task
(its card), not each link separately; the relay is a Python process, so it
passes at most a few hundred MB/s here (a rate above that is not kept, and
:meth:`Shaper.check` says so); the relay listens on loopback only.
"""

from __future__ import annotations

import json
import re
import sys
import threading
from dataclasses import dataclass

from .errors import BadNet

__all__ = ["BadNet", "LinkModel", "Shaper", "parse_net", "parse_rate"]

_RATE = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?)\s*(bit|kbit|mbit|gbit|bps|kbps|mbps|gbps)\s*$", re.I | re.A)
_DELAY = re.compile(r"^\s*([0-9]+(?:\.[0-9]*)?|\.[0-9]+)\s*(ms|s|us)?\s*$", re.I | re.A)
_UNITS = {
    "bit": 1 / 8,
    "kbit": 1e3 / 8,
    "mbit": 1e6 / 8,
    "gbit": 1e9 / 8,
    "bps": 1.0,
    "kbps": 1e3,
    "mbps": 1e6,
    "gbps": 1e9,
}
#: what the relay can pass on this kind of machine (measured: bench/ps_bottleneck.py); above it the model is not kept
RELAY_LIMIT_BYTES_S = 200e6


def parse_rate(text: str | float | None) -> float | None:
    """Bytes per second from tc's units: ``100mbit`` (megabits/s), ``5mbps`` (megabytes/s); None: no limit.

    >>> parse_rate("100mbit"), parse_rate("5mbps"), parse_rate(None)
    (12500000.0, 5000000.0, None)
    """
    if text is None or (isinstance(text, str) and text.strip().lower() in ("", "none", "off")):
        return None
    if isinstance(text, (int, float)):
        if text <= 0:
            raise BadNet(f"a rate must be > 0 bytes/s, not {text}")
        return float(text)
    m = _RATE.match(str(text))
    if not m or float(m.group(1)) <= 0:
        raise BadNet(
            f"{text!r} is not a rate; write it as tc does, e.g. 100mbit (megabits/s), 1gbit, or 5mbps (megabytes/s)"
        )
    return float(m.group(1)) * _UNITS[m.group(2).lower()]


def parse_delay(text: str | float | None) -> float:
    """Seconds of one-way delay.

    >>> parse_delay("2ms"), parse_delay("0ms"), parse_delay(None), parse_delay(0.5)
    (0.002, 0.0, 0.0, 0.5)
    """
    if text is None:
        return 0.0
    if isinstance(text, (int, float)):
        if text < 0:
            raise BadNet(f"a delay must be zero or more seconds, not {text}")
        return float(text)
    m = _DELAY.match(str(text))
    if not m:
        raise BadNet(f"{text!r} is not a delay; write it like 2ms or 0.5ms (zero or more)")
    return float(m.group(1)) * {"s": 1.0, "ms": 1e-3, "us": 1e-6}[(m.group(2) or "s").lower()]


@dataclass
class LinkModel:
    """A task's modelled card: ``rate`` bytes/s each way (None: unlimited), ``delay`` seconds one way."""

    rate: float | None = None
    delay: float = 0.0

    def describe(self) -> str:
        rate = "unlimited" if self.rate is None else f"{self.rate * 8 / 1e6:g} Mbit/s"
        return f"{rate}, {self.delay * 1e3:g} ms delay"


def parse_net(spec: str | dict | None) -> dict[str, LinkModel]:
    """``"ps:0 rate=100mbit delay=2ms; ps:1 rate=50mbit"`` (``ps:*`` for every ps) -> {task pattern: model}.

    >>> parse_net("ps:* rate=100mbit delay=2ms")
    {'ps:*': LinkModel(rate=12500000.0, delay=0.002)}
    """
    if not spec:
        return {}
    if isinstance(spec, dict):
        return {
            k: v
            if isinstance(v, LinkModel)
            else LinkModel(parse_rate(v.get("rate")), parse_delay(v.get("delay")))
            for k, v in spec.items()
        }
    out: dict[str, LinkModel] = {}
    for part in str(spec).split(";"):
        words = part.split()
        if not words:
            continue
        task, fields = words[0], {}
        for w in words[1:]:
            key, eq, value = w.partition("=")
            if not eq or key not in ("rate", "delay"):
                raise BadNet(f"{w!r}: write the model as rate=100mbit delay=2ms after the task")
            fields[key] = value
        if not re.match(r"^\w+:(\d+|\*)$", task):
            raise BadNet(f"{task!r} is not a task; write ps:0, worker:1 or ps:* before the model")
        out[task] = LinkModel(parse_rate(fields.get("rate")), parse_delay(fields.get("delay")))
    return out


class Shaper:
    """The relay process of one cluster and its routes (see the module docstring)."""

    def __init__(self) -> None:
        from .launchers.process import spawn

        self.proc = spawn(
            [sys.executable, "-m", "tfmagic.shaper_main"],
            stdin=-1,
            stdout=-1,
            stderr=None,
            env=_env(),
        )
        self.pid = self.proc.pid
        self.models: dict[str, LinkModel] = {}
        self._lock = threading.Lock()
        from . import owner

        owner.register(self)

    @property
    def alive(self) -> bool:
        return self.proc.poll() is None

    def _ask(self, **msg) -> dict:
        with self._lock:
            if not self.alive:
                raise BadNet(f"the network relay (pid {self.pid}) has ended; restart the cluster")
            self.proc.stdin.write((json.dumps(msg) + "\n").encode())
            self.proc.stdin.flush()
            line = self.proc.stdout.readline()
        reply = json.loads(line or b"{}")
        if reply.get("event") == "error" or not reply:
            raise BadNet(f"the network relay refused {msg.get('op')}: {reply.get('message', 'it ended')}")
        return reply

    def route(self, name: str, listen: int, target: str, model: LinkModel) -> None:
        """Relay ``listen`` (the task's address in the cluster) to ``target`` (where it serves)."""
        self._ask(op="route", name=name, listen=listen, target=target)
        self._ask(op="shape", name=name, rate=model.rate, delay=model.delay)
        self.models[name] = model

    def shape(self, name: str, model: LinkModel) -> None:
        """A new rate and delay for a routed task, live."""
        if name not in self.models:
            raise BadNet(f"{name} has no modelled link")
        self._ask(op="shape", name=name, rate=model.rate, delay=model.delay)
        self.models[name] = model

    def routes(self) -> dict:
        return self._ask(op="stats").get("routes", {})

    def kill(self) -> None:
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
        from . import owner

        owner.forget(self)


def _env() -> dict[str, str]:
    import os

    from .launchers.process import PACKAGE_PARENT

    env = dict(os.environ)
    env["PYTHONPATH"] = PACKAGE_PARENT + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    return env
