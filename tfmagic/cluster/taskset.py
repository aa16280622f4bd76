"""The task processes of one cluster: who they are, bringing them up, watching them, ending them.

A :class:`TaskSet` owns what every change of a cluster's processes touches:
the processes by task, the definition they serve, the shape, the pids ended
on purpose (so their exit is not reported as a loss), each task's slowdown,
and the lock that makes a change one step.  Start, restart and membership
changes all bring processes up through :meth:`TaskSet.bring_up` (give each
its role, wait until it serves, check where it listens), so the sequence is
written once.  It never imports :class:`~tfmagic.cluster.Cluster`: what
happens is told through the ``emit`` callback, as ipyparallel's launchers
tell their cluster.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from pathlib import Path

from ..doctor import waits
from ..errors import ClusterStartError, NoCluster, WillNotFit
from ..launchers.base import Launcher, TaskHandle, TaskState
from ..launchers.local import LocalLauncher
from ..pool import SparePool, default_pool
from ..protocol import Event
from ..spec import ClusterDef, ClusterShape, TaskName

#: Memory one task costs before any was measured (PSS of a task here: about 0.18 GB).
TASK_BYTES = 200 * 2**20
#: What one more task costs in a process it shares (``processes=``): its server, its variables
#: and placed functions after a run (``python bench/memory.py --processes``: about 25-30 MB with
#: one serving thread a server, ``_native/servethreads.c``; about 60 MB with TensorFlow's 8)
SHARED_TASK_BYTES = 32 * 2**20

#: ``progress(task, stage, detail)`` is called as tasks come up.
Progress = Callable[[str, str, str], None]
#: ``emit(kind, task, detail)`` records what happened (the cluster's events).
Emit = Callable[[str, "TaskName | str | None", str], object]


class _PortTaken(Exception):
    """A task's port was taken between picking it and binding it (a fresh start picks others)."""

    def __init__(self, task: TaskName, port: int | None) -> None:
        super().__init__(f"{task}: port {port} was taken")
        self.task, self.port = task, port


