"""``Cluster``: the facade of the cluster package (see :mod:`tfmagic.cluster`), and its three kinds."""

from __future__ import annotations

import contextlib
import itertools
import os
import threading
import time
from collections.abc import Collection, Iterator, Mapping, Sequence
from pathlib import Path

from .. import client, doctor, variable_map
from ..errors import BadClusterShape, NoCluster
from ..events import Event, Topic
from ..launchers.base import Launcher, TaskHandle
from ..launchers.local import LocalLauncher, check_shared
from ..network import shaper as netshape
from ..network import traffic
from ..pace import Pace
from ..pool import SparePool, default_pool
from ..procs import owner
from ..spec import ClusterDef, ClusterShape, TaskName
from ..status import ClusterStatus
from . import faults, inspection, membership
from .network import ClusterNetwork
from .outcomes import Launched, Reused, StartOutcome
from .taskset import Progress, TaskSet, _PortTaken

_ids = itertools.count(1)


#: TensorFlow grows its GPU memory as needed instead of taking the whole card (set unless given)
GPU_GROWTH = "TF_FORCE_GPU_ALLOW_GROWTH"


def gpu_map(worker_gpus, workers: int) -> dict[int, str]:
    """``worker_gpus=`` as each worker's ``CUDA_VISIBLE_DEVICES`` (index -> devices)."""
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


