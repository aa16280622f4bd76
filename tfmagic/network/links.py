"""The modelled network's vocabulary: rates, delays, cards and links, and what crossed each.

A :class:`LinkModel` is a rate (each way) and a one-way delay; a card is a
task's model (``ps:0``), a link a source's model into a task
(``worker:0->ps:0``, ``kernel->ps:0``).  This module parses them (one line
for what is wrong) and reports them; the relay that keeps them is
:mod:`tfmagic.network.shaper`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from ..errors import BadNet
from ..units import parse_delay, parse_rate

__all__ = [
    "CLOSED",
    "KERNEL",
    "RELAY_LIMIT_BYTES_S",
    "BadNet",
    "LinkModel",
    "NetModels",
    "matches",
    "parse_delay",
    "parse_net",
    "parse_rate",
    "parse_target",
]

#: what the relay can pass each way on this kind of machine (measured with plain sockets through a relay
#: with no limit, 64 MB each way: 170-210 MB/s, against 500-550 MB/s for loopback); above it the model is not kept
RELAY_LIMIT_BYTES_S = 200e6


@dataclass
class LinkModel:
    """A modelled card or link: ``rate`` bytes/s each way (None: unlimited), ``delay`` seconds one way."""

    rate: float | None = None
    delay: float = 0.0

    def describe(self) -> str:
        rate = "unlimited" if self.rate is None else f"{self.rate * 8 / 1e6:g} Mbit/s"
        return f"{rate}, {self.delay * 1e3:g} ms delay"

    @property
    def lifted(self) -> bool:
        """No limit and no delay: as if there were no model."""
        return self.rate is None and not self.delay


#: the source name of this process (the cluster's client) in a link: ``kernel->ps:0``
KERNEL = "kernel"
#: what the relay counts a connection under when its other end was closed before it was named
CLOSED = "closed"
_TASK = re.compile(r"^\w+:(\d+|\*)$", re.A)
_ARROW = re.compile(r"\s*->\s*")


def parse_target(text: str) -> tuple[str | None, str]:
    """``"ps:0"`` -> (None, ``"ps:0"``): a card; ``"worker:0 -> ps:0"`` -> (``"worker:0"``, ``"ps:0"``): a link.

    Names are checked for their form here (``job:N``, ``job:*``, ``kernel`` as a source);
    whether the cluster has them is the cluster's to say.

    >>> parse_target("ps:*"), parse_target(" worker:0 -> ps:0 "), parse_target("kernel->ps:1")
    ((None, 'ps:*'), ('worker:0', 'ps:0'), ('kernel', 'ps:1'))
    """
    text = _ARROW.sub("->", str(text).strip())
    src, arrow, dst = text.partition("->")
    if not arrow:
        src, dst = None, text
    if not _TASK.match(dst):
        what = "a task" if dst != KERNEL else "a task with a relay (the kernel has none)"
        raise BadNet(
            f"{dst!r} is not {what}; write ps:0, worker:1 or ps:* (a card), or worker:0->ps:0 (a link)"
        )
    if src is not None:
        if not (_TASK.match(src) or src == KERNEL):
            raise BadNet(f"{src!r} is not a source; write a task (worker:0, worker:*) or kernel before ->")
        if src == dst and not dst.endswith(":*"):  # (worker:*->worker:* is each worker to each other one)
            raise BadNet(
                f"{src}->{dst} is a link to itself; a link joins two tasks (or the kernel and a task)"
            )
    return src, dst


def parse_net(spec: str | dict | None) -> dict[str, LinkModel]:
    """``"ps:0 rate=100mbit delay=2ms; worker:0->ps:0 rate=10mbit"`` -> {card or link: model}.

    A card is a task (``ps:*`` for every ps); a link is ``SOURCE->TASK`` (see the module
    docstring); entries are separated by ``;``.  A task with no model (``"ps:*"``) gets a relay
    with no limit.

    >>> parse_net("ps:* rate=100mbit delay=2ms")
    {'ps:*': LinkModel(rate=12500000.0, delay=0.002)}
    >>> parse_net("worker:0 -> ps:0 rate=10mbit; ps:*")
    {'worker:0->ps:0': LinkModel(rate=1250000.0, delay=0.0), 'ps:*': LinkModel(rate=None, delay=0.0)}
    """
    if not spec:
        return {}
    if isinstance(spec, dict):
        out = {}
        for k, v in spec.items():
            src, dst = parse_target(k)
            key = dst if src is None else f"{src}->{dst}"
            out[key] = (
                v
                if isinstance(v, LinkModel)
                else LinkModel(parse_rate(v.get("rate")), parse_delay(v.get("delay")))
            )
        return out
    out: dict[str, LinkModel] = {}
    for part in str(spec).split(";"):
        words = _ARROW.sub("->", part).split()
        if not words:
            continue
        fields = {}
        for w in words[1:]:
            key, eq, value = w.partition("=")
            if not eq or key not in ("rate", "delay"):
                raise BadNet(f"{w!r}: write the model as rate=100mbit delay=2ms after the task or link")
            fields[key] = value
        src, dst = parse_target(words[0])
        key = dst if src is None else f"{src}->{dst}"
        if key in out:
            raise BadNet(f"{key} is given twice; give each card or link once, with all its fields")
        out[key] = LinkModel(parse_rate(fields.get("rate")), parse_delay(fields.get("delay")))
    return out


def matches(pattern: str, name: str) -> bool:
    """``ps:*`` matches every ps, ``ps:0`` itself only.

    >>> matches("ps:*", "ps:1"), matches("ps:0", "ps:1"), matches("kernel", "kernel")
    (True, False, True)
    """
    job, _, index = pattern.partition(":")
    return pattern == name or (index == "*" and name.partition(":")[0] == job)


@dataclass
class NetModels:
    """Every modelled card and link of a cluster: ``rows`` (kind, src, dst, rate, delay, to_task, from_task).

    ``kind`` is ``card`` (``src`` None) or ``link``; ``rate`` bytes/s each way (None: unlimited),
    ``delay`` seconds; ``to_task`` / ``from_task`` the bytes that crossed it each way since the cluster
    started (for a link rule: on every link it covers, also before the rule was set).
    """

    rows: list[dict]

    def __iter__(self):
        return iter(self.rows)

    def __len__(self) -> int:
        return len(self.rows)

    def model(self, target: str) -> LinkModel | None:
        """The model of a card (``"ps:0"``) or link rule (``"worker:0->ps:0"``), or None."""
        src, dst = parse_target(target)
        for r in self.rows:
            if r["src"] == src and r["dst"] == dst:
                return LinkModel(r["rate"], r["delay"])
        return None

    def __str__(self) -> str:
        if not self.rows:
            return (
                "no modelled network: this cluster started without --net; "
                'start with --net "ps:*" (a relay, no limit) to shape cards and links live'
            )
        from ..units import human_bytes

        lines = [f"{'card / link':22s} {'model':28s} {'to task':>9s} {'from task':>9s}"]
        for r in self.rows:
            name = r["dst"] if r["src"] is None else f"{r['src']}->{r['dst']}"
            lines.append(
                f"{name:22s} {LinkModel(r['rate'], r['delay']).describe():28s} "
                f"{human_bytes(r['to_task']):>9s} {human_bytes(r['from_task']):>9s}"
            )
        return "\n".join(lines)

    def _repr_pretty_(self, p, cycle) -> None:
        p.text(str(self))
