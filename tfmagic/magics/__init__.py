"""IPython magics: a thin layer that parses, calls the plain-Python API and renders.

One ``Magics`` class per family:

* :mod:`.cluster`: ``%tf_cluster VERB`` (start, status, logs, slow, kill, restart, stop, ...);
* :mod:`.training`: ``%tf_train``, ``%tf_dashboard``;
* :mod:`.cells`: ``%%tf_device``, ``%%tf_px``;
* :mod:`.experiments`: ``%tf_experiment NAME`` (the classic experiments, checking themselves).

Bad input becomes one ``UsageError`` line saying what was wrong and what to
do, in magic syntax (:mod:`.render`); nothing here changes a running cluster
before the input is known good.  The session (:mod:`tfmagic.session`) holds
what lives between cells.
"""

from __future__ import annotations

import os
import sys

from .. import session
from ..pool import default_pool
from ..procs import owner
from .cells import CellMagics
from .cluster import ClusterMagics
from .experiments import ExperimentMagics
from .training import TrainingMagics

__all__ = ["CellMagics", "ClusterMagics", "ExperimentMagics", "TrainingMagics", "load", "unload"]

_filter = None
_FAMILIES = (ClusterMagics, TrainingMagics, CellMagics, ExperimentMagics)


def load(ipython) -> None:
    """Register the magics and keep TensorFlow's C++ log lines out of the notebook."""
    global _filter
    for magics in _FAMILIES:
        ipython.register_magics(magics)
    default_pool().reopen()
    if os.environ.get("TFMAGIC_SHOW_TF_LOGS", "") not in ("1", "true", "yes"):
        try:
            from .. import logfilter

            _filter = logfilter.install(owner.kernel_log())
        except Exception as exc:  # noqa: BLE001 - the filter is a comfort, never a blocker
            print(f"tfmagic: TensorFlow's native logs will show here ({exc})", file=sys.stderr)
    owner.runtime_dir()  # sweeps the directories of dead kernels, keeping the log of one that crashed
    for path, pid, how in owner.crashes():
        print(
            f"tfmagic: an earlier kernel of yours (pid {pid}) died of a fatal signal ({how}); its log, "
            f"with the stacks of its threads: {path}"
        )


def unload(ipython) -> None:
    """Stop the cluster and every spare this kernel started; restore stderr; take the magics away.

    IPython keeps an unloaded extension's magics unless it removes them: ``%tf_cluster start``
    after ``%unload_ext`` would start a cluster with TensorFlow's native logs in the notebook and
    nothing to end it at the next unload. Now it says the magic is not found, as before the load."""
    global _filter
    killed = session.default().close()
    _unregister(ipython)
    if _filter is not None:
        from .. import logfilter

        logfilter.uninstall()
        _filter = None
    if killed:
        print(f"tfmagic: stopped {killed} process{'es' if killed != 1 else ''}.")


def _unregister(ipython) -> None:
    """Remove the magics :func:`load` registered (IPython has no public call for it)."""
    manager = ipython.magics_manager
    for family in _FAMILIES:
        instance = manager.registry.get(family.__name__)
        if not isinstance(instance, family):
            continue
        del manager.registry[family.__name__]
        for kind, names in instance.magics.items():
            table = manager.magics.get(kind, {})
            for name in names:
                if getattr(table.get(name), "__self__", None) is instance:
                    del table[name]
