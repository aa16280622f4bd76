"""Attach to a cluster that something else started (by hand, Slurm, Kubernetes...).

The notebook then is the client of those servers: ``%%tf_device``,
``tfmagic.train`` and the dashboard work as on a cluster tfmagic started.
What tfmagic did not start it does not stop, slow, kill or restart: ``stop()``
only lets go of the cluster (detaches) and says so, and the other three say
why they cannot and what to do instead.

The cluster is given as a ClusterSpec in any of the forms people have at hand::

    tfmagic.attach({"ps": ["10.0.0.1:2222"], "worker": ["10.0.0.2:2222", "10.0.0.3:2222"]})
    tfmagic.attach('{"cluster": {...}, "task": {"type": "worker", "index": 0}}')  # a TF_CONFIG
    tfmagic.attach("cluster.json")                                                 # a file of either
    tfmagic.attach(tf.train.ClusterSpec(...))

A task is "alive" while its port accepts connections (checked at most once a
second): that is all tfmagic can know of a process it does not own.
"""

from __future__ import annotations

import json
import os
import socket
import time
from pathlib import Path
from typing import Any

from . import client
from .cluster import Cluster, StartOutcome
from .errors import ClusterStartError, NotOwned
from .launchers.base import Launcher, TaskState
from .spec import ClusterDef, ClusterShape, TaskName

#: Jobs a cluster to attach to may have.
JOBS = ("chief", "ps", "worker")


def parse_spec(spec: Any) -> ClusterDef:
    """A :class:`ClusterDef` from a mapping, JSON text, a file, a TF_CONFIG or a ``tf.train.ClusterSpec``."""
    value = spec
    if hasattr(value, "as_dict") and callable(value.as_dict):  # tf.train.ClusterSpec
        value = value.as_dict()
    if isinstance(value, (str, os.PathLike)):
        text = os.fspath(value).strip()
        if not text.startswith("{"):
            path = Path(text).expanduser()
            if not path.is_file():
                raise ClusterStartError(
                    f"{text!r} is neither JSON nor a file; give a ClusterSpec such as "
                    '\'{"ps": ["host:2222"], "worker": ["host:2223"]}\', a TF_CONFIG, or a path to one'
                )
            text = path.read_text()
        try:
            value = json.loads(text)
        except ValueError as exc:
            raise ClusterStartError(
                f"the cluster description is not valid JSON ({exc}); check its quoting"
            ) from None
    if not isinstance(value, dict):
        raise ClusterStartError(
            f"a cluster description is a mapping of job to addresses, not {type(value).__name__}"
        )
    if "cluster" in value and isinstance(value["cluster"], dict):  # a TF_CONFIG
        value = value["cluster"]
    jobs = {}
    for job, addrs in value.items():
        if job not in JOBS:
            raise ClusterStartError(
                f"job {job!r} is not one tfmagic can drive; a cluster has {', '.join(JOBS)} jobs"
            )
        if isinstance(addrs, dict):  # {"0": "host:port"} as TF allows
            addrs = [addrs[k] for k in sorted(addrs, key=int)]
        if not isinstance(addrs, list) or not all(isinstance(a, str) and ":" in a for a in addrs):
            raise ClusterStartError(f"job {job!r} must list addresses as 'host:port', got {addrs!r}")
        jobs[job] = list(addrs)
    if not jobs.get("worker"):
        raise ClusterStartError(
            "the cluster has no worker task; tfmagic needs at least one worker to compute on"
        )
    return ClusterDef.from_mapping(jobs)


class AttachedTask:
    """A task tfmagic did not start: an address, alive while it accepts connections."""

    state = TaskState.RUNNING
    pid = task_pid = None
    exit_code = None
    failure = None
    destination = None
    bind_host = None
    task_hostname = None
    log_path = ""

    def __init__(self, address: str) -> None:
        self.address = address
        self.host = address.rsplit(":", 1)[0]
        self.listeners: list = []
        self._checked = 0.0
        self._alive = True

    @property
    def alive(self) -> bool:
        now = time.monotonic()
        if now - self._checked > 1.0:
            self._checked = now
            host, port = self.address.rsplit(":", 1)
            try:
                socket.create_connection((host, int(port)), timeout=1.0).close()
                self._alive = True
            except OSError:
                self._alive = False
        return self._alive

    @property
    def label(self) -> str:
        return f"the task at {self.address}"

    def log_tail(self, lines: int = 20) -> str:
        return ""

    def request(self, op: str, **_fields):
        raise NotOwned(f"{self.label} was not started by tfmagic; it cannot be asked to {op}")

    def send(self, op: str, **_fields) -> None:
        raise NotOwned(f"{self.label} was not started by tfmagic; it cannot be asked to {op}")

    def kill(self) -> None:
        raise NotOwned(f"{self.label} was not started by tfmagic, which leaves it running")


