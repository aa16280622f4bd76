"""A cluster: a spec plus the task processes that serve it.

``Cluster`` owns the lifecycle (start, stop, restart, status, logs) and is
the plain-Python API; where the processes run is the launcher's business
(:mod:`tfmagic.launchers`).  ``LocalCluster`` is the cluster whose tasks run
on this machine; ``SSHCluster`` and ``SparkCluster`` make the same cluster
with another launcher, as dask's ``SSHCluster`` does::

    import tfmagic
    with tfmagic.LocalCluster(ps=1, workers=2) as cluster:
        cluster.connect()
        with cluster.device("ps:0"):
            w = tf.Variable(0.0)          # lives on the ps
        with cluster.device("worker:1"):
            y = w + 1.0                   # computed on worker 1

Start outcomes are data (:class:`StartOutcome` and its closed set of
kinds), failures are :class:`~tfmagic.errors.ClusterStartError` carrying the
task and the tail of its log; the session and the magics turn both into
messages in one place.  What happens to the cluster is published on
``cluster.events`` (see :mod:`tfmagic.events`): a training run, a
``%%tf_px`` cell and a dashboard follow it, and end when the cluster stops.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import ClassVar

from . import client, doctor, elastic, netshape, owner, placement, traffic, waits
from .errors import BadArgument, BadClusterShape, ClusterStartError, NeedsForce, NoCluster, TaskLost
from .events import Event, Topic
from .launchers.base import Launcher, TaskHandle, TaskState
from .launchers.local import LocalLauncher
from .pace import Pace
from .pool import SparePool, default_pool
from .spec import ClusterDef, ClusterShape, TaskName
from .status import ClusterStatus, TaskStatus

#: ``progress(task, stage, detail)`` is called as tasks come up.
Progress = Callable[[str, str, str], None]

_ids = itertools.count(1)

#: Memory one task costs before any was measured (PSS of a task here: about 0.18 GB).
TASK_BYTES = 200 * 2**20


# -- what a start did: a closed set, turned into messages in one place ----------------------
@dataclass
class StartOutcome:
    """What a start did.  Exactly one of the subclasses below; ``kind`` names it."""

    kind: ClassVar[str] = "started"
    seconds: float = 0.0
    warm: int = 0
    cold: int = 0
    attempts: int = 1
    notes: list[str] = field(default_factory=list)


@dataclass
class Launched(StartOutcome):
    """Every task was started (``warm`` of them from spare processes)."""

    kind: ClassVar[str] = "launched"


@dataclass
class Reused(StartOutcome):
    """The cluster asked for was already running: nothing was started."""

    kind: ClassVar[str] = "reused"
    age_s: float = 0.0


@dataclass
class Replaced(Launched):
    """Another cluster was running; it was stopped and this one started."""

    kind: ClassVar[str] = "replaced"
    replaced: str = ""


@dataclass
class Restarted(StartOutcome):
    """One task was started again on its old address."""

    kind: ClassVar[str] = "restarted"


@dataclass
class Attached(StartOutcome):
    """A cluster tfmagic did not start answers; nothing was started."""

    kind: ClassVar[str] = "attached"


class _PortTaken(Exception):
    """A task's port was taken between picking it and binding it."""

    def __init__(self, task: TaskName, port: int | None) -> None:
        super().__init__(f"{task}: port {port} was taken")
        self.task, self.port = task, port