class _TaskSetting:
    """An attribute of the cluster that lives on its :class:`TaskSet` (one copy, never two)."""

    def __init__(self, doc: str) -> None:
        self.__doc__ = doc

    def __set_name__(self, owner: type, name: str) -> None:
        self.name = name

    def __get__(self, cluster, kind=None):
        return self if cluster is None else getattr(cluster.taskset, self.name)

    def __set__(self, cluster, value) -> None:
        setattr(cluster.taskset, self.name, value)


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
        shape = ClusterShape(ps=ps, workers=workers, chief=chief)
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
        self.worker_gpus = gpu_map(worker_gpus, workers)
        use_spares = spares and self.launcher.makes_spares and os.environ.get("TFMAGIC_SPARES", "1") != "0"
        self._log_dir = Path(log_dir) if log_dir else None
        #: the task processes, the definition they serve, and every change of them (see :mod:`.taskset`)
        self.taskset = TaskSet(
            self.name,
            shape,
            self.launcher,
            log_dir=lambda: self.log_dir,
            task_env=self.task_env,
            collective=collective,
            start_timeout=float(start_timeout),
            emit=self.emit,
            cluster_id=self.id,
            pool=pool or default_pool(),
            use_spares=use_spares,
        )
        #: the modelled network chosen at start (see :mod:`.network` and :mod:`tfmagic.network.shaper`)
        self.network = ClusterNetwork(
            net, shape, self.launcher, self.taskset, self.emit, self.check_task, self.tasks
        )
        self.started_at: float | None = None
        self.stopped_at: float | None = None
        self.last_outcome: StartOutcome | None = None
        #: what happened to the cluster: iterate for the past, subscribe for what comes
        self.events: Topic[Event] = Topic(f"cluster {self.name}", keep=10_000)
        #: one membership change at a time: an add and a remove at once lost a task (issue 22, item 6)
        self._membership = threading.Lock()
        self._meter: traffic.TrafficMeter | None = None
        #: the name of the cluster that replaced this one (the hang doctor says so to a stale handle)
        self.replaced_by: str | None = None

    # -- what the task set and the network hold, read as the cluster's ------
    @property
    def procs(self) -> dict[TaskName, TaskHandle]:
        """The task processes by task (``cluster.procs["worker:0"]``, a handle: pid, state, log)."""
        return self.taskset.procs

    @property
    def cluster_def(self) -> ClusterDef | None:
        """The definition the running tasks serve (None when stopped)."""
        return self.taskset.cluster_def

    @property
    def shape(self) -> ClusterShape:
        return self.taskset.shape

    # Settings the task set acts on, kept in one place: a change after construction reaches it
    use_spares = _TaskSetting("Whether starts, restarts and adds take warm spares from :attr:`pool` first.")
    pool = _TaskSetting("The warm spare processes this cluster takes from (:mod:`tfmagic.pool`).")
    start_timeout = _TaskSetting("Seconds a start, restart or add waits for its servers.")

    @property
    def slowness(self) -> dict[TaskName, float]:
        """Each slowed task's factor (``slow``)."""
        return self.taskset.slowness

    @property
    def shaper(self) -> netshape.Shaper | None:
        """The modelled network's relay (None without ``net=``)."""
        return self.network.shaper

    @property
    def net_models(self) -> dict[str, netshape.LinkModel]:
        """The cards and link rules chosen at start (``net=``)."""
        return self.network.models

    def shaped(self, task: TaskName) -> netshape.LinkModel | None:
        """The card of a task that gets a relay (None: it has none)."""
        return self.network.shaped(task)

    # -- configuration ---------------------------------------------------
    def task_env(self, task: TaskName) -> dict[str, str]:
        """The environment a task gets on top of the launcher's."""
        env = dict(self.env)
        if task.job == "ps":
            env["CUDA_VISIBLE_DEVICES"] = ""
        elif task.job == "worker" and task.index in self.worker_gpus:
            env["CUDA_VISIBLE_DEVICES"] = self.worker_gpus[task.index]
        if task.job != "ps" and GPU_GROWTH not in env and GPU_GROWTH not in os.environ:
            # TensorFlow takes nearly all of a GPU's memory in the first process
            # that touches it; the workers of a local cluster share the machine's
            # GPUs with each other and with the kernel, so each takes what it uses.
            env[GPU_GROWTH] = "true"
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
        return self.taskset.running

    def start(self, progress: Progress | None = None, timeout: float | None = None) -> StartOutcome:
        """Start every task and return when each one accepts connections.

        On failure or timeout the tasks started so far are stopped and a
        :class:`ClusterStartError` names the task and shows its log's tail.
        A cluster that already runs is left alone (:class:`Reused`).
        """
        with self.taskset.lock:
            if self.running:
                return Reused(age_s=time.time() - (self.started_at or time.time()))
            say = progress or (lambda task, stage, detail: None)
            timeout = self.start_timeout if timeout is None else timeout
            deadline = time.monotonic() + timeout
            t0 = time.monotonic()
            self.taskset.check_fits(self.shape.size)
            taken: _PortTaken | None = None
            for attempt in range(1, 4):
                try:
                    warm = self._start_once(say, deadline)
                except _PortTaken as exc:
                    taken = exc
                    say(str(exc), "retry", "a port was taken while starting; trying fresh ports")
                    continue
                cold = self.shape.size - warm
                outcome = Launched(seconds=time.monotonic() - t0, warm=warm, cold=cold, attempts=attempt)
                self.started_at = time.time()
                self.stopped_at = None
                self.last_outcome = outcome
                self.emit("start", None, self.describe())
                if self.use_spares:
                    self.pool.fill_later(self.launcher, self.shape.size)
                return outcome
            raise self.taskset.ports_kept_taken(taken)

    def _start_once(self, say: Progress, deadline: float) -> int:
        tasks = self.shape.tasks()
        procs: dict[TaskName, TaskHandle] = {}
        try:
            procs, warm = self.taskset.processes_for(tasks, self.launcher.hosts_for(len(tasks)), say)
            defn = self.taskset.choose_addresses(procs)
            defn = self.network.route(tasks, procs, defn)
            self.launcher.prepare(defn.as_dict(), procs)
            self.taskset.bring_up(procs, defn, say, deadline, bind_ports=self.network.bind_ports)
        except BaseException:
            for proc in procs.values():
                proc.kill()
            self.network.stop()
            self.launcher.close()
            raise
        self.taskset.slowness.clear()
        self.taskset.serve(procs, defn)
        return warm

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
        start (``net=``); see :mod:`tfmagic.network.shaper`.  Returns the model set, or with no target the
        :class:`~tfmagic.network.shaper.NetModels` (cards and links, with the bytes that crossed each).
        """
        return self.network.net(target, rate, delay)

    def restart_relay(self) -> int:
        """Start the modelled network's relay again (same ports, cards and links; the tasks keep
        their state); returns its pid. It restarts by itself when it ends, a few times a minute."""
        return self.network.restart_relay()

    def emit(self, kind: str, task: TaskName | str | None, detail: str = "", **more) -> Event:
        """Record an event and tell every follower (dashboards, training runs, cells)."""
        event = Event.now(kind, task, detail, **more)
        self.events.publish(event)
        return event

    def stop(self, reason: str = "the cluster was stopped") -> None:
        """Stop every task of this cluster (spares stay warm for the next start).

        Everything that runs on it (training runs, ``%%tf_px`` cells,
        dashboards) is told first (a ``stopping`` event) and ends with
        ``reason`` as its final state.
        """
        with self.taskset.lock:
            if not self.procs:
                raise NoCluster(f"cluster {self.name} is not running; nothing to stop")
            self.emit("stopping", None, reason)
            procs = self.taskset.clear()
            if self._meter is not None:
                self._meter.stop()
                self._meter = None
            self.network.stop()
            self.stopped_at = time.time()
            client.forget(self.id)
        with client.steady_connection():
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
    @property
    def spec(self):
        """The ``tf.train.ClusterSpec`` of the running cluster."""
        return self.taskset.require().to_tf()

    def address(self, task: str | TaskName) -> str:
        """``host:port`` of a task, e.g. ``cluster.address("worker:1")``."""
        return self.taskset.require().address(task)

    def target(self, task: str | TaskName) -> str:
        """The ``grpc://`` target a TF1 ``Session`` connects to."""
        return "grpc://" + self.address(task)

    def tf_config(self, task: str | TaskName) -> dict:
        return self.taskset.require().tf_config(task)

    def resolver(self):
        """A ``SimpleClusterResolver`` for ``tf.distribute.ParameterServerStrategy``."""
        return client.resolver(self.taskset.require())

    def connect(self, force: bool = False) -> Cluster:
        """Make this process a client of the cluster (remote devices usable)."""
        defn = self.taskset.require()
        client.connect(self.id, defn, force=force, client_address=self.launcher.client_address(defn))
        return self

    def check_task(self, task: str | TaskName) -> TaskName:
        return self.taskset.require().check(task)

    def tasks(self, job: str | None = None) -> list[TaskName]:
        """The running cluster's tasks (of ``job``), in order."""
        return [t for t in self.taskset.require().tasks() if job is None or t.job == job]

    @contextlib.contextmanager
    def device(self, task: str | TaskName) -> Iterator[str]:
        """Place the TensorFlow ops created inside on ``task``; connects first."""
        t, proc = inspection.placeable(self, task)  # connected, and the task answers
        import tensorflow as tf

        made_by = variable_map.creator(self.id, f"cell on {t}", proc.task_pid if proc is not None else None)
        with client.on_task(t) as name, tf.variable_creator_scope(made_by):
            yield name

    # -- stragglers and failures, on purpose (see :mod:`.faults`) ----------------
    def slow(self, task: str | TaskName, factor: float = 4.0) -> None:
        """Make ``task`` run at 1/``factor`` of its speed; ``factor=1`` restores.

        The task's process is paused and resumed many times a second (see
        :mod:`tfmagic.procs.throttle`), so everything it does slows down, whoever
        asks: a training loop, a ``%%tf_device`` cell, another program.  On a
        paced cluster the worker's modelled machine becomes ``factor`` times
        slower instead (the process keeps its speed): the engine's steps on it
        take ``factor`` times the pace.
        """
        faults.slow(self, task, factor)

    def kill(self, task: str | TaskName) -> None:
        """End ``task``'s process now (SIGKILL), as a crash would; a task sharing its process
        (``processes=``) dies alone, modelled: its server cut off, its process serving the others."""
        faults.kill(self, task)

    def restart(
        self, task: str | TaskName, timeout: float | None = None, force: bool = False
    ) -> StartOutcome:
        """Start ``task`` again on its old address (a warm spare when there is one; a task sharing
        its process gets a new server in that process).

        A task that is still running is only replaced with ``force=True``:
        what it holds (a ps's variables, a worker's cell namespace) is lost.
        If this process is connected to the cluster the connection is renewed
        (a restarted task would otherwise answer ``Unable to find a
        context_id``); ps variables on other tasks keep their values.
        """
        return faults.restart(self, task, timeout, force)

    # -- membership, while it runs (see :mod:`.membership`) ----------------
    def add(self, job: str = "worker", count: int = 1, timeout: float | None = None) -> membership.Added:
        """Start ``count`` more ``job`` tasks and connect them in place; nothing else restarts.

        >>> cluster.add("worker")          # worker:2 joins a 2-worker cluster  # doctest: +SKIP
        """
        with self._membership:
            return membership.add(self, job, count, timeout)

    def remove(self, task: str | TaskName, drain: bool = False) -> membership.Removed:
        """End the highest-numbered worker or ps once the runs using it are done with it (see
        :func:`tfmagic.cluster.membership.remove`): a worker's step not yet applied is dropped unless
        ``drain``; a ps's variables are first moved onto the ps that stay."""
        with self._membership:
            return membership.remove(self, task, drain)

    # -- inspection ------------------------------------------------------
    def why(self, stacks: bool = False) -> doctor.Diagnosis:
        """Who waits on whom, since when, and why, in words with the next step (the hang doctor).

        Rows have ``waiter``, ``waiting_for``, ``since`` (seconds) and
        ``cause``; ``str()`` says it in sentences.  ``stacks=True`` adds the
        Python stacks of every task's threads.  See :mod:`tfmagic.doctor.diagnosis`.
        """
        return doctor.why(self, stacks=stacks)

    def traffic(self) -> traffic.Traffic:
        """Bytes sent over every link (kernel and tasks) since the cluster started, and the rate now.

        Measured from the operating system's TCP counters of the processes
        (``ss``), not estimated from tensor sizes; see :mod:`tfmagic.network.traffic`.
        """
        self.taskset.require()
        return self.traffic_meter().traffic()

    @property
    def meter(self) -> traffic.TrafficMeter | None:
        """The traffic meter while one samples this cluster (None until traffic is asked for)."""
        return self._meter

    def traffic_meter(self) -> traffic.TrafficMeter:
        """The meter that samples this cluster's sockets once a second (started on first use)."""
        with self.taskset.lock:
            if self._meter is None or self._meter.cluster is not self:
                self._meter = traffic.TrafficMeter(self)
            return self._meter.start()

    def placement(self, run=None) -> variable_map.Placement:
        """Every variable the cluster holds (name, task, shape, dtype, bytes), grouped per task.

        What this process created on it (cells under :meth:`device`, training
        runs) and what ``%%tf_px`` cells created inside the tasks.  With
        ``run``, also how many steps each task ran for it.
        """
        self.taskset.require()
        return inspection.placement_of(self, run)

    def logs(self, task: str | TaskName, tail: int | None = 50, native: bool = False) -> str:
        """The last ``tail`` lines of a task's log (everything for ``None``).

        By default TensorFlow's own log lines (CUDA probes, the options dump a
        client's connection prints, gRPC errors) are left out and counted in a
        last line: what stays is what the task's programs printed and
        tfmagic's ``tfmagic: ...`` lines, the training engine's per-worker
        progress among them.  ``native=True`` gives the file as it is.
        """
        return inspection.logs(self, self.check_task(task), tail, native)

    def condition(self, task: str | TaskName) -> str:
        """``running``, ``stopped (SIGSTOP)`` (by someone else: ``slow`` is not counted), ``not answering``
        or ``exited (CODE)``: whether the task can do what it is asked now."""
        return inspection.condition(self, self.check_task(task))

    def status(self, memory: bool | Collection[str] = True, spares: bool = True) -> ClusterStatus:
        """Each task's address, pid, state, CPU %, memory (PSS and RSS) and uptime, and the warm spares.

        Reading a process's PSS walks its every mapping: ``memory=False`` leaves memory out, or
        name the tasks to read it for (the dashboard reads each every 15 s, not every frame).
        """
        return inspection.status(self, memory, spares)

    def __repr__(self) -> str:
        state = "running" if self.running else "stopped"
        return f"<{type(self).__name__} {self.name}: {self.describe()}, {state}>"


