"""The classic experiments of distributed training, each checking its published claim on a real cluster.

>>> import tfmagic.experiments as ex
>>> ex.names()[:3]
['stragglers', 'backup-workers', 'staleness']
>>> result = ex.run("stragglers", seed=0)            # doctest: +SKIP
>>> result.holds, result.measured, result.why        # doctest: +SKIP

Each experiment starts real paced clusters (:mod:`tfmagic.pace`: every worker
is a modelled machine, so 4 workers on 2 cores behave like 4 machines),
trains on them, and compares what it measured with what the literature says.
The verdict (``result.holds``) is computed from the measured figures; when the
claim does not hold, ``result.why`` says which figure missed and by how much,
or which limit the run broke.

**The contract for adding one** (``ps-bottleneck``, ``elastic``, ...): write one
module here, ``tfmagic/experiments/my_thing.py``, with

* ``CLAIM = Claim(statement, source)``: the published statement and where;
* ``def measure(lab: Lab) -> Finding``: start clusters with ``lab.cluster(workers=N)``
  (a context manager: the cluster stops when the block ends), train with
  ``lab.train(cluster, mode, steps, ...)`` (seeded with ``lab.seed``; it raises
  when the machine could not keep the pace), report with ``lab.progress(text)``,
  ask ``lab.fits(tasks)`` before a phase that may not fit the memory limit (skip it
  and say so in ``notes``), and return ``Finding(measured={...},
  checks=[Check(label, value, bound, ">=", meaning)], figure=..., notes=[...])``: a
  matplotlib ``Figure`` (``base.figure()`` makes one without pyplot). The claim
  holds when every check passes and the run kept its limits.

and add one line to :data:`REGISTRY` below (name -> module). The limits bind
every experiment, old and new: at most :data:`~.base.TIME_LIMIT` seconds and
:data:`~.base.MEMORY_LIMIT` bytes (this process and its tasks, PSS) on a
2-core machine, and the claim holding in at least 9 of 10 seeds
(``python bench/fidelity.py NAME`` checks it); reuse one cluster across an
experiment's phases where you can, since each task costs time to start.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable

from ..errors import TfmagicError
from ..publish import publish_result
from .base import MEMORY_LIMIT, TIME_LIMIT, Check, Claim, Finding, Lab, Result, conclude

__all__ = [
    "MEMORY_LIMIT",
    "REGISTRY",
    "TIME_LIMIT",
    "Check",
    "Claim",
    "Finding",
    "Lab",
    "Result",
    "claim",
    "names",
    "run",
]

#: experiment name -> its module in this package (one line each; see the contract above)
REGISTRY: dict[str, str] = {
    "stragglers": "stragglers",
    "backup-workers": "backup_workers",
    "staleness": "staleness",
    "noise": "noise",
    "ssp": "ssp",
    "scaling": "scaling",
    "elastic": "elastic",
    "ps-bottleneck": "ps_bottleneck",
    "exponential-steps": "exponential_steps",
    "ps-scaling": "ps_scaling",
}


def names() -> list[str]:
    """The experiments there are, in the order a course would take them."""
    return list(REGISTRY)


def _module(name: str):
    if not isinstance(name, str) or name not in REGISTRY:
        raise TfmagicError(f"no experiment named {name!r}; the experiments are {', '.join(names())}")
    return importlib.import_module(f".{REGISTRY[name]}", __name__)


def claim(name: str) -> Claim:
    """The claim experiment ``name`` checks (without running it)."""
    return _module(name).CLAIM


def run(
    name: str,
    seed: int = 0,
    progress: Callable[[str], None] | None = None,
    memory_limit: int | float = MEMORY_LIMIT,
) -> Result:
    """Run experiment ``name`` on fresh paced clusters and return its :class:`Result`.

    ``seed`` seeds the modelled machines' jitter, the data and the initial
    weights; ``progress`` (for example ``print``) is called with a line per
    phase while it runs; ``memory_limit`` (bytes, at most the 2 GB every
    experiment keeps) is what this process and its tasks may use: a phase
    that would not fit is skipped and the result says so.  Every cluster it
    starts is stopped before it returns.
    """
    module = _module(name)
    if isinstance(seed, bool) or not isinstance(seed, int) or seed < 0:
        raise TfmagicError(f"seed must be a whole number >= 0, not {seed!r}")
    if (
        isinstance(memory_limit, bool)
        or not isinstance(memory_limit, (int, float))
        or not (0 < memory_limit <= MEMORY_LIMIT)
    ):
        raise TfmagicError(
            f"memory_limit must be bytes > 0 and at most {MEMORY_LIMIT:.0f}, not {memory_limit!r}"
        )
    result = conclude(name, module.CLAIM, seed, module.measure, progress, int(memory_limit))
    publish_result(result)  # for the server's pages: a class's table on a hub (nothing elsewhere)
    return result
