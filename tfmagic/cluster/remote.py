"""Clusters whose tasks run elsewhere: on SSH hosts, as a Spark job, as a Slurm job.

Each is a :class:`~tfmagic.cluster.core.Cluster` with another launcher, made by a function that
reads as a class (as dask's ``SSHCluster`` does): the launcher's own options go to the launcher,
the rest to the cluster.  Tasks sharing processes (``processes=``) are for local clusters only.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

from ..errors import BadArgument
from .core import Cluster


def _one_process_a_task(kwargs: dict, where: str) -> None:
    if kwargs.pop("processes", None) is not None:
        raise BadArgument(
            f"processes= (tasks sharing a process) works on local clusters only: on {where} each task "
            "is a process of its own; leave processes= out, or use LocalCluster"
        )


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
    from ..launchers.ssh import SSHLauncher

    _one_process_a_task(kwargs, "SSH hosts")
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
    from ..launchers.spark import SparkLauncher

    _one_process_a_task(kwargs, "Spark")
    names = ("app_name", "conf", "python", "spark", "guard", "connect_timeout")
    launcher_kwargs = {k: kwargs.pop(k) for k in names if k in kwargs}
    launcher = SparkLauncher(master, **launcher_kwargs)
    return Cluster(ps, workers, launcher=launcher, spares=False, **kwargs)


def SlurmCluster(ps: int = 1, workers: int = 2, **kwargs) -> Cluster:  # noqa: N802
    """A cluster whose tasks run as one Slurm job (see :mod:`tfmagic.launchers.slurm`).

    Keyword arguments of :class:`~tfmagic.launchers.slurm.SlurmLauncher` (``partition``,
    ``time``, ``account``, ``sbatch``, ``worker_sbatch``, ``cpus_per_task``, ``python``,
    ``address``, ``guard``, ``connect_timeout``) go to the launcher; the rest (``env``, ``start_timeout``, ``name``, ...)
    to :class:`Cluster`.  ``start_timeout`` also bounds how long the job may wait in the queue.
    Stopping the cluster ends the job; so does the kernel's death.

    >>> cluster = SlurmCluster(ps=1, workers=4, partition="debug", time="1:00:00",
    ...                        worker_sbatch=["--gpus-per-task=1"])  # doctest: +SKIP
    >>> cluster.start()                                          # doctest: +SKIP
    """
    from ..launchers.slurm import SlurmLauncher

    _one_process_a_task(kwargs, "Slurm")
    names = (
        "partition",
        "time",
        "account",
        "sbatch",
        "worker_sbatch",
        "cpus_per_task",
        "python",
        "address",
        "guard",
        "connect_timeout",
    )
    launcher_kwargs = {k: kwargs.pop(k) for k in names if k in kwargs}
    if "start_timeout" in kwargs and "connect_timeout" not in launcher_kwargs:
        launcher_kwargs["connect_timeout"] = kwargs["start_timeout"]
    launcher = SlurmLauncher(**launcher_kwargs)
    return Cluster(ps, workers, launcher=launcher, spares=False, **kwargs)