class LocalCluster(Cluster):
    """A cluster whose tasks are processes on this machine, on loopback.

    >>> cluster = LocalCluster(ps=1, workers=2)      # doctest: +SKIP
    >>> cluster.start(); cluster.address("worker:1") # doctest: +SKIP
    '127.0.0.1:40123'

    ``processes=2`` (or ``"auto"``: one per 16 tasks) puts the tasks in that many processes,
    each task still a gRPC server of its own (:mod:`tfmagic.task.host`): 2 ps and 32 workers in
    a laptop's or Binder's memory. One of them is killed and restarted alone as modelled (its
    server cut off, then a new one in its process); what one cannot do alone (a removal, a
    throttle, a ``%%tf_px`` cell) is refused in one line.
    """

    def __init__(
        self,
        ps: int = 1,
        workers: int = 2,
        *,
        loopback_only: bool = True,
        processes: int | str | None = None,
        **kwargs,
    ) -> None:
        if processes is not None:  # several tasks a process (tfmagic.task.host): 34 tasks in 2 GB
            size = ClusterShape(ps=ps, workers=workers, chief=kwargs.get("chief", 0)).size
            processes = check_shared(processes, size, kwargs)
        if kwargs.get("launcher") is None:
            kwargs["launcher"] = LocalLauncher(loopback_only=loopback_only, processes=processes)
        super().__init__(ps, workers, **kwargs)
