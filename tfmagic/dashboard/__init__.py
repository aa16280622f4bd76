"""A live dashboard in the notebook: per-worker throughput, convergence, the cluster.

The package, by job (as TensorBoard keeps its lifecycle apart from its display):

- :mod:`.widget`: :class:`Dashboard`, the public object: what it watches, the
  refresh thread and its share of the kernel's time, the widgets and display;
- :mod:`.frame`: the matplotlib picture, made once and redrawn in part (the
  redraw cache and the axis limits);
- :mod:`.panels`: the five plots, one class each (throughput, the two losses,
  the Gantt strip, staleness) and the events drawn over them;
- :mod:`.panes`: the HTML around the picture: each run's state, the hang
  doctor's banner, the task table (from the cluster's own status rows) and
  traffic.

What the runs recorded, in the shape the plots want (traces, rolling rates,
Gantt windows), is :mod:`tfmagic.dashdata`, which the static pictures of
:mod:`tfmagic.plots` read too.
"""

from __future__ import annotations

from .panels import MARK_COLORS, MODE_COLORS
from .widget import BUDGET, Dashboard

__all__ = ["BUDGET", "MARK_COLORS", "MODE_COLORS", "Dashboard"]
