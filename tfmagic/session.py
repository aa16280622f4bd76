"""A session: the cluster you work with now, the last run, the latest dashboard.

What a notebook needs between cells (which cluster is current, whether a
start reuses it, replaces it or must be refused, what ran last) lives here,
in plain Python, so a script gets exactly what the magics get::

    from tfmagic.session import Session, ClusterRequest
    session = Session()
    cluster, outcome = session.start(ClusterRequest(ps=1, workers=2))   # Launched
    cluster, outcome = session.start(ClusterRequest(ps=1, workers=2))   # Reused: same shape and placement
    session.start(ClusterRequest(workers=3))                           # raises ClusterRunning
    session.start(ClusterRequest(workers=3), replace=True)             # Replaced
    session.close()                                                    # stops everything it started

The magics use the process's :func:`default` session.  Start outcomes are
the closed set in :mod:`tfmagic.cluster` (``Launched``, ``Reused``,
``Replaced``, ``Restarted``, ``Attached``); failures are exceptions that say
what to do.
"""

from __future__ import annotations

import threading
import time
from typing import Any

from . import events, publish
from .backends import ClusterRequest, build
from .cluster import Cluster, Progress, Replaced, Reused, StartOutcome
from .errors import ClusterRunning, ClusterStartError, NoCluster

__all__ = ["ClusterRequest", "Session", "current_cluster", "default"]


class Session:
    """The current cluster, the last run and the latest dashboard of one kernel or script."""

    def __init__(self) -> None:
        self._lock = threading.RLock()
        self.cluster: Cluster | None = None
        self.dashboard: Any = None

    @property
    def last_run(self) -> Any:
        """The run, comparison or ``%%tf_px`` cell started last in this process (None before any)."""
        return next(iter(events.started), None)

    # -- clusters ------------------------------------------------------------
    def running(self) -> Cluster | None:
        """The current cluster if it runs, else None."""
        cluster = self.cluster
        return cluster if cluster is not None and cluster.running else None

    def need_cluster(self) -> Cluster:
        cluster = self.running()
        if cluster is None:
            raise NoCluster("no cluster is running; start one first (tfmagic.LocalCluster(...).start())")
        return cluster

    def start(
        self, request: ClusterRequest, *, replace: bool = False, progress: Progress | None = None
    ) -> tuple[Cluster, StartOutcome]:
        """Start the cluster ``request`` asks for, reuse the running one, or refuse.

        The same shape and placement reuses the running cluster; another one
        raises :class:`~tfmagic.errors.ClusterRunning` unless ``replace``.  A
        replacement is built and checked first (everything that can fail
        without starting a process), and only then is the old cluster
        stopped and the new one started: a bad request leaves the running
        cluster as it was.  Starts are serialized: a second start waits for
        the first and then sees its cluster.
        """
        with self._lock:
            running = self.running()
            if running is not None:
                same = self.reusable(request)
                if same and not replace:
                    outcome = Reused(age_s=time.time() - (running.started_at or time.time()))
                    if request.pace is not None or running.pace is not None:
                        from .pace import Pace

                        wanted = Pace.parse(request.paced())
                        if (wanted and wanted.asked) != (running.pace and running.pace.asked):
                            running.pace = wanted  # a pace needs no process: the same tasks, a new model
                            outcome.notes.append(
                                f"pace now {wanted.describe() if wanted else 'off (real speed)'}"
                            )
                    return running, outcome
                if not replace:
                    what = "shape" if running.shape != request.shape else "placement"
                    raise ClusterRunning(
                        f"a cluster of another {what} is running ({running.describe()}); stop it first "
                        "(session.stop()) or replace it (replace=True)",
                        running=running,
                        what=what,
                    )
            cluster = build(request)  # raises before anything is stopped
            old = running.describe() if running is not None else ""
            if running is not None:
                running.replaced_by = cluster.name
                running.stop("the cluster was replaced")
            try:
                outcome = cluster.start(progress=progress)
            except ClusterStartError as exc:
                if running is not None:
                    exc.args = (f"{exc.args[0]} (the cluster it was to replace, {old}, was stopped)",)
                raise
            self.cluster = cluster
            publish.announce(cluster)  # the server's pages (<base_url>tfmagic/), if a server started us
            if running is not None:
                outcome = Replaced(
                    **{k: getattr(outcome, k) for k in ("seconds", "warm", "cold", "attempts")}, replaced=old
                )
            return cluster, outcome

    def reusable(self, request: ClusterRequest) -> bool:
        """Whether a start of ``request`` would reuse the running cluster (same shape and placement)."""
        running = self.running()
        return (
            running is not None
            and running.shape == request.shape
            and running.launcher.placement() == request.placement()
            and running.collective == request.collective
        )

    def adopt(self, cluster: Cluster) -> Cluster:
        """Make an already started (or attached) cluster the current one; refuses while another runs."""
        with self._lock:
            running = self.running()
            if running is not None and running is not cluster:
                raise ClusterRunning(
                    f"a cluster is running ({running.describe()}); stop it first (%tf_cluster stop), then attach"
                )
            self.cluster = cluster
            publish.announce(cluster)
            return cluster

    def stop(self) -> Cluster:
        """Stop the current cluster (what runs on it ends, saying so); returns it."""
        with self._lock:
            cluster = self.running()
            if cluster is None:
                raise NoCluster("no cluster is running, so there is nothing to stop")
            cluster.stop()
            return cluster  # stays current: its status says "not running", its events stay readable

    def close(self) -> int:
        """Stop the current cluster, every spare and every process this session's process started."""
        from .pool import default_pool
        from .procs import owner

        with self._lock:
            killed = len(owner.processes())
            if self.cluster is not None:
                self.cluster.close()
                self.cluster = None
            if self.dashboard is not None:
                self.dashboard.stop()
            default_pool().shutdown()
            owner.kill_all()
            return killed


_default: Session | None = None
_default_lock = threading.Lock()


def default() -> Session:
    """The session the magics use (one per process)."""
    global _default
    with _default_lock:
        if _default is None:
            _default = Session()
        return _default


def current_cluster() -> Cluster | None:
    """The cluster the magics manage (started with ``%tf_cluster start``), or None."""
    return default().cluster
