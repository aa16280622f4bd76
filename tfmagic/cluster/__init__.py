"""A cluster: a spec plus the task processes that serve it.

``Cluster`` is the plain-Python API, a facade over the parts of this package:

- :mod:`.taskset`: the task processes, the definition they serve, bringing
  them up (start, restart and membership changes share one sequence),
  watching them and ending them;
- :mod:`.membership`: tasks joining and leaving a running cluster (``add``,
  ``remove``), on the task set's public API;
- :mod:`.network`: the modelled network of one cluster (its relay, cards and links);
- :mod:`.inspection`: status, each task's condition, logs and the variable map;
- :mod:`.outcomes`: what a start did (a closed set of kinds);
- :mod:`.core`: ``Cluster`` itself and ``LocalCluster``;
- :mod:`.remote`: ``SSHCluster``, ``SparkCluster`` and ``SlurmCluster``.

Where the processes run is the launcher's business (:mod:`tfmagic.launchers`)::

    import tfmagic
    with tfmagic.LocalCluster(ps=1, workers=2) as cluster:
        cluster.connect()
        with cluster.device("ps:0"):
            w = tf.Variable(0.0)          # lives on the ps
        with cluster.device("worker:1"):
            y = w + 1.0                   # computed on worker 1

Start outcomes are data (:class:`StartOutcome` and its closed set of
kinds), failures are :class:`~tfmagic.errors.ClusterStartError` carrying the
task and the tail of its log; the session and the magics turn both into
messages in one place.  What happens to the cluster is published on
``cluster.events`` (see :mod:`tfmagic.events`): a training run, a
``%%tf_px`` cell and a dashboard follow it, and end when the cluster stops.
"""

from __future__ import annotations

from .core import Cluster, LocalCluster
from .outcomes import Attached, Launched, Replaced, Restarted, Reused, StartOutcome
from .remote import SlurmCluster, SparkCluster, SSHCluster
from .taskset import TASK_BYTES, Progress, TaskSet

__all__ = [
    "TASK_BYTES",
    "Attached",
    "Cluster",
    "Launched",
    "LocalCluster",
    "Progress",
    "Replaced",
    "Restarted",
    "Reused",
    "SSHCluster",
    "SlurmCluster",
    "SparkCluster",
    "StartOutcome",
    "TaskSet",
]
