"""tfmagic: start, see and teach distributed TensorFlow from one notebook.

Plain Python (works in a script)::

    import tfmagic
    with tfmagic.LocalCluster(ps=1, workers=2) as cluster:
        cluster.connect()
        ...

In IPython/Jupyter: ``%load_ext tfmagic``, then ``%tf_cluster start``.

Importing this package does not import TensorFlow; that happens when a
cluster is first used as a client. It does keep Keras out of TensorFlow's own
import (:mod:`tfmagic.kerasgate`: Keras loads when first used instead).
"""

from __future__ import annotations

from . import kerasgate as _kerasgate

_kerasgate.install()

__version__ = "0.1.0"

# Names are imported on first use (PEP 562): `import tfmagic` stays cheap, and
# the task processes, which import tfmagic.task_main, load only what they need.
_EXPORTS = {
    "Cluster": "cluster",
    "LocalCluster": "cluster",
    "SSHCluster": "cluster",
    "SparkCluster": "cluster",
    "SlurmCluster": "cluster",
    "Session": "session",
    "ClusterRequest": "backends",
    "AttachedCluster": "attached",
    "attach": "attached",
    "NotOwned": "errors",
    "StartOutcome": "cluster",
    "current_cluster": "session",
    "Event": "events",
    "NeedsForce": "errors",
    "BadClusterShape": "errors",
    "BadTaskName": "errors",
    "ClusterRunning": "errors",
    "ClusterStartError": "errors",
    "NoCluster": "errors",
    "TaskLost": "errors",
    "TfmagicError": "errors",
    "UnknownTask": "errors",
    "BadArgument": "errors",
    "WaitTimedOut": "errors",
    "set_spare_budget": "pool",
    "ClusterDef": "spec",
    "ClusterShape": "spec",
    "TaskName": "spec",
    "train": "training",
    "compare": "training",
    "TrainingRun": "training",
    "TrainingError": "training",
    "KerasModel": "training",
    "History": "metrics",
    "Dashboard": "dashboard",
}


#: modules that were reachable as ``tfmagic.NAME`` before they moved into a package
_MOVED = {"owner": "procs.owner"}


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        if name in _MOVED:  # the name a module had before the packages (network, procs, doctor)
            import importlib

            return importlib.import_module(f".{_MOVED[name]}", __name__)
        if name in (
            "launchers",
            "network",
            "procs",
            "doctor",
            "pool",
            "client",
            "magics",
            "spec",
            "errors",
            "cluster",
            "training",
            "metrics",
            "export",
            "attached",
            "session",
            "events",
            "backends",
            "tensorboard",
        ):
            import importlib

            return importlib.import_module(f".{name}", __name__)
        raise AttributeError(f"module 'tfmagic' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value


__all__ = [
    "BadArgument",
    "BadClusterShape",
    "BadTaskName",
    "Cluster",
    "ClusterDef",
    "ClusterRunning",
    "ClusterShape",
    "ClusterStartError",
    "LocalCluster",
    "NoCluster",
    "NotOwned",
    "SSHCluster",
    "SparkCluster",
    "SlurmCluster",
    "AttachedCluster",
    "attach",
    "StartOutcome",
    "TaskLost",
    "TaskName",
    "TfmagicError",
    "UnknownTask",
    "WaitTimedOut",
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
