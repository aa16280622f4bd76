"""A cluster's modelled network: which tasks sit behind the relay, and changing cards and links live.

The model itself (cards, links, the relay process) is :mod:`tfmagic.network.shaper`;
this is what one cluster does with it: the cards and link rules chosen at
start (``net=``), the private ports its relayed tasks serve on, routing them
through the relay at start, and :meth:`ClusterNetwork.net` and
:meth:`ClusterNetwork.restart_relay` while it runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable

from ..launchers.base import Launcher, TaskHandle
from ..network import clientserver, ports, traffic
from ..network import shaper as netshape
from ..spec import ClusterDef, ClusterShape, TaskName
from .taskset import Emit, TaskSet


class ClusterNetwork:
    """The modelled network of one cluster (empty when it was started without ``net=``)."""

    def __init__(
        self,
        net: str | dict | None,
        shape: ClusterShape,
        launcher: Launcher,
        taskset: TaskSet,
        emit: Emit,
        check_task: Callable[[str | TaskName], TaskName],
        tasks: Callable[[str | None], list[TaskName]],
    ) -> None:
        #: cards (``ps:0``), which give their task a relay, and link rules (``worker:0->ps:0``), which
        #: give a relay to theirs (see :mod:`tfmagic.network.shaper`)
        self.models: dict[str, netshape.LinkModel] = netshape.parse_net(net)
        for key in self.models:
            for pattern in netshape.parse_target(key):
                if pattern is None or pattern == netshape.KERNEL:
                    continue
                job, _, index = pattern.partition(":")
                count = {"ps": shape.ps, "worker": shape.workers, "chief": shape.chief}.get(job, 0)
                if count == 0 or (index != "*" and int(index) >= count):
                    raise netshape.BadNet(
                        f"--net names {pattern}, which this cluster will not have "
                        f"({shape.ps} ps, {shape.workers} workers)"
                    )
        if self.models and launcher.relay_host() is None:
            raise netshape.BadNet(
                "a modelled network (--net) needs a relay on this machine that the tasks reach directly, "
                f"and {launcher.name} tasks reach it through tunnels or not at all; use a local, Slurm or "
                "Spark cluster"
            )
        self.launcher = launcher
        self.shaper: netshape.Shaper | None = None
        #: the private port each relayed task's server binds (its cluster address is the relay's)
        self.bind_ports: dict[TaskName, int] = {}
        self._taskset = taskset
        self._emit = emit
        self._check_task = check_task
        self._running_tasks = tasks
        self._starting: dict[TaskName, TaskHandle] = {}

    def shaped(self, task: TaskName) -> netshape.LinkModel | None:
        """The card of a task that gets a relay: named as a card, or as the destination of a link rule."""
        card = self.models.get(str(task)) or self.models.get(f"{task.job}:*")
        if card is not None:
            return card
        for key in self.models:
            src, dst = netshape.parse_target(key)
            if src is not None and netshape.matches(dst, str(task)):
                return netshape.LinkModel()
        return None

    def route(self, tasks: list[TaskName], procs: dict[TaskName, TaskHandle], defn: ClusterDef) -> ClusterDef:
        """Relayed tasks serve on a private port; their cluster address is the relay's. Returns
        ``defn`` with those addresses: the same on this machine, where the relay takes the task's
        port; a task on another machine (Slurm's nodes, Spark's executors) keeps its port there to
        serve on, and its address becomes a port of the relay's here, on the address the tasks
        reach this machine at (:meth:`~tfmagic.launchers.base.Launcher.relay_host`)."""
        shaped = [t for t in tasks if self.shaped(t) is not None]
        if not shaped:
            return defn
        here = self.launcher.relay_host() or "127.0.0.1"  # None refused at __init__
        remote = [t for t in shaped if not clientserver.is_loopback(procs[t].host)]
        rules = [key for key in self.models if netshape.parse_target(key)[0] not in (None, netshape.KERNEL)]
        if rules and getattr(self.launcher, "processes", None) is not None:
            # the relay tells a connection's source task by its process
            raise netshape.BadNet(
                f"the link rule {rules[0]!r} names its source task by the task's process, and with "
                'processes= tasks share processes; give the tasks cards instead ("ps:* rate=20mbit") '
                "or start one process per task"
            )
        self._starting = procs
        if self.shaper is None or not self.shaper.alive:
            self.shaper = netshape.Shaper(
                sources=self.sources,
                owners=traffic.socket_inodes,
                on_event=lambda said: self._emit("relay", None, said),
                remote=self.remote_source,
            )
        jobs = defn.as_dict()
        # who may connect to a relay port on an address other machines reach: the cluster's hosts
        peers = (
            sorted(
                clientserver.peers_of([defn.address(t) for t in defn.tasks()])
                | clientserver.host_addresses(here)
            )
            if remote
            else None
        )
        for t in shaped:
            port = defn.address(t).rsplit(":", 1)[1]
            if t in remote:
                self.bind_ports[t] = int(port)  # free on its machine: picked there
                listen = ports.free_port(here)
                jobs[t.job][t.index] = f"{here}:{listen}"
            else:
                bind = self.launcher.pick_port(procs[t])
                while str(bind) == port:
                    bind = self.launcher.pick_port(procs[t])
                self.bind_ports[t] = bind
                listen = int(port)
            self.shaper.route(
                str(t),
                listen,
                f"{procs[t].host}:{self.bind_ports[t]}",
                self.shaped(t),
                host=here if t in remote else "127.0.0.1",
                peers=peers if t in remote else None,
            )
        for key, model in self.models.items():
            src, dst = netshape.parse_target(key)
            if src is not None:
                for t in shaped:
                    if netshape.matches(dst, str(t)) and str(t) != src:
                        self.shaper.link(src, str(t), model)
        return ClusterDef.from_mapping(jobs)

    def remote_source(self, peer: tuple[str, int]) -> str | None:
        """Which task on another machine holds the connection that comes from ``peer``: each task on
        that host is asked for its own sockets (the ``sockets`` op: its host's table, not this
        one's); None when none of them holds it."""
        from ..protocol import Op

        for task, proc in list((self._taskset.procs or self._starting).items()):
            if peer[0] not in clientserver.host_addresses(proc.host) or not getattr(proc, "alive", False):
                continue
            try:
                reply = proc.request(Op.SOCKETS, timeout=3)
            except Exception:  # noqa: BLE001 - a task that cannot answer now: the card only
                continue
            # each socket as (pid, local, peer, sent, received); addresses as parse_ss writes them (plain)
            if any(tuple(s[1]) == tuple(peer) for s in reply.get("sockets") or []):
                return str(task)
        return None

    def sources(self) -> dict[int, str]:
        """pid -> name of every process a connection to a relay can come from (the relay's Shaper asks)."""
        found = {os.getpid(): netshape.KERNEL}
        sharing: dict[int, list[str]] = {}
        for task, proc in list((self._taskset.procs or self._starting).items()):
            pid = getattr(proc, "task_pid", None) or proc.pid
            if pid is not None:
                sharing.setdefault(pid, []).append(str(task))
        for pid, names in sharing.items():
            # tasks sharing a process (processes=) are one source: named by the first, with the count
            found[pid] = names[0] if len(names) == 1 else f"{names[0]} (+{len(names) - 1} in its process)"
        return found

    def stop(self) -> None:
        """End the relay (the cluster stops, or its start failed)."""
        if self.shaper is not None:
            self.shaper.kill()
            self.shaper = None
        self.bind_ports = {}

    def _tasks(self, pattern: str) -> list[TaskName]:
        """The running cluster's tasks a card or link names (``ps:0``, ``worker:*``)."""
        if pattern.endswith(":*"):
            job = pattern[:-2]
            found = self._running_tasks(job)
            if not found:
                self._check_task(f"{job}:0")  # says which tasks the cluster has
            return found
        return [self._check_task(pattern)]

    def net(
        self,
        target: str | TaskName | None = None,
        rate: str | float | None = None,
        delay: str | float | None = None,
    ):
        """See :meth:`tfmagic.cluster.Cluster.net`."""
        if target is None:
            self._taskset.require()
            if rate is not None or delay is not None:
                raise netshape.BadNet(
                    "name the card or link to change: net('ps:0', rate=...) or net('worker:0->ps:0', rate=...)"
                )
            return self.shaper.report() if self.shaper is not None else netshape.NetModels([])
        if "->" not in str(target):  # a card: any form of a task's name (ps:0, /job:ps/task:0)
            t = self._check_task(target)
            model = netshape.LinkModel(netshape.parse_rate(rate), netshape.parse_delay(delay))
            if self.shaper is None or str(t) not in self.shaper.models:
                shaped = ", ".join(self.shaper.models) if self.shaper else "none"
                raise netshape.BadNet(
                    f"{t} has no modelled network (shaped here: {shaped}); which tasks are shaped is chosen "
                    f'at start: %tf_cluster start ... --net "{t} rate=100mbit delay=2ms"'
                )
            self.shaper.shape(str(t), model)
            self._emit("net", t, model.describe())
            return model
        src, dst = netshape.parse_target(str(target))
        if src != netshape.KERNEL:
            self._tasks(src)
        tasks = [t for t in self._tasks(dst) if str(t) != src]
        model = netshape.LinkModel(netshape.parse_rate(rate), netshape.parse_delay(delay))
        unrelayed = [str(t) for t in tasks if self.shaper is None or str(t) not in self.shaper.models]
        if unrelayed:
            shaped = ", ".join(self.shaper.models) if self.shaper else "none"
            raise netshape.BadNet(
                f"{', '.join(unrelayed)} {'has' if len(unrelayed) == 1 else 'have'} no relay, so links into "
                f"{'it' if len(unrelayed) == 1 else 'them'} cannot be shaped (relays here: {shaped}); "
                f'which tasks have one is chosen at start: %tf_cluster start ... --net "{dst}" (a relay, no limit)'
            )
        for t in tasks:
            self.shaper.link(src, str(t), model)
            self._emit(
                "net", t, f"{src}->{t}: {model.describe() if not model.lifted else 'no rule (the card only)'}"
            )
        return model

    def restart_relay(self) -> int:
        """See :meth:`tfmagic.cluster.Cluster.restart_relay`."""
        if self.shaper is None:
            raise netshape.BadNet(
                "this cluster has no network relay (a modelled network is chosen at start: net=)"
            )
        old = self.shaper.pid
        pid = self.shaper.restart()
        self._emit("relay", None, f"the network relay (pid {old}) restarted as pid {pid}")
        return pid

    def note(self) -> str | None:
        """The status line of the relay, or None without one."""
        if self.shaper is None:
            return None
        return (
            f"network relay of {', '.join(self.shaper.models)}: pid {self.shaper.pid}, {self.shaper.state()}"
        )


__all__ = ["ClusterNetwork"]
