"""Static pictures of training runs (matplotlib, Agg, no pyplot).

Used by ``tfmagic demo`` (a PNG), by the notebooks, and as the fallback
wherever no widget front end is there to show the live dashboard.  Curves
are raw (every point measured); a moving mean is drawn only when asked, and
then says so in its label.
"""

from __future__ import annotations

from collections.abc import Sequence

from .dashdata import SEGMENT_KINDS, GanttTrace, StalenessCounts
from .metrics import History

COLORS = {"sync": "#1f77b4", "async": "#d62728", "ssp": "#2ca02c"}
#: the x axes every comparison is drawn against
X_AXES = {"updates": "updates", "examples": "examples seen", "seconds": "seconds after warm-up"}
SEGMENT_COLORS = {"busy": "#4c72b0", "wait": "#f2b447", "dropped": "#b0b0b0", "warm-up": "#dddddd"}
SEGMENT_LABELS = {
    "busy": "busy (computing)",
    "wait": "waiting at the barrier",
    "dropped": "dropped gradient",
    "warm-up": "warm-up",
}


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def _x(h: History, x: str, step: float, when: float) -> float | None:
    """Where an update ``step`` made at ``when`` goes on axis ``x`` (None: during warm-up)."""
    if x == "updates":
        return step
    if x == "examples":
        return step * h.examples_seen() / max(h.steps, 1)
    since = when - (h.warmup_ended_at or h.started_at)
    return since if since >= 0 else None


def held_out_curve(h: History, x: str = "updates") -> tuple[list[float], list[float]]:
    """The held-out loss probes of a run (``History.evals``) against ``x``."""
    pts = [(_x(h, x, step, when), loss) for step, when, loss in sorted(h.evals)]
    pts = [p for p in pts if p[0] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def training_curve(h: History, x: str = "updates", smooth: int | None = None) -> tuple[list, list]:
    """The training loss of every update against ``x``: raw, or a moving mean of ``smooth`` updates."""
    gs = sorted(h.snapshot()[1], key=lambda g: g.step)
    losses = [g.loss for g in gs]
    if smooth and smooth > 1:
        losses = _smooth(losses, smooth)
    pts = [(_x(h, x, g.step, g.time), loss) for g, loss in zip(gs, losses)]
    pts = [p for p in pts if p[0] is not None]
    return [p[0] for p in pts], [p[1] for p in pts]


def convergence_figure(
    histories: Sequence[History],
    title: str = "sync vs async",
    axes: Sequence[str] = ("updates", "examples", "seconds"),
    smooth: int | None = None,
):
    """Held-out loss (the same examples for every mode) against updates, examples seen and
    seconds after warm-up, one panel each; below, each update's training loss (raw unless
    ``smooth``). A run without held-out probes shows its training loss, labelled so."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(4 * len(axes), 6.2), dpi=100)
    grid = fig.subplots(2, len(axes), squeeze=False)
    for col, x in enumerate(axes):
        top, bottom = grid[0][col], grid[1][col]
        for i, h in enumerate(histories):
            color = COLORS.get(h.mode, f"C{i}")
            if h.evals:
                top.plot(*held_out_curve(h, x), "o-", ms=3, color=color, label=h.run)
            else:
                top.plot(*training_curve(h, x), color=color, label=f"{h.run} (training loss)")
            label = f"{h.run}, moving mean of {smooth} updates" if smooth and smooth > 1 else h.run
            bottom.plot(*training_curve(h, x, smooth), color=color, lw=0.8, label=label)
        top.set_title(f"held-out loss by {x}")
        bottom.set_title(
            "training loss of each update" + (" (smoothed)" if smooth and smooth > 1 else " (raw)")
        )
        for ax, quantity in ((top, "held-out loss"), (bottom, "training loss")):
            ax.set_xlabel(X_AXES[x])
            log_y(ax, f"{quantity} (log scale)")
            ax.grid(alpha=0.3)
            ax.legend(fontsize=8)
    fig.suptitle(title)
    return _laid_out(fig, "the convergence figure")


def log_y(ax, label: str) -> None:
    """A log y axis whose ticks read as plain numbers (0.5, 2), not ``2x10^0``, labelled ``label``."""
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    ax.set_yscale("log")
    ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0), numticks=6))
    ax.yaxis.set_major_formatter(FormatStrFormatter("%g"))
    ax.yaxis.set_minor_formatter(NullFormatter())
    ax.set_ylabel(label)


def _laid_out(fig, what: str):
    """``fig`` after ``tight_layout`` on the canvas it is saved with, checked when lessons run strictly."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    from .figcheck import checked

    FigureCanvasAgg(fig)
    fig.tight_layout()
    return checked(fig, what)


def gantt_shares(history: History, steps: int = 10) -> dict[str, dict[str, float]]:
    """Each worker's share of the window of its last ``steps`` steps spent busy, waiting, dropped.

    The numbers behind :func:`gantt_figure` (and the dashboard's strip).
    """
    trace = GanttTrace(per_task=max(64, 8 * steps))
    for r in history.snapshot()[0]:
        trace.on_step(r)
    return trace.shares(*trace.window(steps))


def gantt_figure(history: History, steps: int = 10, title: str | None = None, ax=None):
    """Each worker's last ``steps`` steps: busy, waiting at sync's barrier, dropped.

    The picture of "the slowest worker paces sync": its bar is busy end to
    end while the others wait; in async nobody waits.
    """
    from matplotlib.figure import Figure
    from matplotlib.patches import Patch

    trace = GanttTrace(per_task=max(64, 8 * steps))
    for r in history.snapshot()[0]:
        trace.on_step(r)
    t0, t1, rows = trace.window(steps)
    fig = None
    if ax is None:
        fig = Figure(figsize=(9, 0.5 + 0.45 * max(len(rows), 1) + 0.6), dpi=100)
        ax = fig.subplots()
    tasks = sorted(rows)
    for y, task in enumerate(tasks):
        for kind in SEGMENT_KINDS:
            bars = [(a - t1, b - a) for k, a, b in rows[task] if k == kind]
            if bars:
                ax.broken_barh(
                    bars, (y - 0.35, 0.7), facecolors=SEGMENT_COLORS[kind], edgecolor="white", lw=0.6
                )
    ax.set_yticks(range(len(tasks)), tasks)
    ax.set_ylabel("task")
    ax.set_ylim(len(tasks) - 0.5, -0.5)
    ax.set_xlim(-(t1 - t0), 0)
    ax.set_xlabel("seconds before the run's last step")
    ax.legend(
        handles=[Patch(color=SEGMENT_COLORS[k], label=SEGMENT_LABELS[k]) for k in SEGMENT_KINDS],
        fontsize=8,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.35 if len(tasks) < 4 else -0.25),
        ncol=4,
        frameon=False,
    )
    ax.set_title(title or f"{history.run}: each worker's last {steps} steps")
    return fig if fig is None else _laid_out(fig, "the Gantt figure")


