"""A cluster: a spec plus the task processes that serve it.

``Cluster`` owns the lifecycle (start, stop, status, logs) and is the
plain-Python API; where the processes run is the launcher's business
(:mod:`tfmagic.launchers`).  ``LocalCluster`` is the cluster whose tasks run
on this machine::

    import tfmagic
    with tfmagic.LocalCluster(ps=1, workers=2) as cluster:
        cluster.connect()
        with cluster.device("ps:0"):
            w = tf.Variable(0.0)          # lives on the ps
        with cluster.device("worker:1"):
            y = w + 1.0                   # computed on worker 1

Start outcomes are data (:class:`StartOutcome`), failures are
:class:`~tfmagic.errors.ClusterStartError` carrying the task and the tail of
its log; the magics turn both into messages in one place.
"""

from __future__ import annotations

import contextlib
import itertools
import os
import socket
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from . import client, owner
from .errors import BadClusterShape, ClusterStartError, NoCluster, TaskLost
from .launchers.base import Launcher, TaskProcess, TaskState
from .launchers.local import LocalLauncher
from .pool import SparePool, default_pool
from .spec import ClusterDef, ClusterShape, TaskName
from .status import ClusterStatus, TaskStatus

#: ``progress(task, stage, detail)`` is called as tasks come up.
Progress = Callable[[str, str, str], None]

_ids = itertools.count(1)
_current: Cluster | None = None
_current_lock = threading.Lock()


def current_cluster() -> Cluster | None:
    """The cluster the magics manage (started with ``%tf_cluster start``), or None."""
    return _current


def set_current(cluster: Cluster | None) -> None:
    global _current
    with _current_lock:
        _current = cluster


@dataclass
class StartOutcome:
    """What a start did: ``launched`` (with how many tasks came warm) or ``reused``."""

    kind: str
    seconds: float = 0.0
    warm: int = 0
    cold: int = 0
    attempts: int = 1
    notes: list[str] = field(default_factory=list)


@dataclass
class ClusterEvent:
    """Something that happened to a task: ``slow``, ``kill``, ``restart``, ``lost``."""

    time: float
    kind: str
    task: str
    detail: str = ""


class _PortTaken(Exception):
    """A task's port was taken between picking it and binding it."""