def threads_for(tasks_on_host: int, in_process: int = 1) -> dict[str, int]:
    """TensorFlow's thread pools for one of ``tasks_on_host`` tasks sharing this machine's cores.

    ``in_process`` tasks sharing one process (``processes=``) share its one inter-op pool, sized by
    its first server: a unary call holds a thread of it while its function waits for the ps's part,
    so fewer threads than tasks + 1 hang every worker (``bench/shared_process.py``); + 2 here.
    """
    cores = os.cpu_count() or 1
    share = max(1, cores // max(1, tasks_on_host))
    inter = max(2, share) if in_process <= 1 else max(2, share, in_process + 2)
    return {"intra": share, "inter": inter}


def same_host(listening: str, bind_host: str) -> bool:
    return listening in (bind_host, f"::ffff:{bind_host}")


class TaskSet:
    """One cluster's task processes and the definition they serve.

    ``log_dir`` and ``task_env`` are asked, not copied (the cluster's log
    folder is made on first use; a task's environment is the cluster's).
    """

    def __init__(
        self,
        name: str,
        shape: ClusterShape,
        launcher: Launcher,
        *,
        log_dir: Callable[[], Path],
        task_env: Callable[[TaskName], dict[str, str]],
        collective: bool,
        start_timeout: float,
        emit: Emit,
        cluster_id: int | None = None,
        pool: SparePool | None = None,
        use_spares: bool = False,
    ) -> None:
        self.name = name
        self.cluster_id = cluster_id
        self.pool = pool or default_pool()
        #: warm spare processes are taken from the pool first (see :mod:`tfmagic.pool`)
        self.use_spares = use_spares
        self.shape = shape
        self.launcher = launcher
        self.collective = collective
        self.start_timeout = start_timeout
        self._log_dir = log_dir
        self._task_env = task_env
        self._emit = emit
        self.procs: dict[TaskName, TaskHandle] = {}
        self.cluster_def: ClusterDef | None = None
        #: a worker's slowdown by ``slow`` (the throttle's, or its modelled machine's)
        self.slowness: dict[TaskName, float] = {}
        #: one change of the processes at a time (start, stop, restart, add, remove)
        self.lock = threading.RLock()
        self._killed_on_purpose: set[int] = set()

    # -- what runs ---------------------------------------------------------
    @property
    def running(self) -> bool:
        return bool(self.procs) and self.cluster_def is not None

    def require(self) -> ClusterDef:
        """The definition the running tasks serve; one line when the cluster is not running."""
        if self.cluster_def is None:
            raise NoCluster(
                f"cluster {self.name} is not running; start it first (cluster.start() or %tf_cluster start)"
            )
        return self.cluster_def

    def log_path(self, task: TaskName) -> str:
        return str(self._log_dir() / f"{task.slug}.log")

    # -- bringing processes up ----------------------------------------------
    def check_fits(self, count: int) -> None:
        """Say before starting anything when ``count`` more local tasks will not fit in memory."""
        if not isinstance(self.launcher, LocalLauncher):
            return
        from ..procs.memory import check_fits, tightest_limit
        from ..procs.quota import check_quota
        from ..units import human_bytes

        processes = getattr(self.launcher, "processes", None)
        if processes is not None and count > 1:
            from ..launchers.local import process_sizes

            n = len(process_sizes(count, processes))
            need = n * TASK_BYTES + (count - n) * SHARED_TASK_BYTES
            check_quota(count, need)  # a hub's limits on this user's tasks, in all their kernels
            binding, where = tightest_limit()
            if need > binding.available:
                fit = max(0, n + (binding.available - n * TASK_BYTES) // SHARED_TASK_BYTES)
                raise WillNotFit(
                    f"{count} tasks in {n} shared processes need about {human_bytes(need)} ({n} processes at "
                    f"{human_bytes(TASK_BYTES)} and {count - n} more tasks at {human_bytes(SHARED_TASK_BYTES)}) "
                    f"but this process's memory limit ({human_bytes(binding.bytes)}, {where}) leaves "
                    f"{human_bytes(binding.available)}: about {fit} tasks fit that way; start fewer workers"
                )
            return
        warm = self.pool.count(self.launcher) if self.use_spares else 0
        new = max(0, count - warm)  # a warm spare is a task process already: counted, and in memory
        check_quota(new, new * TASK_BYTES)
        if new:
            check_fits(new, self.pool.spare_cost() if self.use_spares else TASK_BYTES)

    def processes_for(
        self, tasks: list[TaskName], hosts: list[str], say: Progress | None = None
    ) -> tuple[dict[TaskName, TaskHandle], int]:
        """A process for each task: warm spares first, the rest spawned on ``hosts``; and how many were warm."""
        say = say or (lambda task, stage, detail: None)
        taken = self.pool.take(self.launcher, len(tasks)) if self.use_spares else []
        warm = sum(1 for p in taken if p.warm_at is not None)
        procs: dict[TaskName, TaskHandle] = {}
        fresh = []
        for task in tasks:
            if taken:
                procs[task] = proc = taken.pop(0)
                say(task, "spare", f"warm process {proc.pid}")
            else:
                fresh.append(task)
        if fresh:
            self.launcher.progress = say
            try:
                spawned = self.launcher.spawn_many(
                    [self.log_path(t) for t in fresh], [hosts[tasks.index(t)] for t in fresh]
                )
            except BaseException:
                for proc in [*procs.values(), *taken]:
                    proc.kill()
                raise
            finally:
                self.launcher.progress = None
            for task, proc in zip(fresh, spawned, strict=True):
                where = f" on {proc.destination}" if proc.destination else ""
                say(task, "spawned", f"new process {proc.pid}{where}, importing TensorFlow")
                procs[task] = proc
        for proc in taken:  # more spares than tasks: none, but never leave one behind
            proc.kill()
        return procs, warm

    def bring_up(
        self,
        procs: Mapping[TaskName, TaskHandle],
        defn: ClusterDef,
        say: Progress,
        deadline: float,
        *,
        bind_ports: Mapping[TaskName, int] | None = None,
        what: str = "the start",
    ) -> None:
        """Give each process of ``procs`` its role in ``defn`` and return once every one serves.

        A process still importing TensorFlow is given its role when it is
        ready; each task is checked from outside once it says it is up
        (:meth:`check_serving`).  Raises :class:`_PortTaken` when a server
        could not bind its port (the caller picks again) and
        :class:`~tfmagic.errors.ClusterStartError` naming the task, with its
        log's tail, for anything else; the processes are the caller's to end.
        """
        tasks = list(procs)
        spec = defn.as_dict()
        wake = threading.Event()
        subscriptions = [p.messages.subscribe(lambda msg: wake.set()) for p in procs.values()]
        assigned: set[TaskName] = set()
        up: set[TaskName] = set()
        note = waits.begin(f"{what} of cluster {self.name}", tasks, "its servers to come up", self.cluster_id)
        try:
            while len(up) < len(tasks):
                waits.update(note, [t for t in tasks if t not in up])
                wake.clear()
                for task, proc in procs.items():
                    if task not in assigned and proc.state is TaskState.SPARE:
                        proc.assign(
                            task,
                            spec,
                            env=self._task_env(task),
                            log=self.launcher.task_log(self.log_path(task)),
                            cpu_only=task.job == "ps",
                            threads=threads_for(len(defn.tasks()), 1 + len(getattr(proc, "shared_with", ()))),
                            collective=self.collective,
                            bind_port=(bind_ports or {}).get(task),
                        )
                        assigned.add(task)
                        say(task, "starting", f"server on {defn.address(task)}")
                    elif proc.state is TaskState.FAILED:
                        if "Could not start gRPC server" in (proc.failure or ""):
                            raise _PortTaken(task, proc.port)
                        raise self.failure(task, proc, f"could not start its server: {proc.failure}")
                    elif not proc.alive:
                        why = f": {proc.failure}" if proc.failure else ""
                        raise self.failure(task, proc, f"its process ended (exit code {proc.exit_code}){why}")
                    elif proc.state is TaskState.RUNNING and task not in up:
                        self.check_serving(task, proc, defn.address(task))
                        up.add(task)
                        say(task, "up", f"{defn.address(task)} (pid {proc.pid})")
                if len(up) == len(tasks):
                    break
                if time.monotonic() > deadline:
                    waiting = [t for t in tasks if t not in up]
                    first = waiting[0]
                    raise self.failure(
                        first,
                        procs[first],
                        f"was not up in time (still {procs[first].state}); waiting for {', '.join(map(str, waiting))}",
                        timed_out=True,
                    )
                wake.wait(0.1)
        finally:
            for sub in subscriptions:
                sub.close()
            waits.end(note)

    def choose_addresses(
        self, procs: Mapping[TaskName, TaskHandle], base: ClusterDef | None = None
    ) -> ClusterDef:
        """``base`` (None: an empty cluster) with an address for each of ``procs``, a free port on its host.

        Two picks on one host may return the same free port; the second is picked again.
        """
        jobs = base.as_dict() if base is not None else {}
        used = {a for addrs in jobs.values() for a in addrs}
        for task, proc in procs.items():
            address = None
            while address is None or address in used:
                try:
                    address = f"{proc.host}:{self.launcher.pick_port(proc)}"
                except (ProcessLookupError, TimeoutError) as exc:
                    if not getattr(proc, "join", lambda t: True)(5):  # its exit code, for the message
                        raise self.failure(task, proc, f"did not answer when asked for a free port ({exc})")
                    raise self.failure(
                        task, proc, f"its process ended before it could start (exit code {proc.exit_code})"
                    )
            used.add(address)
            jobs.setdefault(task.job, []).append(address)
        return ClusterDef.from_mapping(jobs)

    @staticmethod
    def ports_kept_taken(taken: _PortTaken | None) -> ClusterStartError:
        """The error of a start whose port was taken, each of three times, before its server bound it."""
        from ..procs.stats import listener_of

        holder = listener_of(taken.port) if taken is not None and taken.port else None
        return ClusterStartError(
            f"{taken.task if taken else 'a task'} could not bind its port in three attempts: each "
            f"port picked for it was taken before its server could bind it (the last, {taken.port if taken else '?'}, "
            f"{'by ' + holder if holder else 'by a process this one cannot see'}). Something on this machine "
            "takes ports fast: stop it, or try again",
            task=str(taken.task) if taken else None,
        )

    def check_serving(self, task: TaskName, proc: TaskHandle, address: str) -> None:
        """The task accepts connections at its address, and listens nowhere it should not.

        A task given a bind guard (loopback, or its spec address) reports
        where it must listen (``bind_host``); every socket it listens on must
        be there.  A planted or broken preload library would otherwise leave a
        server on every interface while ``start`` said otherwise.
        """
        from ..network.ports import port_answers

        if not port_answers(address, timeout=5):
            raise self.failure(task, proc, f"said it was up but {address} refused a connection")
        bind_host = getattr(proc, "bind_host", None)
        if not bind_host:
            return
        try:
            listening = self.launcher.listening(proc)
        except (TimeoutError, ProcessLookupError) as exc:
            raise self.failure(task, proc, f"did not say where it listens ({exc})")
        wrong = [f"{h}:{p}" for h, p in listening if not same_host(h, bind_host)]
        if wrong:
            raise self.failure(
                task,
                proc,
                f"listens on {', '.join(wrong)}, though its servers were to listen on {bind_host} only "
                "(the bind library did not take effect: a stale or planted library in the cache? see "
                "tfmagic.network.bindguard.cache_dir()); start again, or pass --all-interfaces to accept every interface",
            )

    def failure(
        self, task: TaskName, proc: TaskHandle, what: str, timed_out: bool = False
    ) -> ClusterStartError:
        """The one-line error of a task that did not come up: what happened, the fix, its log."""
        tail = proc.log_tail(15)
        msg = f"{task} (pid {proc.task_pid}) {what}. The tasks started so far were stopped."
        # what the task said is read too: a relayed task's log can reach this machine after its message
        hint = self.launcher.diagnose(proc, f"{tail}\n{what}")
        if hint:
            msg += f" To fix: {hint}."
        if timed_out:
            msg += f" Allow more time with start_timeout= (now {self.start_timeout:g} s)."
        msg += f" Its log: {proc.log_path}"
        return ClusterStartError(msg, task=task, log_tail=tail)

    # -- what the cluster is made of -------------------------------------------
    def serve(self, procs: Mapping[TaskName, TaskHandle], defn: ClusterDef) -> None:
        """These processes serve ``defn`` from now on (after a start, or processes joining)."""
        self.procs.update(procs)
        self.cluster_def = defn
        s = defn.shape()
        self.shape = ClusterShape(ps=s.ps, workers=s.workers, chief=self.shape.chief)
        for task, proc in procs.items():
            self.watch(task, proc)

    def replace(self, task: TaskName, proc: TaskHandle) -> None:
        """``proc`` now serves ``task`` (a restart): no slowdown, watched for its exit."""
        self.procs[task] = proc
        self.slowness.pop(task, None)
        self.watch(task, proc)

    def withdraw(self, tasks: list[TaskName], defn: ClusterDef) -> list[TaskHandle]:
        """Take ``tasks`` out (ended on purpose from now on) and serve ``defn``; returns their processes."""
        gone = []
        for task in tasks:
            proc = self.procs.pop(task, None)
            self.slowness.pop(task, None)
            if proc is not None:
                self.ended_on_purpose(proc)
                gone.append(proc)
        self.cluster_def = defn
        s = defn.shape()
        self.shape = ClusterShape(ps=s.ps, workers=s.workers, chief=self.shape.chief)
        return gone

    def clear(self) -> dict[TaskName, TaskHandle]:
        """Nothing serves any more (a stop); returns the processes, each marked ended on purpose."""
        procs, self.procs = self.procs, {}
        self.cluster_def = None
        for proc in procs.values():
            self.ended_on_purpose(proc)
        return procs

    def ended_on_purpose(self, proc: TaskHandle) -> None:
        """``proc``'s exit is tfmagic's doing (kill, restart, remove, stop): not reported as a loss."""
        if proc.pid is not None:
            self._killed_on_purpose.add(proc.pid)

    def was_ended_on_purpose(self, proc: TaskHandle) -> bool:
        """Whether tfmagic ended ``proc`` (its kill event says so; it is no loss to report)."""
        return proc.pid is not None and proc.pid in self._killed_on_purpose

    def watch(self, task: TaskName, proc: TaskHandle) -> None:
        """Emit ``lost`` when ``proc`` ends while it serves ``task`` and nobody ended it on purpose."""

        def on_message(msg: dict) -> None:
            if (
                msg.get("event") == Event.EXIT
                and not self.was_ended_on_purpose(proc)
                and self.procs.get(task) is proc
            ):
                self._emit("lost", task, f"process {proc.pid} ended (exit code {msg.get('code')})")

        proc.messages.subscribe(on_message)


__all__ = ["Progress", "TaskSet", "same_host", "threads_for"]
