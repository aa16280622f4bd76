"""Static pictures of training runs (matplotlib, Agg, no pyplot).

Used by ``tfmagic demo`` (a PNG) and as the fallback wherever no widget
front end is there to show the live dashboard.
"""

from __future__ import annotations

from collections.abc import Sequence

from .metrics import History

COLORS = {"sync": "#1f77b4", "async": "#d62728"}


def _smooth(values: list[float], window: int) -> list[float]:
    out, acc = [], 0.0
    for i, v in enumerate(values):
        acc += v
        if i >= window:
            acc -= values[i - window]
        out.append(acc / min(i + 1, window))
    return out


def convergence_figure(histories: Sequence[History], title: str = "sync vs async"):
    """Loss per global step and per second, one line per run."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(10, 3.6), dpi=100)
    by_step, by_time = fig.subplots(1, 2)
    for i, h in enumerate(histories):
        curve = h.loss_curve()
        if not curve:
            continue
        color = COLORS.get(h.mode, f"C{i}")
        window = max(1, len(curve) // 50)
        for ax, key in ((by_step, 0), (by_time, 1)):
            points = sorted(curve, key=lambda p, key=key: p[key])
            ax.plot(
                [p[key] for p in points], _smooth([p[2] for p in points], window), color=color, label=h.run
            )
    for ax, xlabel in ((by_step, "global step"), (by_time, "seconds")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel("training loss")
        ax.set_yscale("log")
        ax.grid(alpha=0.3)
        ax.legend()
    by_step.set_title("loss per update")
    by_time.set_title("loss over wall time")
    fig.suptitle(title)
    fig.tight_layout()
    return fig


def png_bytes(fig) -> bytes:
    """The figure as PNG bytes (for ``IPython.display.Image`` or a widget)."""
    import io

    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    buf = io.BytesIO()
    fig.savefig(buf, format="png")
    return buf.getvalue()


def staleness_figure(history: History):
    """How stale each worker's gradients were (async): a histogram per worker."""
    from matplotlib.figure import Figure

    fig = Figure(figsize=(5, 3), dpi=100)
    ax = fig.subplots()
    by = history.by_task()
    top = max((r.staleness for r in history.records), default=0)
    bins = range(0, top + 2)
    for i, (task, recs) in enumerate(sorted(by.items())):
        ax.hist([r.staleness for r in recs], bins=bins, alpha=0.6, label=task, color=f"C{i}", align="left")
    ax.set_xlabel("staleness (updates by others between read and apply)")
    ax.set_ylabel("worker steps")
    ax.legend()
    fig.tight_layout()
    return fig


def save_png(fig, path) -> str:
    from matplotlib.backends.backend_agg import FigureCanvasAgg

    FigureCanvasAgg(fig)
    fig.savefig(path)
    return str(path)
