"""Figures a student reads without help: no text clipped or over other text, every axis labelled.

A picture whose title is cut at the figure's edge ("... seconds after warm-"),
whose tick labels run into each other ("nobody slowednobody slowed") or whose
y axis has no label teaches less than its numbers could.  Which of these
happen depends on the data (a long run name, many workers, a log axis over
one decade), so a check once by eye does not keep them away.  :func:`problems`
draws a figure and measures every piece of text matplotlib actually drew;
:func:`require` turns problems into one error.  tfmagic's own figures go
through :func:`require` when lessons run strictly (``TFMAGIC_LESSON_STRICT``,
as the notebook tests do) and in the tests of each figure.
"""

from __future__ import annotations

import re
import threading

from .errors import LessonCheckFailed
from .lesson import strict

__all__ = ["problems", "require", "strict"]

#: pixels of overlap or overhang forgiven (anti-aliasing, rounding of extents)
SLACK = 1.5

_lock = threading.Lock()


def _drawn_texts(fig) -> list:
    """Every Text matplotlib draws for ``fig`` (animated ones too), each with its extent in pixels."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.text import Text

    if not isinstance(fig.canvas, FigureCanvasAgg):
        FigureCanvasAgg(fig)
    animated = [a for a in fig.findobj() if a.get_animated()]
    seen: list = []
    original = Text.draw

    def recording(self, renderer):
        if self.get_visible() and self.get_text().strip() and self.get_figure(root=True) is fig:
            seen.append(self)
        return original(self, renderer)

    with _lock:  # Text.draw is swapped for this one draw; another figure drawing meanwhile is ignored
        for a in animated:
            a.set_animated(False)
        Text.draw = recording
        try:
            fig.canvas.draw()
        finally:
            Text.draw = original
            for a in animated:
                a.set_animated(True)
        renderer = fig.canvas.get_renderer()
        return [(t, t.get_window_extent(renderer)) for t in dict.fromkeys(seen)]


_NUMBER = re.compile(r"[-+]?[\d.,]+(?:(?:x10)?\^-?\d+|e[-+]?\d+)?%?")


def _numeric(label: str) -> bool:
    """Whether a tick label is a number (``0.5``, ``−2``, ``$\\mathdefault{10^{-1}}$``), not a category
    (``worker:0``, ``nobody slowed``), which names itself and needs no axis label."""
    plain = label.replace("\\mathdefault", "").replace("\\times", "x").replace("−", "-")
    plain = re.sub(r"[\s${}]", "", plain)
    return bool(_NUMBER.fullmatch(plain))


def _show(text) -> str:
    """A text artist or a string, quoted and cut to 40 characters."""
    words = " ".join((text if isinstance(text, str) else text.get_text()).split())
    return repr(words if len(words) <= 40 else words[:37] + "...")


def problems(fig) -> list[str]:
    """What a reader would stumble on in ``fig``, one sentence each (empty: none).

    Text that reaches past the figure's edge (clipped in a saved picture),
    text drawn over other text, an axis with tick labels but no label, and
    log-axis ticks written as ``2x10^0`` where a plain number reads better.
    """
    texts = _drawn_texts(fig)
    width, height = fig.canvas.get_width_height()
    found: list[str] = []
    for text, box in texts:
        over = [
            side
            for side, amount in (
                ("left", -box.x0),
                ("right", box.x1 - width),
                ("bottom", -box.y0),
                ("top", box.y1 - height),
            )
            if amount > SLACK
        ]
        if over:
            found.append(f"{_show(text)} is cut at the figure's {' and '.join(over)} edge")
        if "times10^{" in text.get_text().replace(" ", "") and "10^{0}" in text.get_text():
            found.append(f"tick {_show(text)} is a power of ten to the 0: write the plain number")
    for i, (a, box_a) in enumerate(texts):
        for b, box_b in texts[i + 1 :]:
            dx = min(box_a.x1, box_b.x1) - max(box_a.x0, box_b.x0)
            dy = min(box_a.y1, box_b.y1) - max(box_a.y0, box_b.y0)
            if dx > SLACK and dy > SLACK:
                found.append(f"{_show(a)} and {_show(b)} are drawn over each other")
    drawn = {id(t) for t, _ in texts}
    for ax in fig.get_axes():
        if not ax.axison or not ax.get_visible():
            continue
        for name, axis in (("x", ax.xaxis), ("y", ax.yaxis)):
            numbers = any(id(t) in drawn and _numeric(t.get_text()) for t in axis.get_ticklabels())
            if numbers and not axis.get_label_text().strip():
                title = ax.get_title() or ax.get_title("left") or "an untitled plot"
                found.append(f"the {name} axis of {_show(title)} has numbers but no label")
    return found


def require(fig, what: str):
    """``fig`` unchanged if a reader can read it, else :class:`LessonCheckFailed` naming the first problems."""
    found = problems(fig)
    if found:
        more = f" (and {len(found) - 3} more)" if len(found) > 3 else ""
        raise LessonCheckFailed(f"{what}: " + "; ".join(found[:3]) + more)
    return fig


def checked(fig, what: str):
    """``fig``, checked by :func:`require` when lessons run strictly; as it is otherwise."""
    return require(fig, what) if strict() else fig
