"""What every export starts from: the tasks per job, and what each job's tasks do.

Slurm and Kubernetes place tasks differently, but both need the same two
answers, so they are worked out once here: how many tasks each job has (the
only part of a cluster description that means anything on another engine) and
the role the launcher plays in each job's tasks under the chosen strategy.
"""

from __future__ import annotations

from collections.abc import Mapping

from ..errors import ExportError
from ..spec import ClusterDef, ClusterShape

#: How the program uses the cluster, which decides what each task's launcher does.
#:
#: ``between-graph``: ps tasks serve; every worker (and chief) starts its server
#: and runs the program in the same process (TF1 replication, as in tfmagic's
#: own training).  ``parameter-server``: TF2 ``ParameterServerStrategy``; ps and
#: workers serve, the chief (required) runs the program as coordinator.
#: ``collective``: ``MultiWorkerMirroredStrategy``, no ps; every task runs the
#: program, whose strategy starts the server.  ``custom``: every task, ps
#: included, runs the program, which starts its own server from ``TF_CONFIG``.
STRATEGIES = ("between-graph", "parameter-server", "collective", "custom")

#: The jobs an export knows, in the order it lists them.
JOBS = ("chief", "ps", "worker")

ClusterLike = ClusterShape | ClusterDef | Mapping[str, int]


def job_counts(cluster: ClusterLike) -> dict[str, int]:
    """Tasks per job, in the order ``chief, ps, worker``, without empty jobs.

    The export needs only the shape: addresses in a ``ClusterDef`` belong to
    this machine and mean nothing on another engine.

    >>> job_counts({"worker": 2, "ps": 1})
    {'ps': 1, 'worker': 2}
    """
    if isinstance(cluster, ClusterShape):
        return cluster.counts()
    if isinstance(cluster, ClusterDef):
        counts = {job: len(addrs) for job, addrs in cluster.jobs.items()}
    elif isinstance(cluster, Mapping):
        counts = dict(cluster)
    else:
        raise ExportError(
            f"export needs a ClusterShape, a ClusterDef or a {{job: count}} mapping, not {cluster!r}; "
            "for example ClusterShape(ps=1, workers=2)"
        )
    unknown = sorted(set(counts) - set(JOBS))
    if unknown:
        raise ExportError(
            f"cannot export job(s) {', '.join(map(repr, unknown))}: the export knows the jobs "
            "chief, ps and worker; rename or drop the others"
        )
    shape = ClusterShape(
        ps=counts.get("ps", 0), workers=counts.get("worker", 0), chief=counts.get("chief", 0)
    )
    return shape.counts()


def roles(counts: Mapping[str, int], strategy: str = "between-graph") -> dict[str, str]:
    """What the launcher does in each job's tasks: ``serve``, ``serve+run`` or ``run``.

    >>> roles({"ps": 1, "worker": 2})
    {'ps': 'serve', 'worker': 'serve+run'}
    """
    if strategy not in STRATEGIES:
        raise ExportError(f"strategy {strategy!r} is not one of {', '.join(STRATEGIES)}")
    if strategy == "parameter-server":
        if not counts.get("chief") or not counts.get("ps"):
            raise ExportError(
                "strategy 'parameter-server' (TF2 ParameterServerStrategy) needs a chief to coordinate "
                "and at least one ps; add chief=1 and ps=1 or more, or use strategy='between-graph'"
            )
        table = {"chief": "run", "ps": "serve", "worker": "serve"}
    elif strategy == "collective":
        if counts.get("ps"):
            raise ExportError(
                "strategy 'collective' (MultiWorkerMirroredStrategy) has no parameter servers; "
                "use ps=0, or strategy='between-graph' or 'parameter-server'"
            )
        table = {"chief": "run", "worker": "run"}
    elif strategy == "custom":
        table = dict.fromkeys(JOBS, "run")
    else:
        table = {"chief": "serve+run", "ps": "serve", "worker": "serve+run"}
    return {job: table[job] for job in counts}


def role_args(counts: Mapping[str, int], strategy: str) -> list[str]:
    """The launcher's ``--role JOB=ROLE`` options for ``counts`` under ``strategy``.

    >>> role_args({"ps": 1, "worker": 2}, "between-graph")
    ['--role', 'ps=serve', '--role', 'worker=serve+run']
    """
    out = []
    for job, role in roles(counts, strategy).items():
        out += ["--role", f"{job}={role}"]
    return out


def describe(counts: Mapping[str, int]) -> str:
    """``{'ps': 1, 'worker': 2}`` as the headers of exported files say it: ``1 ps, 2 workers``."""
    return ", ".join(f"{n} {job}" + ("s" if job == "worker" and n != 1 else "") for job, n in counts.items())
