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
import time
from pathlib import Path
from typing import Any

from . import client
from .cluster import Attached, Cluster, Reused, StartOutcome
from .errors import ClusterStartError, NoCluster, NotOwned
from .launchers.attached import AttachedLauncher, AttachedTask
from .network import ports
from .spec import ClusterDef, TaskName

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
            try:
                text = path.read_text(encoding="utf-8")
            except (UnicodeDecodeError, OSError) as exc:
                reason = (
                    "is not a text file" if isinstance(exc, UnicodeDecodeError) else f"cannot be read ({exc})"
                )
                raise ClusterStartError(
                    f"{text!r} {reason}; give a JSON ClusterSpec or TF_CONFIG file"
                ) from None
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
            bad = [
                k for k in addrs if not (isinstance(k, (str, int)) and str(k).isascii() and str(k).isdigit())
            ]
            if bad:
                raise ClusterStartError(
                    f"job {job!r} has task index {bad[0]!r}; indices are whole numbers 0, 1, ..."
                )
            addrs = [addrs[k] for k in sorted(addrs, key=int)]
        if not isinstance(addrs, list) or not all(isinstance(a, str) and ":" in a for a in addrs):
            raise ClusterStartError(f"job {job!r} must list addresses as 'host:port', got {addrs!r}")
        for a in addrs:
            port = a.rsplit(":", 1)[1]
            if not (port.isascii() and port.isdigit() and 0 < int(port) < 65536):
                raise ClusterStartError(
                    f"{a!r} in job {job!r} has no valid port ({port!r}); write addresses as 'host:2222'"
                )
        jobs[job] = list(addrs)
    if not jobs.get("worker"):
        raise ClusterStartError(
            "the cluster has no worker task; tfmagic needs at least one worker to compute on"
        )
    return ClusterDef.from_mapping(jobs)


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
        self._defn = defn

    def start(self, progress=None, timeout: float | None = None) -> StartOutcome:
        """Check that every task answers as a gRPC server, then treat the cluster as running.

        A port that accepts connections but does not answer (a stopped
        process, something else on that port) is refused here with its
        address: TensorFlow's client would wait for it for ever.
        """
        if self.running:
            return Reused(age_s=time.time() - (self.started_at or time.time()))
        say = progress or (lambda task, stage, detail: None)
        t0 = time.monotonic()
        deadline = t0 + (self.start_timeout if timeout is None else timeout)
        procs = {}
        for task in self._defn.tasks():
            address = self._defn.address(task)
            while not ports.port_answers(address, timeout=2.0):
                if time.monotonic() > deadline:
                    raise ClusterStartError(
                        f"{task} at {address} does not accept connections; is that server "
                        "running, and is the address right? Nothing was changed.",
                        task=task,
                    )
                time.sleep(0.2)
            if not ports.grpc_answers(address, timeout=max(1.0, min(5.0, deadline - time.monotonic()))):
                raise ClusterStartError(
                    f"{task} at {address} accepts connections but does not answer as a TensorFlow server "
                    "(stopped, hung, or another program on that port); check the address. Nothing was changed.",
                    task=task,
                )
            procs[task] = AttachedTask(address, task)
            say(task, "up", f"{address} (not started by tfmagic)")
        # no watching: tfmagic did not start these servers and hears nothing of their processes
        self.taskset.procs, self.taskset.cluster_def = procs, self._defn
        self.started_at = time.time()
        outcome = Attached(seconds=time.monotonic() - t0)
        self.last_outcome = outcome
        return outcome

    def stop(self, reason: str = "detached from the cluster") -> None:
        """Let go of the cluster: its servers keep running (tfmagic did not start them)."""
        with self.taskset.lock:
            if not self.procs:
                raise NoCluster(f"cluster {self.name} is not attached; nothing to detach from")
            self.emit("stopping", None, reason)
            self.taskset.clear()
            self.stopped_at = time.time()
            client.forget(self.id)
        self.emit("detach", None, "detached; its servers keep running (tfmagic did not start them)")

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

    def restart(self, task, timeout: float | None = None, force: bool = False) -> StartOutcome:
        raise self._not_owned("restart", task)

    def logs(self, task, tail: int | None = 50) -> str:
        t = self.check_task(task)
        return self.launcher.read_log(self.procs[t], tail)


def attach(spec: Any, *, name: str | None = None, connect_timeout: float = 10.0) -> AttachedCluster:
    """Attach to a running cluster (see the module docstring) and return it, checked."""
    cluster = AttachedCluster(spec, name=name, connect_timeout=connect_timeout)
    cluster.start()
    return cluster


__all__ = ["AttachedCluster", "AttachedLauncher", "AttachedTask", "attach", "parse_spec", "TaskName"]
