"""tfmagic: start, see and teach distributed TensorFlow from one notebook.

Plain Python (works in a script)::

    import tfmagic
    with tfmagic.LocalCluster(ps=1, workers=2) as cluster:
        cluster.connect()
        ...

In IPython/Jupyter: ``%load_ext tfmagic``, then ``%tf_cluster start``.

Importing this package does not import TensorFlow; that happens when a
cluster is first used as a client.
"""

from __future__ import annotations

__version__ = "0.1.0"

from .cluster import Cluster, LocalCluster, StartOutcome, current_cluster
from .errors import (
    BadClusterShape,
    BadTaskName,
    ClusterRunning,
    ClusterStartError,
    NoCluster,
    TaskLost,
    TfmagicError,
    UnknownTask,
)
from .pool import set_spare_budget
from .spec import ClusterDef, ClusterShape, TaskName

__all__ = [
    "BadClusterShape",
    "BadTaskName",
    "Cluster",
    "ClusterDef",
    "ClusterRunning",
    "ClusterShape",
    "ClusterStartError",
    "LocalCluster",
    "NoCluster",
    "StartOutcome",
    "TaskLost",
    "TaskName",
    "TfmagicError",
    "UnknownTask",
    "current_cluster",
    "load_ipython_extension",
    "set_spare_budget",
    "unload_ipython_extension",
]


def load_ipython_extension(ipython) -> None:
    """``%load_ext tfmagic``: register the magics."""
    from .magics import load

    load(ipython)


def unload_ipython_extension(ipython) -> None:
    """``%unload_ext tfmagic``: stop every cluster and spare this kernel started."""
    from .magics import unload

    unload(ipython)