class AttachedLauncher(Launcher):
    """Stands where a launcher would: nothing to start, nothing to kill."""

    name = "attached"
    remote = True
    spares = False

    def spawn(self, log_path: str, host: str | None = None):
        raise NotOwned("tfmagic did not start this cluster and cannot start tasks in it")

    def kill(self, proc) -> None:
        raise NotOwned(f"{proc.label} was not started by tfmagic, which leaves it running")

    def wait_exit(self, proc) -> int | None:
        return None

    def read_log(self, proc, tail: int | None = None) -> str:
        return (
            f"(tfmagic did not start {proc.label}; its log is wherever it was started, "
            "for example the terminal or the scheduler's output file)"
        )

    def stats(self, proc) -> dict | None:
        return None

    def security_note(self) -> str:
        return (
            "tfmagic did not start these servers and cannot limit who reaches them: TensorFlow servers run "
            "any graph anyone who can reach their port sends"
        )


class AttachedCluster(Cluster):
    """A running cluster tfmagic did not start; see the module docstring."""

    def __init__(self, spec: Any, *, name: str | None = None, connect_timeout: float = 10.0) -> None:
        defn = parse_spec(spec)
        jobs = defn.as_dict()
        super().__init__(
            ps=len(jobs.get("ps", [])),
            workers=len(jobs["worker"]),
            chief=len(jobs.get("chief", [])),
            name=name,
            launcher=AttachedLauncher(),
            spares=False,
            start_timeout=connect_timeout,
        )
        self.shape = ClusterShape(
            ps=len(jobs.get("ps", [])), workers=len(jobs["worker"]), chief=len(jobs.get("chief", []))
        )
        self._defn = defn

    def start(self, progress=None, timeout: float | None = None) -> StartOutcome:
        """Check that every task accepts connections, then treat the cluster as running."""
        if self.running:
            return StartOutcome("reused")
        say = progress or (lambda task, stage, detail: None)
        t0 = time.monotonic()
        deadline = t0 + (self.start_timeout if timeout is None else timeout)
        procs = {}
        for task in self._defn.tasks():
            address = self._defn.address(task)
            host, port = address.rsplit(":", 1)
            while True:
                try:
                    socket.create_connection((host, int(port)), timeout=2.0).close()
                    break
                except OSError as exc:
                    if time.monotonic() > deadline:
                        raise ClusterStartError(
                            f"{task} at {address} does not accept connections ({exc}); is that server "
                            "running, and is the address right? Nothing was changed.",
                            task=str(task),
                        ) from None
                    time.sleep(0.2)
            procs[task] = AttachedTask(address)
            say(str(task), "up", f"{address} (not started by tfmagic)")
        self.procs = procs
        self.cluster_def = self._defn
        self.started_at = time.time()
        outcome = StartOutcome("attached", seconds=time.monotonic() - t0)
        self.last_outcome = outcome
        return outcome

    def stop(self) -> None:
        """Let go of the cluster: its servers keep running (tfmagic did not start them)."""
        with self._lock:
            if not self.procs:
                from .errors import NoCluster

                raise NoCluster(f"cluster {self.name} is not attached; nothing to detach from")
            self.procs = {}
            self.cluster_def = None
            client.forget(self.id)
        self.emit("detach", "cluster", "detached; its servers keep running (tfmagic did not start them)")

    def _not_owned(self, what: str, task) -> NotOwned:
        t = self.check_task(task)
        return NotOwned(
            f"cannot {what} {t}: tfmagic did not start it (this cluster is attached). "
            f"Do it where the task was started, or start a cluster with tfmagic to {what} tasks from here"
        )

    def slow(self, task, factor: float = 4.0) -> None:
        raise self._not_owned("slow", task)

    def kill(self, task) -> None:
        raise self._not_owned("kill", task)

    def restart(self, task, timeout: float | None = None) -> StartOutcome:
        raise self._not_owned("restart", task)

    def logs(self, task, tail: int | None = 50) -> str:
        t = self.check_task(task)
        return self.launcher.read_log(self.procs[t], tail)


def attach(spec: Any, *, name: str | None = None, connect_timeout: float = 10.0) -> AttachedCluster:
    """Attach to a running cluster (see the module docstring) and return it, checked."""
    cluster = AttachedCluster(spec, name=name, connect_timeout=connect_timeout)
    cluster.start()
    return cluster


__all__ = ["AttachedCluster", "attach", "parse_spec", "TaskName"]