def _threads_for(job: str, tasks_on_host: int) -> dict[str, int]:
    cores = os.cpu_count() or 1
    share = max(1, cores // max(1, tasks_on_host))
    return {"intra": share, "inter": max(2, share)}


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
    ) -> None:
        self.shape = ClusterShape(ps=ps, workers=workers, chief=chief)
        if collective and ps:
            raise BadClusterShape(
                "collective mode (MultiWorkerMirroredStrategy, all-reduce) has no parameter servers; use ps=0"
            )
        self.collective = collective
        self.id = next(_ids)
        self.name = name or f"c{self.id}"
        self.launcher = launcher or LocalLauncher()
        self.env = dict(env or {})
        self.worker_gpus = self._gpu_map(worker_gpus, workers)
        self.use_spares = spares and self.launcher.spares and os.environ.get("TFMAGIC_SPARES", "1") != "0"
        self.pool = pool or default_pool()
        self.start_timeout = start_timeout
        self._log_dir = Path(log_dir) if log_dir else None
        self.procs: dict[TaskName, TaskProcess] = {}
        self.cluster_def: ClusterDef | None = None
        self.started_at: float | None = None
        self._lock = threading.RLock()
        self._killed_on_purpose: set[int] = set()
        self.last_outcome: StartOutcome | None = None
        self.slowness: dict[TaskName, float] = {}
        self.events: list[ClusterEvent] = []
        self.listeners: list[Callable[[ClusterEvent], None]] = []

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
            raise ValueError(
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

    # -- lifecycle -------------------------------------------------------
    @property
    def running(self) -> bool:
        return bool(self.procs) and self.cluster_def is not None

    def start(self, progress: Progress | None = None, timeout: float | None = None) -> StartOutcome:
        """Start every task and return when each one accepts connections.

        On failure or timeout the tasks started so far are stopped and a
        :class:`ClusterStartError` names the task and shows its log's tail.
        A cluster that already runs is left alone (``kind="reused"``).
        """
        with self._lock:
            if self.running:
                return StartOutcome("reused")
            say = progress or (lambda task, stage, detail: None)
            timeout = self.start_timeout if timeout is None else timeout
            deadline = time.monotonic() + timeout
            t0 = time.monotonic()
            for attempt in range(1, 4):
                try:
                    warm, cold = self._start_once(say, deadline)
                except _PortTaken as exc:
                    say(str(exc), "retry", "a port was taken while starting; trying fresh ports")
                    continue
                outcome = StartOutcome(
                    "launched", seconds=time.monotonic() - t0, warm=warm, cold=cold, attempts=attempt
                )
                self.started_at = time.time()
                self.last_outcome = outcome
                if self.use_spares:
                    self.pool.fill_later(self.launcher, self.shape.size)
                return outcome
            raise ClusterStartError(
                "three attempts in a row found a picked port taken before the server could "
                "bind it; something on this machine is grabbing ports fast; try again"
            )

    def _start_once(self, say: Progress, deadline: float) -> tuple[int, int]:
        tasks = self.shape.tasks()
        hosts = self.launcher.hosts_for(len(tasks))
        taken = self.pool.take(self.launcher, len(tasks)) if self.use_spares else []
        warm = sum(1 for p in taken if p.warm_at is not None)
        procs: dict[TaskName, TaskProcess] = {}
        wake = threading.Event()

        def listener(proc: TaskProcess, msg: dict) -> None:
            wake.set()

        try:
            fresh = []
            for task in tasks:
                if taken:
                    proc = taken.pop(0)
                    say(str(task), "spare", f"warm process {proc.pid}")
                    proc.listeners.append(listener)
                    procs[task] = proc
                else:
                    fresh.append(task)
            if fresh:
                spawned = self.launcher.spawn_many(
                    [str(self.log_dir / f"{t.slug}.log") for t in fresh],
                    [hosts[tasks.index(t)] for t in fresh],
                )
                for task, proc in zip(fresh, spawned):
                    where = f" on {proc.host}" if self.launcher.remote else ""
                    say(str(task), "spawned", f"new process {proc.pid}{where}, importing TensorFlow")
                    proc.listeners.append(listener)
                    procs[task] = proc
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
                        if not proc.join(5):  # its exit code, for the message
                            raise self._failure(
                                task, proc, f"did not answer when asked for a free port ({exc})"
                            )
                        raise self._failure(
                            task,
                            proc,
                            f"its process ended before it could start (exit code {proc.exit_code})",
                        )
                used.add(port)
                jobs.setdefault(task.job, []).append(f"{proc.host}:{port}")
            defn = ClusterDef.from_mapping(jobs)
            cluster = defn.as_dict()
            self.launcher.prepare(cluster, procs)
            assigned: set[TaskName] = set()
            up: set[TaskName] = set()
            while len(up) < len(tasks):
                wake.clear()
                for task, proc in procs.items():
                    if task not in assigned and proc.state is TaskState.SPARE:
                        proc.assign(
                            task,
                            cluster,
                            env=self.task_env(task),
                            log=self.launcher.task_log(str(self.log_dir / f"{task.slug}.log")),
                            cpu_only=task.job == "ps",
                            threads=_threads_for(task.job, len(tasks)),
                            collective=self.collective,
                        )
                        assigned.add(task)
                        say(str(task), "starting", f"server on {defn.address(task)}")
                    elif proc.state is TaskState.FAILED:
                        if "Could not start gRPC server" in (proc.failure or ""):
                            raise _PortTaken(f"{task}: port {proc.port} was taken")
                        raise self._failure(task, proc, f"could not start its server: {proc.failure}")
                    elif not proc.alive:
                        why = f": {proc.failure}" if proc.failure else ""
                        raise self._failure(
                            task, proc, f"its process ended (exit code {proc.exit_code}){why}"
                        )
                    elif proc.state is TaskState.RUNNING and task not in up:
                        self._check_accepts(task, proc, defn.address(task))
                        up.add(task)
                        say(str(task), "up", f"{defn.address(task)} (pid {proc.pid})")
                if len(up) == len(tasks):
                    break
                if time.monotonic() > deadline:
                    waiting = [t for t in tasks if t not in up]
                    first = waiting[0]
                    raise self._failure(
                        first,
                        procs[first],
                        f"was not up in time (still {procs[first].state}); "
                        f"waiting for {', '.join(map(str, waiting))}",
                        timed_out=True,
                    )
                wake.wait(0.1)
        except BaseException:
            for proc in procs.values():
                proc.kill()
            self.launcher.close()
            raise
        finally:
            for proc in procs.values():
                if listener in proc.listeners:
                    proc.listeners.remove(listener)
        self.procs = procs
        self.cluster_def = defn
        self.slowness = {}
        for task, proc in procs.items():
            self._watch(task, proc)
        return warm, len(tasks) - warm

    def _watch(self, task: TaskName, proc: TaskProcess) -> None:
        def on_event(p: TaskProcess, msg: dict) -> None:
            if (
                msg.get("event") == "exit"
                and p.pid not in self._killed_on_purpose
                and self.procs.get(task) is p
            ):
                self.emit("lost", task, f"process {p.pid} ended (exit code {msg.get('code')})")

        proc.listeners.append(on_event)

    def emit(self, kind: str, task: TaskName | str, detail: str = "") -> ClusterEvent:
        """Record an event and tell every listener (dashboards, training runs)."""
        event = ClusterEvent(time.time(), kind, str(task), detail)
        self.events.append(event)
        for listener in list(self.listeners):
            try:
                listener(event)
            except Exception:  # noqa: BLE001 - a broken listener must not break the cluster
                pass
        return event

    def _check_accepts(self, task: TaskName, proc: TaskProcess, address: str) -> None:
        host, port = address.rsplit(":", 1)
        try:
            socket.create_connection((host, int(port)), timeout=5).close()
        except OSError as exc:
            raise self._failure(task, proc, f"said it was up but {address} refused a connection ({exc})")

    def _failure(
        self, task: TaskName, proc: TaskProcess, what: str, timed_out: bool = False
    ) -> ClusterStartError:
        tail = proc.log_tail(15)
        msg = f"{task} (pid {proc.task_pid}) {what}. The tasks started so far were stopped."
        hint = self.launcher.diagnose(proc, tail)
        if hint:
            msg += f" To fix: {hint}."
        if timed_out:
            msg += f" Allow more time with start_timeout= (now {self.start_timeout:g} s)."
        msg += f" Its log: {proc.log_path}"
        return ClusterStartError(msg, task=str(task), log_tail=tail)

    def stop(self) -> None:
        """Stop every task of this cluster (spares stay warm for the next start)."""
        with self._lock:
            if not self.procs:
                raise NoCluster(f"cluster {self.name} is not running; nothing to stop")
            procs, self.procs = self.procs, {}
            self.cluster_def = None
            client.forget(self.id)
            self._killed_on_purpose.update(p.pid for p in procs.values())
        for proc in procs.values():
            proc.kill()
        self.launcher.close()
        self.emit("stop", "cluster", f"{len(procs)} tasks stopped")

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
        client.connect(
            self.id,
            defn,
            force=force,
            client_address=self.launcher.client_address(defn),
            fixed_port=self.launcher.client_port_fixed,
        )
        return self

    def check_task(self, task: str | TaskName) -> TaskName:
        return self._need_running().check(task)

    @contextlib.contextmanager
    def device(self, task: str | TaskName) -> Iterator[str]:
        """Place the TensorFlow ops created inside on ``task``; connects first."""
        t = self.check_task(task)
        proc = self.procs.get(t)
        if proc is not None and not proc.alive:
            raise TaskLost(
                f"{t} (pid {proc.pid}) is not running (exit code {proc.exit_code}); "
                f"see cluster.logs('{t}') and restart the cluster"
            )
        self.connect()
        with client.on_task(t) as name:
            yield name

    # -- stragglers and failures, on purpose --------------------------------
    def _live(self, task: str | TaskName) -> tuple[TaskName, TaskProcess]:
        t = self.check_task(task)
        proc = self.procs[t]
        if not proc.alive:
            raise TaskLost(f"{t} (pid {proc.pid}) is not running; restart it first: cluster.restart('{t}')")
        return t, proc

    def slow(self, task: str | TaskName, factor: float = 4.0) -> None:
        """Make ``task`` run at 1/``factor`` of its speed; ``factor=1`` restores.

        The task's process is paused and resumed many times a second (see
        :mod:`tfmagic.throttle`), so everything it does slows down, whoever
        asks: a training loop, a ``%%tf_device`` cell, another program.
        """
        try:
            factor = float(factor)
        except (TypeError, ValueError):
            raise ValueError(f"factor must be a number >= 1, not {factor!r}") from None
        if not factor >= 1.0 or factor == float("inf"):
            raise ValueError(f"factor must be a number >= 1 (1 restores full speed), not {factor:g}")
        t, proc = self._live(task)
        proc.request("slow", factor=factor, timeout=15)
        if factor > 1:
            self.slowness[t] = factor
        else:
            self.slowness.pop(t, None)
        self.emit("slow", t, f"x{factor:g}" if factor > 1 else "full speed")

    def kill(self, task: str | TaskName) -> None:
        """End ``task``'s process now (SIGKILL), as a crash would."""
        t, proc = self._live(task)
        self._killed_on_purpose.add(proc.pid)
        proc.kill()
        self.slowness.pop(t, None)
        self.emit("kill", t, f"process {proc.pid} killed")

    def restart(self, task: str | TaskName, timeout: float | None = None) -> StartOutcome:
        """Start ``task`` again on its old address (a warm spare when there is one).

        If this process is connected to the cluster the connection is renewed
        (a restarted task would otherwise answer ``Unable to find a
        context_id``); ps variables on other tasks keep their values.
        """
        t = self.check_task(task)
        defn = self._need_running()
        old = self.procs[t]
        if old.alive:
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
                    threads=_threads_for(t.job, len(self.procs)),
                    collective=self.collective,
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
        self._check_accepts(t, proc, defn.address(t))
        self.procs[t] = proc
        self._watch(t, proc)
        self.slowness.pop(t, None)
        if client.is_connected(self.id):
            self.connect(force=True)
        self.emit("restart", t, f"process {proc.pid}" + (" (warm spare)" if warm else ""))
        if self.use_spares:
            self.pool.fill_later(self.launcher, self.shape.size)
        return StartOutcome(
            "restarted", seconds=time.monotonic() - t0, warm=int(warm), cold=int(not warm), attempts=attempt
        )

    # -- inspection ------------------------------------------------------
    def logs(self, task: str | TaskName, tail: int | None = 50) -> str:
        """The last ``tail`` lines of a task's log (everything for ``None``)."""
        t = self.check_task(task)
        return self.launcher.read_log(self.procs[t], tail=tail)

    def _row(self, label: str, address: str, proc: TaskProcess) -> TaskStatus:
        alive = proc.alive
        stats = self.launcher.stats(proc) if alive else None
        stats = stats or {}
        state = str(proc.state)
        if not alive:
            state = f"exited ({proc.exit_code})"
        return TaskStatus(
            task=label,
            address=address,
            pid=proc.task_pid,
            state=state,
            cpu_percent=stats.get("cpu_percent"),
            pss=stats.get("pss"),
            rss=stats.get("rss"),
            uptime_s=stats.get("uptime_s"),
            host=f"{self.launcher.name}:{proc.destination or proc.task_hostname or proc.host}",
        )

    def status(self) -> ClusterStatus:
        """Each task's address, pid, state, CPU %, memory (PSS and RSS) and uptime."""
        rows = []
        defn = self.cluster_def
        for task, proc in self.procs.items():
            row = self._row(str(task), defn.address(task) if defn else "-", proc)
            if task in self.slowness:
                row.note = f"slowed x{self.slowness[task]:g}"
                row.slowness = self.slowness[task]
            rows.append(row)
        spares = [self._row("spare", "-", p) for p in self.pool.processes()]
        notes = []
        if not rows:
            notes.append("not running")
        notes.append("security: " + self.launcher.security_note())
        return ClusterStatus(
            name=self.name,
            shape=self.shape.describe(),
            tasks=rows,
            spares=spares,
            notes=notes,
        )

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.name}: {self.shape.describe()}, {state}>"


class LocalCluster(Cluster):
    """A cluster whose tasks are processes on this machine, on loopback.

    >>> cluster = LocalCluster(ps=1, workers=2)      # doctest: +SKIP
    >>> cluster.start(); cluster.address("worker:1") # doctest: +SKIP
    '127.0.0.1:40123'
    """

    def __init__(self, ps: int = 1, workers: int = 2, *, loopback_only: bool = True, **kwargs) -> None:
        if "launcher" not in kwargs or kwargs["launcher"] is None:
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
