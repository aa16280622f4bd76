"""``SparkLauncher``: the launcher contract on Spark, composed of the application, the relay and the jobs.

* :class:`~.context.Application`: the SparkContext (and Spark's JVM) the tasks run in;
* :class:`~.relay.Relay`: the authenticated listener the relays connect back to;
* :class:`~.jobs.Jobs`: the Spark jobs and the task slots they serve.

The launcher turns the contract's calls into those parts' calls: a start is
one barrier job (:meth:`SparkLauncher.spawn_many`), a restart a one-task job
(:meth:`SparkLauncher.spawn`), and each task is a
:class:`~tfmagic.launchers.channel.TaskProcess` over its relayed control
connection.
"""

from __future__ import annotations

import functools
import socket
import sys
from typing import Any

from ...errors import ClusterStartError
from .. import spark_task
from ..channel import TaskProcess
from ..relayed import RelayedLauncher
from .context import Application, SharedContext, is_loopback_master, local_slots
from .jobs import Batch, Jobs
from .relay import Relay


class SparkLauncher(RelayedLauncher):
    """Runs each task as a Spark task: the cluster is one barrier job of a Spark application.

    Parameters
    ----------
    master:
        A Spark master URL: ``local[N]`` (N at least the number of tasks),
        ``spark://HOST:PORT`` (standalone), or what your Spark supports.
    app_name:
        The application's name in the Spark UI.
    conf:
        More Spark settings (``{"spark.executor.memory": "4g"}``); they win
        over tfmagic's defaults.
    python:
        The Python the executors run (``spark.pyspark.python``); it must have
        TensorFlow and tfmagic installed, and the same minor version as this
        one.  This interpreter by default.
    spark:
        A ``SparkSession`` or ``SparkContext`` you already have: it is used
        instead of a new one, and left running at the end.
    env:
        Extra environment for every task process.
    guard:
        Keep each TensorFlow server on the one address its spec names (built
        on its own host; see :mod:`tfmagic.network.bindguard`).
    connect_timeout:
        Seconds Spark may take to start the tasks and their relays to connect.

    >>> launcher = SparkLauncher("spark://head:7077", python="/opt/venv/bin/python")  # doctest: +SKIP
    >>> cluster = tfmagic.Cluster(ps=1, workers=2, launcher=launcher)                 # doctest: +SKIP
    """

    name = "spark"
    where_tasks_run = "Spark executor host"

    def __init__(
        self,
        master: str = "local[3]",
        *,
        app_name: str = "tfmagic",
        conf: dict[str, Any] | None = None,
        python: str = sys.executable,
        spark: Any = None,
        env: dict[str, str | None] | None = None,
        guard: bool = True,
        connect_timeout: float = 180.0,
    ) -> None:
        given = getattr(spark, "sparkContext", spark)
        if given is not None:
            master = given.master
        self.master = master
        self.app_name = app_name
        self.python = python
        self.user_conf = {str(k): str(v) for k, v in (conf or {}).items()}
        self.extra_env = dict(env or {})
        self.guard = guard
        self.connect_timeout = connect_timeout
        self.loopback = is_loopback_master(master)
        self.app = Application(
            master, app_name, {"spark.pyspark.python": python, **self.user_conf}, self.loopback, given
        )
        self.jobs = Jobs()
        self.relay = Relay(self.jobs.claim, self._bind_address)
        self._client_address: str | None = None

    # -- the parts, by the names tests and older code use ---------------------------------
    @property
    def _ctx(self) -> SharedContext | None:
        return self.app.current

    @property
    def _given(self) -> Any:
        return self.app.given

    def _listen(self) -> tuple[str, int]:
        """Open the relay listener (if it is not open): the address the relays connect to."""
        return self.host, self.relay.listen()

    # -- placement ------------------------------------------------------------------------
    @property
    def host(self) -> str:  # type: ignore[override]
        """The address the relays connect back to (this process, the Spark driver)."""
        if self.loopback:
            return "127.0.0.1"
        return self.app.driver_host or socket.gethostname()

    @property
    def where_key(self) -> str:
        return self.master

    def running_as(self) -> str:
        return f"Spark tasks ({self.master})"

    def describe(self) -> str:
        return f" on Spark {self.master}"

    def _bind_address(self) -> str:
        """Where the listener binds: loopback for local masters, else the driver's own address."""
        if self.loopback:
            return "127.0.0.1"
        try:
            return socket.gethostbyname(self.host)
        except OSError:
            return ""

    # -- Spark ------------------------------------------------------------------------------
    @property
    def context(self):
        """The SparkContext the tasks run in (created on first use)."""
        return self.app.get().sc

    @property
    def ui_url(self) -> str | None:
        """The Spark UI of the application (``None`` before it starts)."""
        return self.app.ui_url

    def _relay_config(self, batch: Batch) -> dict[str, Any]:
        """What each relay of ``batch`` gets inside the Spark closure (never on a command line)."""
        host, port = self._listen()
        return self.relay_config(batch, host, port)

    def _start(self, log_paths: list[str], barrier: bool) -> Batch:
        """Submit a job for ``log_paths`` and return once every task process runs."""
        ctx = self.app.get()
        batch = self.jobs.new_batch(log_paths, barrier)
        config = self._relay_config(batch)
        from pyspark import cloudpickle

        cloudpickle.register_pickle_by_value(spark_task)
        self.jobs.submit(ctx, batch, functools.partial(spark_task.relay_partition, config), self.master)
        relay_address = f"{self.host}:{self.relay.port or '?'}"
        problem = self.jobs.wait_started(batch, self.connect_timeout, relay_address, self.ui_url)
        if problem is not None:
            self.jobs.abandon(batch, self.cancel)
            raise ClusterStartError(
                f"{problem}. {self._hint(len(batch.slots), problem)}".strip(),
                log_tail=self.app.driver_log_tail(),
            )
        return batch

    def _hint(self, n: int, problem: str) -> str:
        if "task slots" in problem:
            return (
                f"A barrier job needs {n} free task slots at once: give the master that many cores "
                f"(local[{n}], or --cores on the workers)."
            )
        if "ended before every relay connected" in problem:
            return (
                "The executors must reach this process at the address above (firewall? "
                "set spark.driver.host to an address they can reach)."
            )
        if "shut down" in problem and self.master.startswith("spark://"):
            return f"Check that the Spark master {self.master} is running and has live workers."
        return ""

    # -- the contract ---------------------------------------------------------------------
    def spawn_many(self, log_paths: list[str], hosts: list[str]) -> list[TaskProcess]:
        """One barrier job with a Spark task per log path; returns when every task process runs."""
        if not log_paths:
            return []
        slots = local_slots(self.master)
        if slots is not None and slots < len(log_paths):
            raise ClusterStartError(
                f"{self.master} has {slots} task slot{'s' if slots != 1 else ''} and a barrier job with "
                f"{len(log_paths)} tasks needs {len(log_paths)} at once: use master='local[{len(log_paths)}]'"
            )
        batch = self._start(log_paths, barrier=True)
        return [self._process(slot) for slot in batch.slots]

    def spawn(self, log_path: str, host: str | None = None) -> TaskProcess:
        """One task again (a restart): a Spark stage cannot grow, so it is a job of its own.

        The new task must land on ``host`` (the old task's address: the rest
        of the cluster knows it by that address), and Python cannot pin a
        Spark task to a host, so a task placed elsewhere is ended and you are
        told to start the whole cluster again.
        """
        batch = self._start([log_path], barrier=False)
        return self._restarted(
            batch,
            host,
            " (a Spark task cannot be pinned to a host from Python); stop the cluster and start it again",
        )

    def cancel(self, batch: Batch) -> None:
        """Cancel ``batch``'s Spark job group (Spark kills its relays)."""
        ctx = self.app.current
        if ctx is not None:
            ctx.sc.cancelJobGroup(batch.group)

    def close(self) -> None:
        """Cancel this launcher's Spark jobs; stop the Spark application if this launcher made it."""
        ctx = self.app.detach()
        self.jobs.close(lambda batch: ctx.sc.cancelJobGroup(batch.group) if ctx is not None else None)
        self.relay.close()
        self.app.let_go(ctx)

    def client_address(self, defn) -> str | None:
        """Where the tasks reach this process as a client: ``None`` (TF's ``localhost``) when
        every executor shares this machine, else this machine's address the relays connected
        to, with this process's client port."""
        if self.loopback:
            return None
        if self._client_address is None:
            from ... import client

            local = next(
                (
                    s.control.getsockname()[0]
                    for s in list(self.jobs.by_pid.values())
                    if s.control is not None
                ),
                self._bind_address() or self.host,
            )
            self._client_address = f"{local}:{client.client_port()}"
        return self._client_address
