"""Where a cluster can run, by name: the registry the session and the magics start from.

A :class:`ClusterRequest` says what is wanted (shape, backend, the backend's
options) as plain data; :func:`build` turns it into a :class:`Cluster` that
has not started yet, after checking everything that can be checked without
starting a process (the ssh client and its hosts, pyspark and Java, the
master's form).  That split is what lets ``start --replace`` refuse a bad
request before it stops the running cluster.

New backends register themselves with :func:`register`; nothing else has to
know them.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from .cluster import Cluster, LocalCluster, SparkCluster, SSHCluster
from .errors import BadClusterShape, ClusterStartError
from .spec import ClusterShape


@dataclass(frozen=True)
class ClusterRequest:
    """A cluster as asked for: ``ClusterRequest(ps=1, workers=2, backend="ssh", hosts=("a", "b"))``."""

    ps: int = 1
    workers: int = 2
    backend: str = "local"
    collective: bool = False
    gpus: tuple[str, ...] = ()
    spares: bool = True
    loopback_only: bool = True
    timeout: float | None = None
    hosts: tuple[str, ...] = ()
    python: str | None = None
    ssh_config: str | None = None
    tunnel: bool = False
    master: str | None = None
    #: Slurm: ``sbatch --partition``, ``--time``, ``--account`` and more options
    partition: str | None = None
    walltime: str | None = None
    account: str | None = None
    sbatch: tuple[str, ...] = ()
    worker_sbatch: tuple[str, ...] = ()
    pace: str | float | None = None
    #: the spread of a paced step's time (its log standard deviation: 0.1 is about +-10 %)
    jitter: float | None = None
    net: str | None = None
    #: tasks spread over this many processes (or ``"auto"``); ``None``: a process each
    processes: int | str | None = None
    extra: dict = field(default_factory=dict, compare=False)

    @property
    def shape(self) -> ClusterShape:
        return ClusterShape(ps=self.ps, workers=self.workers)

    def placement(self) -> tuple:
        """What :meth:`~tfmagic.launchers.base.Launcher.placement` of the built cluster will say."""
        return backend(self.backend).placement(self)

    def paced(self):
        """The pace asked for, with its jitter (a :class:`~tfmagic.pace.Pace`), or as given."""
        if not self.jitter or self.pace is None:
            return self.pace
        from .pace import Pace

        return Pace.parse(self.pace, jitter=float(self.jitter))

    def common(self) -> dict:
        gpus = list(self.gpus) or None
        return dict(
            worker_gpus=(gpus[0] if gpus and len(gpus) == 1 else gpus),
            collective=self.collective,
            pace=self.paced(),
            **({"net": self.net} if self.net else {}),
            **({"start_timeout": self.timeout} if self.timeout else {}),
            **self.extra,
        )


@dataclass(frozen=True)
class Backend:
    """One place tasks can run: its options, how to build a cluster there, what identifies it."""

    name: str
    help: str
    options: tuple[str, ...]
    make: Callable[[ClusterRequest], Cluster]
    placement: Callable[[ClusterRequest], tuple]


BACKENDS: dict[str, Backend] = {}


def register(backend: Backend) -> Backend:
    BACKENDS[backend.name] = backend
    return backend


def _processes(request: ClusterRequest) -> int | str | None:
    from .launchers.local import check_processes

    return check_processes(request.processes, request.shape.size)


def _ssh_hosts(request: ClusterRequest) -> tuple[str, ...]:
    return tuple(h.strip() for h in request.hosts if h.strip())


def _spark_master(request: ClusterRequest) -> str:
    return request.master or f"local[{request.shape.size}]"


_MASTER = re.compile(r"^(local(\[(\*|[0-9]+)(,[0-9]+)?\])?|spark://[^\s/]+|yarn|k8s://\S+)$", re.ASCII)


def _make_spark(request: ClusterRequest) -> Cluster:
    master = _spark_master(request)
    if not _MASTER.match(master):
        raise ClusterStartError(
            f"{master!r} is not a Spark master; use local[N], spark://HOST:PORT, yarn or k8s://URL"
        )
    from .launchers import spark

    spark._import_pyspark()
    spark._check_java()
    return SparkCluster(master=master, ps=request.ps, workers=request.workers, **request.common())


def _make_slurm(request: ClusterRequest) -> Cluster:
    import sys

    from .cluster import SlurmCluster

    return SlurmCluster(
        ps=request.ps,
        workers=request.workers,
        partition=request.partition,
        time=request.walltime,
        account=request.account,
        sbatch=request.sbatch,
        worker_sbatch=request.worker_sbatch,
        python=request.python or sys.executable,
        **request.common(),
    )


def _make_ssh(request: ClusterRequest) -> Cluster:
    hosts = _ssh_hosts(request)
    if not hosts:
        raise BadClusterShape(
            "the ssh backend needs hosts, e.g. hosts=['node1', 'node2'] (names your ssh knows)"
        )
    return SSHCluster(
        list(hosts),
        ps=request.ps,
        workers=request.workers,
        python=request.python or "python3",
        ssh_config=request.ssh_config,
        tunnel=request.tunnel,
        **request.common(),
    )


register(
    Backend(
        "local",
        "task processes on this machine",
        ("spares", "loopback_only", "processes"),
        lambda r: LocalCluster(
            ps=r.ps,
            workers=r.workers,
            spares=r.spares,
            loopback_only=r.loopback_only,
            processes=r.processes,
            **r.common(),
        ),
        lambda r: ("local", _processes(r)),
    )
)
register(
    Backend(
        "ssh",
        "task processes on SSH hosts, placed round-robin",
        ("hosts", "python", "ssh_config", "tunnel"),
        _make_ssh,
        lambda r: ("ssh", _ssh_hosts(r)),
    )
)
register(
    Backend(
        "slurm",
        "task processes as one Slurm job (sbatch), dialling back to this process",
        ("partition", "walltime", "account", "sbatch", "worker_sbatch", "python"),
        _make_slurm,
        lambda r: ("slurm", r.partition),
    )
)
register(
    Backend(
        "spark",
        "task processes as one Spark barrier job",
        ("master",),
        _make_spark,
        lambda r: ("spark", _spark_master(r)),
    )
)


def backend(name: str) -> Backend:
    """The registered backend ``name``, or one line naming those there are."""
    found = BACKENDS.get(name)
    if found is None:
        raise BadClusterShape(f"unknown backend {name!r}; use one of {', '.join(BACKENDS)}")
    return found


def build(request: ClusterRequest) -> Cluster:
    """A cluster for ``request``, checked but not started (raises what can be known now)."""
    return check(request).make(request)


def check(request: ClusterRequest) -> Backend:
    """Everything about ``request`` that can be checked without a process or a host: its backend,
    options, shape, pace and network (one line each). Returns the backend that will build it."""
    chosen = backend(request.backend)
    given = {
        name
        for name in (
            "hosts",
            "python",
            "ssh_config",
            "tunnel",
            "master",
            "processes",
            "partition",
            "walltime",
            "account",
            "sbatch",
            "worker_sbatch",
        )
        if getattr(request, name) not in ((), None, False)
    }
    foreign = sorted(given - set(chosen.options))
    if foreign:
        owners = sorted({b.name for b in BACKENDS.values() for o in foreign if o in b.options})
        raise BadClusterShape(
            f"{', '.join(foreign)} {'is' if len(foreign) == 1 else 'are'} for the {' or '.join(owners)} backend"
        )
    if request.jitter is not None and request.pace is None:
        raise BadClusterShape(
            "--jitter spreads a paced step's time: give --pace too (--pace 400ms --jitter 0.1)"
        )
    if request.pace is not None:
        request.paced()  # one line now, not after the old cluster stopped
    if request.net:
        from .network.shaper import parse_net

        parse_net(request.net)  # one line now, not after the old cluster stopped
        if request.backend == "ssh":
            raise BadClusterShape(
                "a modelled network (--net) needs a relay on this machine that the tasks reach directly, "
                "and ssh tasks reach it through tunnels or not at all; use a local, Slurm or Spark cluster"
            )
    if request.collective and request.ps:
        raise BadClusterShape("collective mode (all-reduce) has no parameter servers; use ps=0")
    if request.gpus and len(request.gpus) not in (1, request.workers):
        raise BadClusterShape(
            f"{len(request.gpus)} GPU entries for {request.workers} workers; give one per worker, or one for all"
        )
    request.shape  # noqa: B018 - raises BadClusterShape for counts that make no cluster
    if request.processes is not None:
        _processes(request)  # one line for a count no start can use
        if request.collective or request.gpus:
            raise BadClusterShape(
                "tasks sharing processes (processes=) run on CPU and serve a parameter-server cluster: "
                "--collective and --gpus need a process per task"
            )
    if chosen.name == "slurm":
        from .launchers.slurm import check_sbatch_args, check_time, slurm_command

        slurm_command("sbatch")
        check_time(request.walltime)
        check_sbatch_args(request.sbatch)
        check_sbatch_args(request.worker_sbatch)
    if chosen.name == "ssh" and _ssh_hosts(request):
        from .launchers.ssh import check_hosts

        check_hosts(_ssh_hosts(request), request.ssh_config)
    return chosen