def staleness_figure(histories: History | Sequence[History]):
    """How stale the applied gradients were (async, SSP): the share of steps per staleness and the mean."""
    from matplotlib.figure import Figure

    if isinstance(histories, History):
        histories = [histories]
    fig = Figure(figsize=(6, 3.2), dpi=100)
    ax = fig.subplots()
    top = 0
    for i, h in enumerate(histories):
        counts = StalenessCounts()
        for r in h.snapshot()[0]:
            if r.applied and not r.warmup and not r.dropped:
                counts.add(r.staleness)
        frac = counts.fractions()
        if not frac:
            continue
        color = COLORS.get(h.mode, f"C{i}")
        top = max(top, max(frac))
        width = 0.8 / len(histories)
        ax.bar(
            [k - 0.4 + width * (i + 0.5) for k in frac],
            list(frac.values()),
            width=width,
            color=color,
            alpha=0.8,
            label=f"{h.run}: mean {counts.mean():.2f} ({len(h.workers)} workers)",
        )
        ax.axvline(counts.mean(), color=color, ls=":", lw=1.5)
    ax.set_xlim(-0.6, top + 0.6)
    ax.set_xlabel("staleness (updates by others between read and apply)")
    ax.set_ylabel("share of applied steps")
    ax.legend(fontsize=8)
    return _laid_out(fig, "the staleness figure")


def histogram_figure(series, title: str = "weights", most: int = 6):
    """A weight tensor's histograms over training, as TensorBoard's Histograms tab draws them.

    ``series`` is ``[(update, rows), ...]`` with TensorBoard's histogram rows
    (left edge, right edge, count), as ``tf.summary.histogram`` wrote them;
    at most ``most`` of them are drawn, evenly chosen, the latest darkest.
    """
    from matplotlib import colormaps
    from matplotlib.figure import Figure

    series = list(series)
    if len(series) > most:
        pick = [round(i * (len(series) - 1) / (most - 1)) for i in range(most)]
        series = [series[i] for i in dict.fromkeys(pick)]
    fig = Figure(figsize=(6, 3.2), dpi=100)
    ax = fig.subplots()
    shades = colormaps["Blues"]
    for i, (step, rows) in enumerate(series):
        centres = [(left + right) / 2 for left, right, _ in rows]
        counts = [count for _, _, count in rows]
        ax.plot(centres, counts, color=shades(0.35 + 0.65 * (i + 1) / len(series)), label=f"update {step}")
    ax.set_xlabel("weight value")
    ax.set_ylabel("weights per bin (count)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    return _laid_out(fig, "the histogram figure")


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (for ``IPython.display.Image`` or a widget)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def save_png(fig, path) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path)
    return str(path)