def _threads_for(tasks_on_host: int) -> dict[str, int]:
    cores = os.cpu_count() or 1
    share = max(1, cores // max(1, tasks_on_host))
    return {"intra": share, "inter": max(2, share)}


def _same_host(listening: str, bind_host: str) -> bool:
    return listening in (bind_host, f"::ffff:{bind_host}")


class Cluster:
    """Tasks of a TensorFlow cluster run as supervised processes by a launcher.

    Parameters
    ----------
    ps, workers, chief:
        How many tasks each job has.  ``ps=0`` makes a worker-only cluster
        (for all-reduce); at least one worker is needed.
    launcher:
        Where tasks run; a :class:`~tfmagic.launchers.LocalLauncher` by default.
    worker_gpus:
        ``CUDA_VISIBLE_DEVICES`` for the workers: one string for all, or one per
        worker (``["0", "1"]``).  ps tasks always run on the CPU only, as the
        seeds recommend (``CUDA_VISIBLE_DEVICES=""``).
    env:
        Extra environment for every task (set when the task takes its role).
    spares:
        Take warm spare processes from the pool and refill it after the
        start (see :mod:`tfmagic.pool`).  ``False`` spawns every task fresh.
    start_timeout:
        Seconds a start may take before it gives up and cleans up.
    pace:
        Make the training engine's worker steps take a modelled machine's time
        (``"40ms"``, or a :class:`~tfmagic.pace.Pace` with jitter and
        hiccups): a cluster in miniature that behaves like separate machines
        however many processes share the cores.  ``slow`` then changes a
        worker's modelled speed.
    """

    def __init__(
        self,
        ps: int = 1,
        workers: int = 2,
        *,
        chief: int = 0,
        name: str | None = None,
        launcher: Launcher | None = None,
        worker_gpus: str | Sequence[str] | Mapping[int, str] | None = None,
        env: Mapping[str, str] | None = None,
        spares: bool = True,
        pool: SparePool | None = None,
        start_timeout: float = 120.0,
        log_dir: str | os.PathLike | None = None,
        collective: bool = False,
        pace: str | float | Pace | None = None,
        net: str | dict | None = None,
    ) -> None:
        self.shape = ClusterShape(ps=ps, workers=workers, chief=chief)
        #: the modelled network chosen at start (see :mod:`tfmagic.netshape`): cards (``ps:0``), which
        #: give their task a relay, and link rules (``worker:0->ps:0``), which give a relay to theirs
        self.net_models: dict[str, netshape.LinkModel] = netshape.parse_net(net)
        for key in self.net_models:
            for pattern in netshape.parse_target(key):
                if pattern is None or pattern == netshape.KERNEL:
                    continue
                job, _, index = pattern.partition(":")
                count = {"ps": ps, "worker": workers, "chief": chief}.get(job, 0)
                if count == 0 or (index != "*" and int(index) >= count):
                    raise netshape.BadNet(
                        f"--net names {pattern}, which this cluster will not have ({ps} ps, {workers} workers)"
                    )
        self.shaper: netshape.Shaper | None = None
        self._net_procs: dict[TaskName, TaskHandle] = {}
        self._bind_ports: dict[TaskName, int] = {}
        if collective and ps:
            raise BadClusterShape(
                "collective mode (MultiWorkerMirroredStrategy, all-reduce) has no parameter servers; use ps=0"
            )
        if not (isinstance(start_timeout, (int, float)) and 0 < start_timeout < float("inf")):
            raise BadClusterShape(f"start_timeout must be a number of seconds > 0, not {start_timeout!r}")
        self.collective = collective
        #: the modelled machines of a paced cluster (see :mod:`tfmagic.pace`), or None: real speed
        self.pace: Pace | None = Pace.parse(pace)
        self.id = next(_ids)
        self.name = name or f"c{self.id}"
        self.launcher = launcher or LocalLauncher()
        self.env = dict(env or {})
        self.worker_gpus = self._gpu_map(worker_gpus, workers)
        self.use_spares = (
            spares and self.launcher.makes_spares and os.environ.get("TFMAGIC_SPARES", "1") != "0"
        )
        self.pool = pool or default_pool()
        self.start_timeout = float(start_timeout)
        self._log_dir = Path(log_dir) if log_dir else None
        self.procs: dict[TaskName, TaskHandle] = {}
        self.cluster_def: ClusterDef | None = None
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self._lock = threading.RLock()
        #: one membership change at a time: an add and a remove at once lost a task (issue 22, item 6)
        self._membership = threading.Lock()
        self._killed_on_purpose: set[int] = set()
        self.last_outcome: StartOutcome | None = None
        self.slowness: dict[TaskName, float] = {}
        #: what happened to the cluster: iterate for the past, subscribe for what comes
        self.events: Topic[Event] = Topic(f"cluster {self.name}", keep=10_000)
        self._meter: traffic.TrafficMeter | None = None
        #: the name of the cluster that replaced this one (the hang doctor says so to a stale handle)
        self.replaced_by: str | None = None

    # -- configuration ---------------------------------------------------
    @staticmethod
    def _gpu_map(worker_gpus, workers: int) -> dict[int, str]:
        if worker_gpus is None:
            return {}
        if isinstance(worker_gpus, str):
            return {i: worker_gpus for i in range(workers)}
        if isinstance(worker_gpus, Mapping):
            return {int(k): str(v) for k, v in worker_gpus.items()}
        gpus = [str(g) for g in worker_gpus]
        if len(gpus) != workers:
            raise BadClusterShape(
                f"worker_gpus has {len(gpus)} entries for {workers} workers; give one per worker"
            )
        return dict(enumerate(gpus))

    def task_env(self, task: TaskName) -> dict[str, str]:
        """The environment a task gets on top of the launcher's."""
        env = dict(self.env)
        if task.job == "ps":
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif task.job == "worker" and task.index in self.worker_gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.worker_gpus[task.index]
        return env

    @property
    def log_dir(self) -> Path:
        if self._log_dir is None:
            self._log_dir = owner.runtime_dir() / self.name
        self._log_dir.mkdir(parents=True, exist_ok=True)
        return self._log_dir

    def describe(self) -> str:
        """``1 ps, 2 workers`` and where they run (``over ssh on a,b``, ``on Spark local[3]``), and its pace."""
        paced = f", {self.pace.describe()}" if self.pace is not None else ""
        return f"{self.shape.describe()}{self.launcher.describe()}{paced}"

    # -- lifecycle -------------------------------------------------------
    @property
    def running(self) -> bool:
        return bool(self.procs) and self.cluster_def is not None

    def start(self, progress: Progress | None = None, timeout: float | None = None) -> StartOutcome:
        """Start every task and return when each one accepts connections.

        On failure or timeout the tasks started so far are stopped and a
        :class:`ClusterStartError` names the task and shows its log's tail.
        A cluster that already runs is left alone (:class:`Reused`).
        """
        with self._lock:
            if self.running:
                return Reused(age_s=time.time() - (self.started_at or time.time()))
            say = progress or (lambda task, stage, detail: None)
            timeout = self.start_timeout if timeout is None else timeout
            deadline = time.monotonic() + timeout
            t0 = time.monotonic()
            self._check_memory()
            taken: _PortTaken | None = None
            for attempt in range(1, 4):
                try:
                    warm, cold = self._start_once(say, deadline)
                except _PortTaken as exc:
                    taken = exc
                    say(str(exc), "retry", "a port was taken while starting; trying fresh ports")
                    continue
                outcome = Launched(seconds=time.monotonic() - t0, warm=warm, cold=cold, attempts=attempt)
                self.started_at = time.time()
                self.stopped_at = None
                self.last_outcome = outcome
                self.emit("start", None, self.describe())
                if self.use_spares:
                    self.pool.fill_later(self.launcher, self.shape.size)
                return outcome
            from .procstats import listener_of

            holder = listener_of(taken.port) if taken is not None and taken.port else None
            raise ClusterStartError(
                f"{taken.task if taken else 'a task'} could not bind its port in three attempts: each "
                f"port picked for it was taken before its server could bind it (the last, {taken.port if taken else '?'}, "
                f"{'by ' + holder if holder else 'by a process this one cannot see'}). Something on this machine "
                "takes ports fast: stop it, or try again",
                task=str(taken.task) if taken else None,
            )

    def _check_memory(self) -> None:
        """Say before starting anything when the tasks will not fit (local tasks only)."""
        if not isinstance(self.launcher, LocalLauncher):
            return
        from .memory import check_fits

        warm = self.pool.count(self.launcher) if self.use_spares else 0
        cold = max(0, self.shape.size - warm)
        if cold:
            check_fits(cold, self.pool.spare_cost() if self.use_spares else TASK_BYTES)

    def _start_once(self, say: Progress, deadline: float) -> tuple[int, int]:
        tasks = self.shape.tasks()
        hosts = self.launcher.hosts_for(len(tasks))
        taken = self.pool.take(self.launcher, len(tasks)) if self.use_spares else []
        warm = sum(1 for p in taken if p.warm_at is not None)
        procs: dict[TaskName, TaskHandle] = {}
        wake = threading.Event()
        subscriptions = []
        wait_note = None  # the hang doctor's note of this start
        try:
            fresh = []
            for task in tasks:
                if taken:
                    proc = taken.pop(0)
                    say(task, "spare", f"warm process {proc.pid}")
                    procs[task] = proc
                else:
                    fresh.append(task)
            if fresh:
                spawned = self.launcher.spawn_many(
                    [str(self.log_dir / f"{t.slug}.log") for t in fresh],
                    [hosts[tasks.index(t)] for t in fresh],
                )
                for task, proc in zip(fresh, spawned, strict=True):
                    where = f" on {proc.destination}" if proc.destination else ""
                    say(task, "spawned", f"new process {proc.pid}{where}, importing TensorFlow")
                    procs[task] = proc
            subscriptions = [p.messages.subscribe(lambda msg: wake.set()) for p in procs.values()]
            defn = self._choose_addresses(tasks, procs)
            cluster = defn.as_dict()
            self._route_shaped(tasks, procs, defn)
            self.launcher.prepare(cluster, procs)
            assigned: set[TaskName] = set()
            up: set[TaskName] = set()
            wait_note = waits.begin(
                f"the start of cluster {self.name}", tasks, "its servers to come up", self.id
            )
            while len(up) < len(tasks):
                waits.update(wait_note, [t for t in tasks if t not in up])
                wake.clear()
                for task, proc in procs.items():
                    if task not in assigned and proc.state is TaskState.SPARE:
                        proc.assign(
                            task,
                            cluster,
                            env=self.task_env(task),
                            log=self.launcher.task_log(str(self.log_dir / f"{task.slug}.log")),
                            cpu_only=task.job == "ps",
                            threads=_threads_for(len(tasks)),
                            collective=self.collective,
                            bind_port=self._bind_ports.get(task),
                        )
                        assigned.add(task)
                        say(task, "starting", f"server on {defn.address(task)}")
                    elif proc.state is TaskState.FAILED:
                        if "Could not start gRPC server" in (proc.failure or ""):
                            raise _PortTaken(task, proc.port)
                        raise self._failure(task, proc, f"could not start its server: {proc.failure}")
                    elif not proc.alive:
                        why = f": {proc.failure}" if proc.failure else ""
                        raise self._failure(
                            task, proc, f"its process ended (exit code {proc.exit_code}){why}"
                        )
                    elif proc.state is TaskState.RUNNING and task not in up:
                        self._check_serving(task, proc, defn.address(task))
                        up.add(task)
                        say(task, "up", f"{defn.address(task)} (pid {proc.pid})")
                if len(up) == len(tasks):
                    break
                if time.monotonic() > deadline:
                    waiting = [t for t in tasks if t not in up]
                    first = waiting[0]
                    raise self._failure(
                        first,
                        procs[first],
                        f"was not up in time (still {procs[first].state}); waiting for {', '.join(waiting)}",
                        timed_out=True,
                    )
                wake.wait(0.1)
        except BaseException:
            for proc in procs.values():
                proc.kill()
            if self.shaper is not None:
                self.shaper.kill()
                self.shaper = None
            self.launcher.close()
            raise
        finally:
            for sub in subscriptions:
                sub.close()
            if wait_note is not None:
                waits.end(wait_note)
        self.procs = procs
        self.cluster_def = defn
        self.slowness = {}
        for task, proc in procs.items():
            self._watch(task, proc)
        return warm, len(tasks) - warm

    def shaped(self, task: TaskName) -> netshape.LinkModel | None:
        """The card of a task that gets a relay: named as a card, or as the destination of a link rule."""
        card = self.net_models.get(str(task)) or self.net_models.get(f"{task.job}:*")
        if card is not None:
            return card
        for key in self.net_models:
            src, dst = netshape.parse_target(key)
            if src is not None and netshape.matches(dst, str(task)):
                return netshape.LinkModel()
        return None

    def _route_shaped(self, tasks: list[TaskName], procs: dict[TaskName, TaskHandle], defn) -> None:
        """Relayed tasks serve on a private port; their cluster address is the relay's."""
        shaped = [t for t in tasks if self.shaped(t) is not None]
        if not shaped:
            return
        if not self.launcher.makes_spares:  # only local launchers make spares; the relay is local too
            raise netshape.BadNet("a modelled network (--net) works on local clusters only")
        self._net_procs = procs
        if self.shaper is None or not self.shaper.alive:
            self.shaper = netshape.Shaper(
                sources=self._net_sources,
                owners=traffic.socket_inodes,
                on_event=lambda said: self.emit("relay", None, said),
            )
        for t in shaped:
            port = defn.address(t).rsplit(":", 1)[1]
            bind = self.launcher.pick_port(procs[t])
            while str(bind) == port:
                bind = self.launcher.pick_port(procs[t])
            self._bind_ports[t] = bind
            self.shaper.route(str(t), int(port), f"{procs[t].host}:{bind}", self.shaped(t))
        for key, model in self.net_models.items():
            src, dst = netshape.parse_target(key)
            if src is not None:
                for t in shaped:
                    if netshape.matches(dst, str(t)) and str(t) != src:
                        self.shaper.link(src, str(t), model)

    def _net_sources(self) -> dict[int, str]:
        """pid -> name of every process a connection to a relay can come from (the relay's Shaper asks)."""
        found = {os.getpid(): netshape.KERNEL}
        for task, proc in list((self.procs or self._net_procs).items()):
            pid = getattr(proc, "task_pid", None) or proc.pid
            if pid is not None:
                found[pid] = str(task)
        return found

    def _net_tasks(self, pattern: str) -> list[TaskName]:
        """The running cluster's tasks a card or link names (``ps:0``, ``worker:*``)."""
        if pattern.endswith(":*"):
            job = pattern[:-2]
            found = self.tasks(job)
            if not found:
                self.check_task(f"{job}:0")  # says which tasks the cluster has
            return found
        return [self.check_task(pattern)]

    def net(
        self,
        target: str | TaskName | None = None,
        rate: str | float | None = None,
        delay: str | float | None = None,
    ):
        """Change a modelled card or link live; with no arguments, every card and link model.

        ``target`` is a relayed task (``"ps:0"``: its card) or a link (``"worker:0->ps:0"``,
        ``"worker:*->ps:0"``, ``"kernel->ps:0"``): ``rate`` each way (``"50mbit"``, None: unlimited) and
        one-way ``delay``; a link with neither loses its rule.  Which tasks have a relay is chosen at
        start (``net=``); see :mod:`tfmagic.netshape`.  Returns the model set, or with no target the
        :class:`~tfmagic.netshape.NetModels` (cards and links, with the bytes that crossed each).
        """
        if target is None:
            self._need_running()
            if rate is not None or delay is not None:
                raise netshape.BadNet(
                    "name the card or link to change: net('ps:0', rate=...) or net('worker:0->ps:0', rate=...)"
                )
            return self.shaper.report() if self.shaper is not None else netshape.NetModels([])
        if "->" not in str(target):  # a card: any form of a task's name (ps:0, /job:ps/task:0)
            t = self.check_task(target)
            model = netshape.LinkModel(netshape.parse_rate(rate), netshape.parse_delay(delay))
            if self.shaper is None or str(t) not in self.shaper.models:
                shaped = ", ".join(self.shaper.models) if self.shaper else "none"
                raise netshape.BadNet(
                    f"{t} has no modelled network (shaped here: {shaped}); which tasks are shaped is chosen "
                    f'at start: %tf_cluster start ... --net "{t} rate=100mbit delay=2ms"'
                )
            self.shaper.shape(str(t), model)
            self.emit("net", t, model.describe())
            return model
        src, dst = netshape.parse_target(str(target))
        if src != netshape.KERNEL:
            self._net_tasks(src)
        tasks = [t for t in self._net_tasks(dst) if str(t) != src]
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
            self.emit(
                "net", t, f"{src}->{t}: {model.describe() if not model.lifted else 'no rule (the card only)'}"
            )
        return model

    def _choose_addresses(self, tasks: list[TaskName], procs: dict[TaskName, TaskHandle]) -> ClusterDef:
        ports: dict[str, set[int]] = {}
        jobs: dict[str, list[str]] = {}
        for task in tasks:
            proc = procs[task]
            used = ports.setdefault(proc.host, set())
            port = None
            while port is None or port in used:
                try:
                    port = self.launcher.pick_port(proc)
                except (ProcessLookupError, TimeoutError) as exc:
                    if not getattr(proc, "join", lambda t: True)(5):  # its exit code, for the message
                        raise self._failure(task, proc, f"did not answer when asked for a free port ({exc})")
                    raise self._failure(
                        task, proc, f"its process ended before it could start (exit code {proc.exit_code})"
                    )
            used.add(port)
            jobs.setdefault(task.job, []).append(f"{proc.host}:{port}")
        return ClusterDef.from_mapping(jobs)

    def _watch(self, task: TaskName, proc: TaskHandle) -> None:
        def on_message(msg: dict) -> None:
            if (
                msg.get("event") == "exit"
                and proc.pid not in self._killed_on_purpose
                and self.procs.get(task) is proc
            ):
                self.emit("lost", task, f"process {proc.pid} ended (exit code {msg.get('code')})")

        proc.messages.subscribe(on_message)

    def emit(self, kind: str, task: TaskName | str | None, detail: str = "", **more) -> Event:
        """Record an event and tell every follower (dashboards, training runs, cells)."""
        event = Event.now(kind, task, detail, **more)
        self.events.publish(event)
        return event

    def _check_serving(self, task: TaskName, proc: TaskHandle, address: str) -> None:
        """The task accepts connections at its address, and listens nowhere it should not.

        A task given a bind guard (loopback, or its spec address) reports
        where it must listen (``bind_host``); every socket it listens on must
        be there.  A planted or broken preload library would otherwise leave a
        server on every interface while ``start`` said otherwise.
        """
        from .net import port_answers

        if not port_answers(address, timeout=5):
            raise self._failure(task, proc, f"said it was up but {address} refused a connection")
        bind_host = getattr(proc, "bind_host", None)
        if not bind_host:
            return
        try:
            listening = self.launcher.listening(proc)
        except (TimeoutError, ProcessLookupError) as exc:
            raise self._failure(task, proc, f"did not say where it listens ({exc})")
        wrong = [f"{h}:{p}" for h, p in listening if not _same_host(h, bind_host)]
        if wrong:
            raise self._failure(
                task,
                proc,
                f"listens on {', '.join(wrong)}, though its servers were to listen on {bind_host} only "
                "(the bind library did not take effect: a stale or planted library in the cache? see "
                "tfmagic.loopback.cache_dir()); start again, or pass --all-interfaces to accept every interface",
            )

    def _failure(
        self, task: TaskName, proc: TaskHandle, what: str, timed_out: bool = False
    ) -> ClusterStartError:
        tail = proc.log_tail(15)
        msg = f"{task} (pid {proc.task_pid}) {what}. The tasks started so far were stopped."
        hint = self.launcher.diagnose(proc, tail)
        if hint:
            msg += f" To fix: {hint}."
        if timed_out:
            msg += f" Allow more time with start_timeout= (now {self.start_timeout:g} s)."
        msg += f" Its log: {proc.log_path}"
        return ClusterStartError(msg, task=task, log_tail=tail)

    def stop(self, reason: str = "the cluster was stopped") -> None:
        """Stop every task of this cluster (spares stay warm for the next start).

        Everything that runs on it (training runs, ``%%tf_px`` cells,
        dashboards) is told first (a ``stopping`` event) and ends with
        ``reason`` as its final state.
        """
        with self._lock:
            if not self.procs:
                raise NoCluster(f"cluster {self.name} is not running; nothing to stop")
            self.emit("stopping", None, reason)
            procs, self.procs = self.procs, {}
            self.cluster_def = None
            if self._meter is not None:
                self._meter.stop()
                self._meter = None
            if self.shaper is not None:
                self.shaper.kill()
                self.shaper = None
                self._bind_ports = {}
            self.stopped_at = time.time()
            client.forget(self.id)
            self._killed_on_purpose.update(p.pid for p in procs.values() if p.pid is not None)
        for proc in procs.values():
            proc.kill()
        self.launcher.close()
        self.emit("stop", None, f"{len(procs)} tasks stopped ({reason})")

    def close(self) -> None:
        """Stop if running; never raises for a cluster that is already stopped."""
        with contextlib.suppress(NoCluster):
            self.stop()

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- addresses and TensorFlow objects --------------------------------
    def _need_running(self) -> ClusterDef:
        if self.cluster_def is None:
            raise NoCluster(
                f"cluster {self.name} is not running; start it first (cluster.start() or %tf_cluster start)"
            )
        return self.cluster_def

    @property
    def spec(self):
        """The ``tf.train.ClusterSpec`` of the running cluster."""
        return self._need_running().to_tf()

    def address(self, task: str | TaskName) -> str:
        """``host:port`` of a task, e.g. ``cluster.address("worker:1")``."""
        return self._need_running().address(task)

    def target(self, task: str | TaskName) -> str:
        """The ``grpc://`` target a TF1 ``Session`` connects to."""
        return "grpc://" + self.address(task)

    def tf_config(self, task: str | TaskName) -> dict:
        return self._need_running().tf_config(task)

    def resolver(self):
        """A ``SimpleClusterResolver`` for ``tf.distribute.ParameterServerStrategy``."""
        return client.resolver(self._need_running())

    def connect(self, force: bool = False) -> Cluster:
        """Make this process a client of the cluster (remote devices usable)."""
        defn = self._need_running()
        client.connect(self.id, defn, force=force, client_address=self.launcher.client_address(defn))
        return self

    def check_task(self, task: str | TaskName) -> TaskName:
        return self._need_running().check(task)

    def tasks(self, job: str | None = None) -> list[TaskName]:
        """The running cluster's tasks (of ``job``), in order."""
        return [t for t in self._need_running().tasks() if job is None or t.job == job]

    @contextlib.contextmanager
    def device(self, task: str | TaskName) -> Iterator[str]:
        """Place the TensorFlow ops created inside on ``task``; connects first."""
        t = self.check_task(task)
        proc = self.procs.get(t)
        if proc is not None and not proc.alive:
            raise TaskLost(
                f"{t} (pid {proc.pid}) is not running (exit code {proc.exit_code}); "
                f"restart it: cluster.restart('{t}')"
            )
        state = self.condition(t)
        if state.startswith(("stopped", "not answering")):
            raise TaskLost(
                f"{t} is {state}: ops placed on it would wait until it is continued. Continue it "
                f"(kill -CONT {proc.task_pid}) or replace it: cluster.restart('{t}', force=True)"
            )
        self.connect(force=client.is_connected(self.id) and t in client.omitted())
        if t in client.omitted():
            raise TaskLost(
                f"{t} does not answer ({self.condition(t)}); ops cannot be placed on it now. "
                f"cluster.why() says why; cluster.restart('{t}', force=True) replaces it"
            )
        import tensorflow as tf

        made_by = placement.creator(self.id, f"cell on {t}", proc.task_pid if proc is not None else None)
        with client.on_task(t) as name, tf.variable_creator_scope(made_by):
            yield name

    # -- stragglers and failures, on purpose --------------------------------
    def _live(self, task: str | TaskName) -> tuple[TaskName, TaskHandle]:
        t = self.check_task(task)
        proc = self.procs[t]
        if not proc.alive:
            raise TaskLost(f"{t} (pid {proc.pid}) is not running; restart it first: cluster.restart('{t}')")
        return t, proc

    def slow(self, task: str | TaskName, factor: float = 4.0) -> None:
        """Make ``task`` run at 1/``factor`` of its speed; ``factor=1`` restores.

        The task's process is paused and resumed many times a second (see
        :mod:`tfmagic.throttle`), so everything it does slows down, whoever
        asks: a training loop, a ``%%tf_device`` cell, another program.  On a
        paced cluster the worker's modelled machine becomes ``factor`` times
        slower instead (the process keeps its speed): the engine's steps on it
        take ``factor`` times the pace.
        """
        try:
            factor = float(factor)
        except (TypeError, ValueError):
            raise BadArgument(f"factor must be a number >= 1, not {factor!r}") from None
        if not factor >= 1.0 or factor == float("inf"):
            raise BadArgument(f"factor must be a number >= 1 (1 restores full speed), not {factor:g}")
        t, proc = self._live(task)
        if self.pace is not None:
            self.pace.set_slowdown(t, factor)
            if factor > 1:
                self.slowness[t] = factor
            else:
                self.slowness.pop(t, None)
            self.emit("slow", t, (f"x{factor:g}" if factor > 1 else "full speed") + " (modelled)")
            return
        try:
            proc.request("slow", factor=factor, timeout=5)
        except TimeoutError:
            raise TaskLost(
                f"{t} (pid {proc.task_pid}) did not answer within 5 s (stopped, or hung): it cannot be slowed now; "
                f"cluster.why() says what it waits on, cluster.restart('{t}', force=True) replaces it"
            ) from None
        if factor > 1:
            self.slowness[t] = factor
        else:
            self.slowness.pop(t, None)
        self.emit("slow", t, f"x{factor:g}" if factor > 1 else "full speed")

    def _full_speed(self, t: TaskName) -> None:
        """A new (or dead) process: no throttle, and a modelled machine back at its normal speed."""
        self.slowness.pop(t, None)
        if self.pace is not None:
            self.pace.set_slowdown(t, 1)

    def kill(self, task: str | TaskName) -> None:
        """End ``task``'s process now (SIGKILL), as a crash would."""
        t, proc = self._live(task)
        if proc.pid is not None:
            self._killed_on_purpose.add(proc.pid)
        proc.kill()
        self._full_speed(t)
        self.emit("kill", t, f"process {proc.pid} killed")

    def restart(
        self, task: str | TaskName, timeout: float | None = None, force: bool = False
    ) -> StartOutcome:
        """Start ``task`` again on its old address (a warm spare when there is one).

        A task that is still running is only replaced with ``force=True``:
        what it holds (a ps's variables, a worker's cell namespace) is lost.
        If this process is connected to the cluster the connection is renewed
        (a restarted task would otherwise answer ``Unable to find a
        context_id``); ps variables on other tasks keep their values.
        """
        t = self.check_task(task)
        defn = self._need_running()
        old = self.procs[t]
        if old.alive and not force:
            held = (
                "its variables (every value stored on it)"
                if t.job == "ps"
                else "its state (variables, cell namespace)"
            )
            raise NeedsForce(
                f"{t} is running: restarting it would lose {held}. "
                f"Pass force=True (cluster.restart('{t}', force=True)) if that is what you want"
            )
        if old.alive:
            if old.pid is not None:
                self._killed_on_purpose.add(old.pid)
            old.kill()
        t0 = time.monotonic()
        deadline = t0 + (timeout or self.start_timeout)
        log = str(self.log_dir / f"{t.slug}.log")
        taken = self.pool.take(self.launcher, 1) if self.use_spares else []
        warm = bool(taken and taken[0].warm_at)
        for attempt in range(1, 30):  # noqa: B007 - reported in the outcome
            proc = taken.pop() if taken else self.launcher.spawn(log, old.destination or old.host)
            if not proc.wait_for(
                lambda p=proc: p.state is not TaskState.IMPORTING, deadline - time.monotonic()
            ):
                proc.kill()
                raise self._failure(t, proc, "was not up in time after a restart", timed_out=True)
            if proc.state is TaskState.SPARE:
                proc.assign(
                    t,
                    defn.as_dict(),
                    env=self.task_env(t),
                    log=self.launcher.task_log(log),
                    cpu_only=t.job == "ps",
                    threads=_threads_for(len(self.procs)),
                    collective=self.collective,
                    bind_port=self._bind_ports.get(t),
                )
                proc.wait_for(lambda p=proc: p.state is not TaskState.ASSIGNING, deadline - time.monotonic())
            if proc.state is TaskState.RUNNING:
                break
            failure = proc.failure or f"exit code {proc.exit_code}"
            proc.kill()
            if "Could not start gRPC server" in failure and time.monotonic() < deadline:
                time.sleep(0.2)  # the old listener may still be closing
                continue
            raise self._failure(t, proc, f"could not restart: {failure}")
        else:  # pragma: no cover - 30 port clashes in a row
            raise ClusterStartError(f"{t} could not get its port {defn.address(t)} back")
        self._check_serving(t, proc, defn.address(t))
        self.procs[t] = proc
        self._watch(t, proc)
        self._full_speed(t)
        if client.is_connected(self.id):
            self.connect(force=True)
        self.emit("restart", t, f"process {proc.pid}" + (" (warm spare)" if warm else ""))
        if self.use_spares:
            self.pool.fill_later(self.launcher, self.shape.size)
        return Restarted(seconds=time.monotonic() - t0, warm=int(warm), cold=int(not warm), attempts=attempt)

    # -- membership, while it runs (see :mod:`tfmagic.elastic`) ----------------
    def add(self, job: str = "worker", count: int = 1, timeout: float | None = None) -> elastic.Added:
        """Start ``count`` more ``job`` tasks and connect them in place; nothing else restarts.

        >>> cluster.add("worker")          # worker:2 joins a 2-worker cluster  # doctest: +SKIP
        """
        with self._membership:
            return elastic.add(self, job, count, timeout)

    def remove(self, task: str | TaskName, drain: bool = False) -> elastic.Removed:
        """End the highest-numbered worker or ps once the runs using it are done with it (see
        :func:`tfmagic.elastic.remove`): a worker's step not yet applied is dropped unless
        ``drain``; a ps's variables are first moved onto the ps that stay."""
        with self._membership:
            return elastic.remove(self, task, drain)

    # -- inspection ------------------------------------------------------
    def why(self, stacks: bool = False) -> doctor.Diagnosis:
        """Who waits on whom, since when, and why, in words with the next step (the hang doctor).

        Rows have ``waiter``, ``waiting_for``, ``since`` (seconds) and
        ``cause``; ``str()`` says it in sentences.  ``stacks=True`` adds the
        Python stacks of every task's threads.  See :mod:`tfmagic.doctor`.
        """
        return doctor.why(self, stacks=stacks)

    def traffic(self) -> traffic.Traffic:
        """Bytes sent over every link (kernel and tasks) since the cluster started, and the rate now.

        Measured from the operating system's TCP counters of the processes
        (``ss``), not estimated from tensor sizes; see :mod:`tfmagic.traffic`.
        """
        self._need_running()
        meter = self.traffic_meter()
        meter.sample()
        return traffic.Traffic(
            [
                dict(src=link.src, dst=link.dst, bytes=link.bytes, bytes_per_s=link.rate)
                for link in meter.links()
            ]
        )

    def traffic_meter(self) -> traffic.TrafficMeter:
        """The meter that samples this cluster's sockets once a second (started on first use)."""
        with self._lock:
            if self._meter is None or self._meter.cluster is not self:
                self._meter = traffic.TrafficMeter(self)
            return self._meter.start()

    def placement(self, run=None) -> placement.Placement:
        """Every variable the cluster holds (name, task, shape, dtype, bytes), grouped per task.

        What this process created on it (cells under :meth:`device`, training
        runs) and what ``%%tf_px`` cells created inside the tasks.  With
        ``run``, also how many steps each task ran for it.
        """
        self._need_running()
        rows = placement.rows_for(self)
        for task, proc in self.procs.items():
            if not getattr(proc, "api_complete", False):
                continue  # no cell ran there: it holds only what this process put there
            try:
                reply = proc.request("variables", timeout=5)
            except Exception:  # noqa: BLE001 - a task that cannot answer now is left out, and said so
                continue
            for v in reply.get("variables") or []:
                rows.append(
                    placement.VariableRow(
                        v["name"],
                        TaskName.parse(v.get("task") or task),
                        tuple(v["shape"]),
                        v["dtype"],
                        int(v["bytes"]),
                        f"%%tf_px cell in {task}",
                    )
                )
        out = placement.Placement(
            self.name,
            rows,
            assignment=(
                "tfmagic's training engine puts a model's variables on the ps tasks round-robin in the order "
                "the model makes them (w0 on ps:0, w1 on ps:1, ...), optimizer slots beside their variable; "
                "cells put them where %%tf_device (or tf.device) says"
            ),
        )
        if run is not None:
            history = getattr(run, "history", run)  # a TrainingRun or the History train() returned
            out.ran_steps = {t: len(recs) for t, recs in history.by_task().items()}
            held = {(r.name, str(r.task)) for r in rows}
            for name, task, shape, dtype, size in getattr(history, "layout", []):
                if (name, task) not in held and TaskName.parse(task) in self.procs:
                    # the run ended and its variables were freed with it: shown where they were
                    rows.append(
                        placement.VariableRow(
                            name, TaskName.parse(task), shape, dtype, size, f"{history.run} (ended, freed)"
                        )
                    )
        shares = out.shares()
        if len(self.tasks("ps")) == 1 and shares:
            out.notes.append(
                "ps:0 holds every variable: all workers read and write there; --ps 2 (ps=2) spreads them"
            )
        elif shares:
            top, share = max(shares.items(), key=lambda kv: kv[1])
            if share >= 0.6:
                big = max((r for r in rows if r.task == top), key=lambda r: r.bytes)
                out.notes.append(
                    f"{top} holds {share:.0%} of the ps bytes (largest: {big.name}); its link is the bottleneck. "
                    f"Try more ps tasks, or split {big.name}"
                )
        return out

    def logs(self, task: str | TaskName, tail: int | None = 50, native: bool = False) -> str:
        """The last ``tail`` lines of a task's log (everything for ``None``).

        By default TensorFlow's own log lines (CUDA probes, the options dump a
        client's connection prints, gRPC errors) are left out and counted in a
        last line: what stays is what the task's programs printed and
        tfmagic's ``tfmagic: ...`` lines, the training engine's per-worker
        progress among them.  ``native=True`` gives the file as it is.
        """
        from .logs import without_native

        t = self.check_task(task)
        if native:
            return self.launcher.read_log(self.procs[t], tail=tail)
        # read enough to keep ``tail`` lines after the noise is gone
        text = self.launcher.read_log(self.procs[t], tail=None if tail is None else max(50 * tail, 2000))
        kept, hidden = without_native(text)
        lines = kept.splitlines()
        if tail is not None:
            lines = lines[-tail:] if tail else []
        if hidden:
            lines.append(
                f"({hidden} lines of TensorFlow's own log left out; --all, or native=True, shows them)"
            )
        return "\n".join(lines)

    @staticmethod
    def _condition(proc: TaskHandle, stats: dict | None, slowness: float | None) -> str:
        if not proc.alive:
            return f"exited ({proc.exit_code})"
        if stats and stats.get("run_state") == "stopped" and not slowness:
            return "stopped (SIGSTOP)"
        if not stats and proc.pid is not None:
            return "not answering"
        return str(proc.state)

    def condition(self, task: str | TaskName) -> str:
        """``running``, ``stopped (SIGSTOP)`` (by someone else: ``slow`` is not counted), ``not answering``
        or ``exited (CODE)``: whether the task can do what it is asked now."""
        t = self.check_task(task)
        proc = self.procs[t]
        stats = self.launcher.stats(proc, memory=False) if proc.alive else None
        return self._condition(proc, stats, self.slowness.get(t))

    def _row(self, label: str, address: str, proc: TaskHandle, slowness: float | None = None) -> TaskStatus:
        stats = (self.launcher.stats(proc) if proc.alive else None) or {}
        state = self._condition(proc, stats, slowness)
        return TaskStatus(
            task=label,
            address=address,
            pid=proc.task_pid,
            state=state,
            cpu_percent=stats.get("cpu_percent"),
            pss=stats.get("pss"),
            rss=stats.get("rss"),
            uptime_s=stats.get("uptime_s"),
            host=f"{self.launcher.name}:{proc.destination or getattr(proc, 'task_hostname', None) or proc.host}",
            note=f"slowed x{slowness:g}" if slowness else "",
            slowness=slowness or 1.0,
        )

    def restart_relay(self) -> int:
        """Start the modelled network's relay again (same ports, cards and links; the tasks keep
        their state); returns its pid. It restarts by itself when it ends, a few times a minute."""
        if self.shaper is None:
            raise netshape.BadNet(
                "this cluster has no network relay (a modelled network is chosen at start: net=)"
            )
        old = self.shaper.pid
        pid = self.shaper.restart()
        self.emit("relay", None, f"the network relay (pid {old}) restarted as pid {pid}")
        return pid

    def status(self) -> ClusterStatus:
        """Each task's address, pid, state, CPU %, memory (PSS and RSS) and uptime."""
        defn = self.cluster_def
        rows = [
            self._row(task, defn.address(task) if defn else "-", proc, self.slowness.get(task))
            for task, proc in self.procs.items()
        ]
        spares = [self._row("spare", "-", p) for p in self.pool.processes()]
        notes = [] if rows else ["not running"]
        if self.shaper is not None:
            notes.append(
                f"network relay of {', '.join(self.shaper.models)}: pid {self.shaper.pid}, {self.shaper.state()}"
            )
        notes.append(f"security: {self.launcher.security_note()}; {client.server_note()}")
        return ClusterStatus(
            name=self.name, shape=self.shape.describe(), tasks=rows, spares=spares, notes=notes
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.name}: {self.describe()}, {state}>"


class LocalCluster(Cluster):
    """A cluster whose tasks are processes on this machine, on loopback.

    >>> cluster = LocalCluster(ps=1, workers=2)      # doctest: +SKIP
    >>> cluster.start(); cluster.address("worker:1") # doctest: +SKIP
    '127.0.0.1:40123'
    """

    def __init__(self, ps: int = 1, workers: int = 2, *, loopback_only: bool = True, **kwargs) -> None:
        if kwargs.get("launcher") is None:
            kwargs["launcher"] = LocalLauncher(loopback_only=loopback_only)
        super().__init__(ps, workers, **kwargs)


def SSHCluster(  # noqa: N802 - reads as a class, like dask's SSHCluster
    hosts: Sequence[str] | str,
    ps: int = 1,
    workers: int = 2,
    *,
    python: str = "python3",
    ssh_config: str | os.PathLike | None = None,
    ssh_options: Sequence[str] = (),
    tunnel: bool = False,
    guard: bool = True,
    **kwargs,
) -> Cluster:
    """A cluster whose tasks run on SSH hosts, placed round-robin (see :mod:`tfmagic.launchers.ssh`).

    >>> cluster = SSHCluster(["node1", "node2"], ps=1, workers=2, python="/opt/venv/bin/python")  # doctest: +SKIP
    >>> cluster.start()                                                                            # doctest: +SKIP
    """
    from .launchers.ssh import SSHLauncher

    launcher = SSHLauncher(
        hosts, python=python, ssh_config=ssh_config, ssh_options=ssh_options, tunnel=tunnel, guard=guard
    )
    return Cluster(ps, workers, launcher=launcher, **kwargs)


def SparkCluster(master: str = "local[3]", ps: int = 1, workers: int = 2, **kwargs) -> Cluster:  # noqa: N802
    """A cluster whose tasks run as one Spark barrier job on ``master`` (see :mod:`tfmagic.launchers.spark`).

    Keyword arguments of :class:`~tfmagic.launchers.spark.SparkLauncher`
    (``app_name``, ``conf``, ``python``, ``spark``, ``guard``,
    ``connect_timeout``) go to the launcher; the rest (``env``,
    ``start_timeout``, ``name``, ...) to :class:`Cluster`.  Stopping the
    cluster ends the Spark job and the Spark application the launcher created.

    >>> with SparkCluster("local[3]", ps=1, workers=2) as cluster:  # doctest: +SKIP
    ...     cluster.connect()
    """
    from .launchers.spark import SparkLauncher

    names = ("app_name", "conf", "python", "spark", "guard", "connect_timeout")
    launcher_kwargs = {k: kwargs.pop(k) for k in names if k in kwargs}
    launcher = SparkLauncher(master, **launcher_kwargs)
    return Cluster(ps, workers, launcher=launcher, spares=False, **kwargs)
